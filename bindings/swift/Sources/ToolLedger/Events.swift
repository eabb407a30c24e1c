/// The ledger's status moves as an `AsyncStream` (from the value-free
/// observer hook).

extension Ledger {
    /// Every committed status move of this ledger from now until the stream
    /// ends: execution id, tool, statuses, attempt, elapsed time and, for
    /// failures and unknown outcomes, the reason's kind — never an argument,
    /// a result or a reason's text, so an event can go to any log.
    ///
    /// ```swift
    /// for await event in try ledger.events() where event.toStatus == .outcomeUnknown {
    ///     logger.warning("unknown: \(event.line, privacy: .public)")
    /// }
    /// ```
    ///
    /// The stream is its own observer beside the one `setObserver` names (a
    /// log adapter keeps logging), subscribed before this returns and
    /// removed when iteration ends (the task is cancelled, the loop breaks
    /// and the stream is released). Moves are yielded from the thread that
    /// made them; past `bufferingPolicy` (the newest 10 000 kept by
    /// default) a slow reader loses the oldest.
    ///
    /// - Throws: `LedgerError.Internal` for a poisoned lock.
    public func events(
        bufferingPolicy: AsyncStream<LedgerEvent>.Continuation.BufferingPolicy = .bufferingNewest(10_000)
    ) throws -> AsyncStream<LedgerEvent> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: LedgerEvent.self, bufferingPolicy: bufferingPolicy)
        let token = try addObserver(observer: StreamObserver(continuation))
        continuation.onTermination = { [self] _ in
            // A ledger already closed has nothing left to remove.
            try? self.removeObserver(token: token)
        }
        return stream
    }
}

extension AsyncLedger {
    /// The ledger's status moves as an `AsyncStream` (see `Ledger.events`).
    /// Subscribing takes a lock, never the disk: it runs on the caller.
    public func events(
        bufferingPolicy: AsyncStream<LedgerEvent>.Continuation.BufferingPolicy = .bufferingNewest(10_000)
    ) throws -> AsyncStream<LedgerEvent> {
        try ledger.events(bufferingPolicy: bufferingPolicy)
    }
}

/// Yields each event into one stream.
private final class StreamObserver: LedgerObserver {
    private let continuation: AsyncStream<LedgerEvent>.Continuation

    init(_ continuation: AsyncStream<LedgerEvent>.Continuation) {
        self.continuation = continuation
    }

    func onEvent(event: LedgerEvent) {
        continuation.yield(event)
    }
}
