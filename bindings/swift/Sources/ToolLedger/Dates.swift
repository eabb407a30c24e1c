import Foundation

// The library's times are integer milliseconds (wall clock since the Unix
// epoch for timestamps, durations for waits). These give them as `Date` and
// `TimeInterval` (seconds).

private func date(_ ms: Int64) -> Date { Date(timeIntervalSince1970: TimeInterval(ms) / 1000) }
private func seconds(_ ms: UInt64?) -> TimeInterval? { ms.map { TimeInterval($0) / 1000 } }

extension Execution {
    /// When the execution was recorded.
    public var createdAt: Date { date(createdMs) }
    /// When it last changed.
    public var updatedAt: Date { date(updatedMs) }
}

extension TransitionEntry {
    /// When the transition happened.
    public var at: Date { date(atMs) }
}

extension CallOutcome {
    /// For `.unknown` and `.inFlight`: how long to wait before asking
    /// again, in seconds, when waiting can settle it; nil otherwise.
    public var retryAfter: TimeInterval? {
        switch self {
        case let .unknown(_, _, _, retryAfterMs): return seconds(retryAfterMs)
        case let .inFlight(_, retryAfterMs): return seconds(retryAfterMs)
        default: return nil
        }
    }
}

extension ToolDescriptor {
    /// The landing window in seconds.
    public var landingWindow: TimeInterval { TimeInterval(landingWindowMs) / 1000 }
}
