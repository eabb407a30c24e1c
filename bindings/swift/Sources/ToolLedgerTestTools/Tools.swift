// Tools as an iOS app would write them against the generated `ToolHandler`
// protocol: final classes with only immutable (`let`) Sendable state, so
// Swift 6 checks their Sendable conformance (the protocol requires it: the
// library calls them from its own threads). Mutable counts live in actors.

import Foundation
import ToolLedger

/// A count that tools bump from whatever thread the library calls them on.
public actor Counter {
    public private(set) var value = 0

    public init() {}

    @discardableResult
    public func increment() -> Int {
        value += 1
        return value
    }
}

/// A side-effecting tool: `perform` sends an email through `Downstream`
/// under the request's downstream key; `lookup` finds it by that key.
public final class SendEmail: ToolHandler {
    public let downstream: Downstream
    /// How many times `perform` ran.
    public let calls = Counter()
    /// How many times `lookup` ran.
    public let lookups = Counter()
    private let name: String
    private let canLookup: Bool
    private let requiresApproval: Bool
    private let failure: (any Error)?
    private let failTimes: Int?
    private let landingWindowMs: UInt64?
    private let afterEffect: @Sendable () async -> Void

    /// - Parameters:
    ///   - name: the tool's name (`send_email`; a second instance under
    ///     another name plays a compensating tool).
    ///   - failure: thrown by `perform` instead of performing the effect: on
    ///     every call, or only on the first `failTimes` calls.
    ///   - landingWindowMs: the descriptor's landing window; nil keeps the
    ///     default (120000).
    ///   - afterEffect: awaited after the effect, before `perform` returns
    ///     (the crash child signals its parent and hangs here).
    public init(
        downstream: Downstream,
        name: String = "send_email",
        lookup: Bool = true,
        requiresApproval: Bool = false,
        failure: (any Error)? = nil,
        failTimes: Int? = nil,
        landingWindowMs: UInt64? = nil,
        afterEffect: @escaping @Sendable () async -> Void = {}
    ) {
        self.downstream = downstream
        self.name = name
        self.canLookup = lookup
        self.requiresApproval = requiresApproval
        self.failure = failure
        self.failTimes = failTimes
        self.landingWindowMs = landingWindowMs
        self.afterEffect = afterEffect
    }

    public func descriptor() throws -> ToolDescriptor {
        var descriptor = ToolDescriptor(
            name: name, version: 1, effect: .sideEffect, batch: .atomic,
            lookup: canLookup, requiresApproval: requiresApproval)
        if let landingWindowMs { descriptor.landingWindowMs = landingWindowMs }
        return descriptor
    }

    public func perform(request: ToolRequest) async throws -> PerformOutcome {
        let n = await calls.increment()
        await Task.yield()  // a real suspension point on the app's side
        if let failure, n <= (failTimes ?? Int.max) { throw failure }
        let id = try downstream.perform(key: request.downstreamKey)
        await afterEffect()
        return .committed(resultJson: sentJSON(id), externalId: id)
    }

    public func lookup(request: ToolRequest) async throws -> LookupOutcome {
        await lookups.increment()
        guard let id = try downstream.find(key: request.downstreamKey) else { return .notFound }
        return .found(resultJson: sentJSON(id), externalId: id)
    }

    public func approvalPreview(argumentsJson: String) throws -> String? {
        let args = try JSONSerialization.jsonObject(with: Data(argumentsJson.utf8)) as? [String: Any]
        return json(["to": args?["to"] as? String ?? "?"])
    }
}

/// A read-only tool: the ledger records nothing for it.
public final class Weather: ToolHandler {
    public let calls = Counter()

    public init() {}

    public func descriptor() throws -> ToolDescriptor {
        ToolDescriptor(name: "weather", version: 1, effect: .readOnly, batch: .atomic)
    }

    public func perform(request: ToolRequest) async throws -> PerformOutcome {
        await calls.increment()
        return .committed(resultJson: #"{"celsius":21}"#, externalId: nil)
    }

    public func lookup(request: ToolRequest) async throws -> LookupOutcome { .unsupported }

    public func approvalPreview(argumentsJson: String) throws -> String? { nil }
}

/// The model's call of `send_email`, as the app hands it to the executor.
public func emailCall(
    callId: String = "call_1", to: String = "a@example.com", body: String = "hi"
) -> ToolCall {
    ToolCall(
        provider: .custom, callId: callId, toolName: "send_email",
        arguments: json(["to": to, "body": body]))
}

/// `{"sent":true,"id":…}`: what `send_email` hands the model.
public func sentJSON(_ id: String) -> String {
    #"{"sent":true,"id":"# + json(id) + "}"
}

/// JSON text of a string or a string-to-string object, keys sorted.
public func json(_ value: Any) -> String {
    let data = try? JSONSerialization.data(
        withJSONObject: value, options: [.sortedKeys, .fragmentsAllowed, .withoutEscapingSlashes])
    return data.map { String(decoding: $0, as: UTF8.self) } ?? "null"
}

/// A count bumped from whatever thread calls it, without suspending.
public final class SyncCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0

    public init() {}

    public var value: Int { lock.withLock { count } }

    public func increment() { lock.withLock { count += 1 } }
}

/// `SendEmail` as a `SyncTool`: blocking code run on the caller's thread by
/// `ToolExecutor.executeNow`.
public final class SyncSend: SyncTool {
    public let downstream: Downstream
    /// How many times `performNow` ran.
    public let calls = SyncCounter()
    /// How many times `lookupNow` ran.
    public let lookups = SyncCounter()
    private let idempotencyKey: Bool
    private let canLookup: Bool

    public init(downstream: Downstream, idempotencyKey: Bool = false, lookup: Bool = true) {
        self.downstream = downstream
        self.idempotencyKey = idempotencyKey
        self.canLookup = lookup
    }

    public func descriptor() throws -> ToolDescriptor {
        ToolDescriptor(
            name: "send_email", version: 1, effect: .sideEffect, batch: .atomic,
            idempotencyKey: idempotencyKey, lookup: canLookup)
    }

    public func performNow(request: ToolRequest) throws -> PerformOutcome {
        calls.increment()
        let id = try downstream.perform(key: request.downstreamKey)
        return .committed(resultJson: json(["id": id, "sent": true]), externalId: id)
    }

    public func lookupNow(request: ToolRequest) throws -> LookupOutcome {
        lookups.increment()
        guard let id = try downstream.find(key: request.downstreamKey) else { return .notFound }
        return .found(resultJson: json(["id": id, "sent": true]), externalId: id)
    }
}
