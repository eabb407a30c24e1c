// The Swift bindings as an iOS app sees them: tools written in Swift, the
// executor's outcomes, the ledger's errors, suspension, concurrency.
// (Crash recovery across processes: CrashRecoveryTests.swift.)

import Foundation
import ToolLedger
import ToolLedgerTestTools
import XCTest

final class ToolLedgerTests: XCTestCase {
    private func fixture() throws -> (ledger: Ledger, path: String, downstream: Downstream) {
        let dir = try scratchDirectory()
        let path = "\(dir)/ledger.db"
        let ledger = try Ledger.open(path: path, config: LedgerConfig())
        return (ledger, path, try Downstream(directory: "\(dir)/downstream"))
    }

    // MARK: the happy path and replay

    func testExecuteRunsASwiftToolAndCommits() async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])

        let out = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))

        XCTAssertFalse(out.replayed)
        XCTAssertEqual(try object(out.resultJson), ["sent": true, "id": "msg_1"])
        XCTAssertEqual(out.externalId, "msg_1")
        XCTAssertEqual(out.executionId, "op_1:round_0:call_1:send_email:v1")
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)
        let record = try XCTUnwrap(try ledger.get(executionId: out.executionId))
        XCTAssertEqual(record.status, .committed)
        XCTAssertEqual(record.resultJson, out.resultJson)
        XCTAssertEqual(record.attemptCount, 1)
    }

    func testReplayReturnsTheStoredResultWithoutRunningTheTool() async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])

        let first = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        let again = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))

        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, first.resultJson)  // byte for byte
        XCTAssertEqual(again.externalId, first.externalId)
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)
        let metrics = executor.metrics()
        XCTAssertEqual(metrics.attempts, 1)
        XCTAssertEqual(metrics.replays, 1)
        XCTAssertEqual(metrics.preventedDuplicates, 1)
    }

    func testReplaySurvivesReopeningTheLedger() async throws {
        let (ledger, path, downstream) = try fixture()
        let first = try completed(
            await executor(ledger, [SendEmail(downstream: downstream)])
                .execute(operationId: "op_1", round: 0, call: emailCall()))

        let reopened = try Ledger.open(path: path, config: LedgerConfig())
        let tool = SendEmail(downstream: downstream)
        let again = try completed(
            await executor(reopened, [tool]).execute(operationId: "op_1", round: 0, call: emailCall()))

        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, first.resultJson)
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 0)
        XCTAssertEqual(try downstream.count(), 1)
    }

    func testChangedArgumentsUnderTheSameCallIdConflict() async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])

        _ = try await executor.execute(operationId: "op_1", round: 0, call: emailCall(to: "a@example.com"))
        let out = try await executor.execute(operationId: "op_1", round: 0, call: emailCall(to: "b@example.com"))

        guard case let .conflict(executionId, storedDigest, newDigest) = out else {
            return XCTFail("expected .conflict, got \(out)")
        }
        XCTAssertEqual(executionId, "op_1:round_0:call_1:send_email:v1")
        XCTAssertNotEqual(storedDigest, newDigest)
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)
    }

    func testReadOnlyToolsRunAndRecordNothing() async throws {
        let (ledger, _, _) = try fixture()
        let weather = Weather()
        let call = ToolCall(provider: .custom, callId: "w1", toolName: "weather", arguments: #"{"city":"Oslo"}"#)

        let out = try completed(await executor(ledger, [weather]).execute(operationId: "op_1", round: 0, call: call))

        XCTAssertEqual(out.resultJson, #"{"celsius":21}"#)
        let calls = await weather.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try ledger.list(operationId: "op_1"), [])
    }

    // MARK: approval

    func testApprovalBindsToTheDigest() async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream, requiresApproval: true)
        let executor = try executor(ledger, [tool])

        let waiting = try await executor.execute(operationId: "op_1", round: 0, call: emailCall(to: "bob@example.com"))
        guard case let .needsApproval(executionId, toolName, argsDigest, previewJson) = waiting else {
            return XCTFail("expected .needsApproval, got \(waiting)")
        }
        XCTAssertEqual(toolName, "send_email")
        XCTAssertEqual(try object(XCTUnwrap(previewJson)), ["to": "bob@example.com"])
        var calls = await tool.calls.value
        XCTAssertEqual(calls, 0)

        let wrong = String(repeating: "0", count: 64)
        let mismatch = await thrown { try await executor.approve(executionId: executionId, argsDigest: wrong, previewJson: nil) }
        guard case let .DigestMismatch(id, stored, given) = mismatch as? LedgerError else {
            return XCTFail("expected LedgerError.DigestMismatch, got \(String(describing: mismatch))")
        }
        XCTAssertEqual(id, executionId)
        XCTAssertEqual(stored, argsDigest)
        XCTAssertEqual(given, wrong)
        let malformed = await thrown { try await executor.approve(executionId: executionId, argsDigest: "not-a-digest", previewJson: nil) }
        guard case .InvalidInput = malformed as? LedgerError else {
            return XCTFail("expected LedgerError.InvalidInput, got \(String(describing: malformed))")
        }
        calls = await tool.calls.value
        XCTAssertEqual(calls, 0)
        XCTAssertEqual(try ledger.get(executionId: executionId)?.status, .prepared)

        let done = try completed(await executor.approve(executionId: executionId, argsDigest: argsDigest, previewJson: previewJson))
        XCTAssertFalse(done.replayed)
        calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)

        XCTAssertThrowsError(try ledger.approve(executionId: executionId, argsDigest: argsDigest, previewJson: nil)) { error in
            guard case let .InvalidTransition(_, fromStatus, transition) = error as? LedgerError else {
                return XCTFail("expected LedgerError.InvalidTransition, got \(error)")
            }
            XCTAssertEqual(fromStatus, .committed)
            XCTAssertEqual(transition, "approve")
        }
        // The executor's approve of the same call again (a double tap)
        // answers with its stored result; nothing runs again.
        let again = try completed(await executor.approve(executionId: executionId, argsDigest: argsDigest, previewJson: nil))
        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, done.resultJson)
        calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)
    }

    // MARK: errors thrown by Swift tools

    struct SocketClosed: Error, CustomStringConvertible {
        var description: String { "socket closed for bob@example.com" }
    }

    func testASwiftErrorThrownFromPerformIsAnUnknownOutcomeNotACrash() async throws {
        try await assertThrowingPerformIsUnknown(SocketClosed())
    }

    func testAToolCallErrorThrownFromPerformIsAnUnknownOutcome() async throws {
        try await assertThrowingPerformIsUnknown(ToolCallError.Transport(message: "connection reset"))
    }

    private func assertThrowingPerformIsUnknown(_ failure: any Error) async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream, lookup: false, failure: failure)
        let executor = try executor(ledger, [tool])

        let out = try unknown(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        let executionId = out.executionId

        XCTAssertFalse(out.reason.contains("bob@example.com"), out.reason)  // foreign text may hold user data
        // No lookup and no idempotency key: nothing settles it by waiting.
        XCTAssertEqual(out.attempt, 1)
        XCTAssertNil(out.retryAfterMs)
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try ledger.get(executionId: executionId)?.status, .outcomeUnknown)
        XCTAssertEqual(executor.metrics().outcomeUnknown, 1)

        // The app settles it; every later run replays what it settled.
        let settled = try completed(await executor.resolveUnknown(
            executionId: executionId, attempt: out.attempt,
            resolution: .found(resultJson: #"{"sent":true}"#, externalId: nil)))
        XCTAssertEqual(settled.resultJson, #"{"sent":true}"#)
        XCTAssertFalse(settled.partial)
        let again = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        XCTAssertTrue(again.replayed)
        let callsAfter = await tool.calls.value
        XCTAssertEqual(callsAfter, 1)
    }

    final class BrokenDescriptor: ToolHandler {
        func descriptor() throws -> ToolDescriptor { throw ToolCallError.Tool(message: "no descriptor") }
        func perform(request: ToolRequest) async throws -> PerformOutcome { .unknown(reason: "unused") }
        func lookup(request: ToolRequest) async throws -> LookupOutcome { .unsupported }
        func approvalPreview(argumentsJson: String) throws -> String? { nil }
    }

    func testADescriptorThatThrowsIsAnErrorNotACrash() throws {
        let (ledger, _, _) = try fixture()
        XCTAssertThrowsError(try ToolExecutor(ledger: ledger, config: ExecutorConfig()).register(tool: BrokenDescriptor())) { error in
            guard case .InvalidInput = error as? LedgerError else {
                return XCTFail("expected LedgerError.InvalidInput, got \(error)")
            }
        }
    }

    // MARK: bad input and bad storage

    func testBadJSONArgumentsAreInvalidInputAndNothingIsRecorded() async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])
        let bad = ToolCall(provider: .custom, callId: "c1", toolName: "send_email", arguments: "{not json")

        let error = await thrown { try await executor.execute(operationId: "op_1", round: 0, call: bad) }
        guard case let .InvalidInput(message) = error as? LedgerError else {
            return XCTFail("expected LedgerError.InvalidInput, got \(String(describing: error))")
        }
        XCTAssertFalse(message.contains("not json"), message)
        XCTAssertThrowsError(try ledger.begin(operationId: "op_1", round: 0, spec: CallSpec(call: bad, toolVersion: 1))) { error in
            guard case .InvalidInput = error as? LedgerError else {
                return XCTFail("expected LedgerError.InvalidInput, got \(error)")
            }
        }

        XCTAssertEqual(try ledger.list(operationId: "op_1"), [])
        XCTAssertEqual(try ledger.stats().operations, 0)
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 0)
        XCTAssertEqual(try downstream.count(), 0)
    }

    func testBadIdentifiersAreInvalidInput() async throws {
        let (ledger, _, downstream) = try fixture()
        let executor = try executor(ledger, [SendEmail(downstream: downstream)])

        let empty = await thrown { try await executor.execute(operationId: "", round: 0, call: emailCall()) }
        guard case .InvalidInput = empty as? LedgerError else {
            return XCTFail("expected LedgerError.InvalidInput, got \(String(describing: empty))")
        }
        for id in ["op_1:round_0:\u{0}:send_email:v1", ""] {
            XCTAssertThrowsError(try ledger.get(executionId: id)) { error in
                guard case .InvalidInput = error as? LedgerError else {
                    return XCTFail("expected LedgerError.InvalidInput, got \(error)")
                }
            }
        }
        XCTAssertThrowsError(try ledger.commit(ticket: madeUpTicket("op_1:round_0:nope:send_email:v1"), resultJson: "{}", externalId: nil)) { error in
            guard case let .NotFound(executionId) = error as? LedgerError else {
                return XCTFail("expected LedgerError.NotFound, got \(error)")
            }
            XCTAssertEqual(executionId, "op_1:round_0:nope:send_email:v1")
        }
        // A ticket's ids are validated on the way in like any other.
        XCTAssertThrowsError(try ledger.commit(ticket: madeUpTicket(""), resultJson: "{}", externalId: nil)) { error in
            guard case .InvalidInput = error as? LedgerError else {
                return XCTFail("expected LedgerError.InvalidInput, got \(error)")
            }
        }
        XCTAssertThrowsError(try ledger.owns(ticket: madeUpTicket("op_1:round_0:\u{0}:send_email:v1"))) { error in
            guard case .InvalidInput = error as? LedgerError else {
                return XCTFail("expected LedgerError.InvalidInput, got \(error)")
            }
        }
    }

    func testAnUnknownToolIsReportedAndNothingIsRecorded() async throws {
        let (ledger, _, _) = try fixture()
        let executor = ToolExecutor(ledger: ledger, config: ExecutorConfig())

        let error = await thrown { try await executor.execute(operationId: "op_1", round: 0, call: emailCall()) }
        guard case let .UnknownTool(name) = error as? LedgerError else {
            return XCTFail("expected LedgerError.UnknownTool, got \(String(describing: error))")
        }
        XCTAssertEqual(name, "send_email")
        XCTAssertEqual(try ledger.list(operationId: "op_1"), [])
    }

    func testAFileThatIsNotADatabaseIsAStorageErrorAndLeftUntouched() throws {
        let path = "\(try scratchDirectory())/notes.db"
        let content = Data(String(repeating: "these are my notes, not a database\n", count: 200).utf8)
        try content.write(to: URL(fileURLWithPath: path))

        XCTAssertThrowsError(try Ledger.open(path: path, config: LedgerConfig())) { error in
            guard case let .Storage(kind, _) = error as? LedgerError else {
                return XCTFail("expected LedgerError.Storage, got \(error)")
            }
            XCTAssertEqual(kind, .notADatabase)
        }
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: path)), content)
    }

    // MARK: suspension (the app goes to the background)

    func testSuspendedLedgerRefusesUntilResumed() async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])
        let first = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))

        // An app may suspend twice (the background task's expiry handler and
        // its normal path).
        try ledger.suspend()
        try ledger.suspend()
        XCTAssertThrowsError(try ledger.list(operationId: "op_1")) { error in
            XCTAssertEqual(error as? LedgerError, .Suspended)
        }
        let refused = await thrown { try await executor.execute(operationId: "op_1", round: 0, call: emailCall(callId: "call_2")) }
        XCTAssertEqual(refused as? LedgerError, .Suspended)

        let pending = try ledger.resume()
        XCTAssertFalse(pending.contains { $0.status == .outcomeUnknown })  // nothing was in flight
        XCTAssertEqual(try ledger.list(operationId: "op_1").map(\.status), [.committed])
        let again = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, first.resultJson)
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)
    }

    /// The first `.active` of a launch comes without a `.background` before
    /// it, so apps call `resume()` on a ledger that is not suspended; it must
    /// return (a no-op plus `recover()`), not block.
    func testResumeWithoutSuspendReturns() throws {
        let (ledger, _, _) = try fixture()
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            _ = try? ledger.resume()
            done.signal()
        }
        if done.wait(timeout: .now() + .seconds(5)) == .timedOut {
            // resume() once took the session lock again through a second
            // descriptor and blocked on its own flock (fixed in Sessions::acquire).
            XCTFail("resume() without suspend() did not return within 5 s")
            return
        }
        XCTAssertEqual(try ledger.list(operationId: "op_1"), [])
    }

    /// iOS may suspend the app while a tool call is in flight. The effect
    /// happened downstream but cannot be committed to a suspended ledger: the
    /// call throws `Suspended`, and nothing after `resume()` runs it again.
    /// (The executor keeps the tool's result that the suspended ledger could
    /// not write; `recover()` after `resume()` commits it, with no lookup and
    /// no resend. Apps should still let calls finish before suspending.)
    func testSuspendingWhileACallIsInFlightNeverRunsItTwice() async throws {
        let (ledger, _, downstream) = try fixture()
        let (started, release) = (Gate(), Gate())
        let tool = SendEmail(downstream: downstream) {
            await started.open()
            await release.wait()
        }
        let executor = try executor(ledger, [tool])
        let call = Task { try await executor.execute(operationId: "op_1", round: 0, call: emailCall()) }
        await started.wait()  // the effect is done downstream; perform has not returned

        try ledger.suspend()
        await release.open()
        let result = await call.result
        guard case .failure(let error) = result, error as? LedgerError == .Suspended else {
            return XCTFail("expected LedgerError.Suspended, got \(result)")
        }

        _ = try ledger.resume()
        let recovered = try await executor.recover()
        XCTAssertEqual(recovered.failed, [])
        // This session still owns the attempt (it is alive), but nobody drives
        // it any more: recover() commits the result the executor kept, instead
        // of answering `.inFlight` for as long as the app lives.
        XCTAssertEqual(recovered.outcomes.count, 1)
        let reconciled = try completed(XCTUnwrap(recovered.outcomes.first))
        XCTAssertTrue(reconciled.replayed)
        XCTAssertEqual(reconciled.externalId, "msg_1")
        let lookups = await tool.lookups.value
        XCTAssertEqual(lookups, 0, "the kept result needs no lookup")
        let again = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        XCTAssertTrue(again.replayed)
        XCTAssertEqual(again.resultJson, reconciled.resultJson)
        let calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)
    }

    // MARK: concurrency

    func testTasksRacingTheSameCallRunTheToolOnce() async throws {
        let (ledger, _, downstream) = try fixture()
        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])

        let outcomes = try await withThrowingTaskGroup(of: CallOutcome.self) { group in
            for _ in 0..<8 {
                group.addTask { try await executor.execute(operationId: "op_1", round: 0, call: emailCall()) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }

        let calls = await tool.calls.value
        XCTAssertEqual(calls, 1)
        XCTAssertEqual(try downstream.count(), 1)
        var fresh = 0
        for outcome in outcomes {
            switch outcome {
            case let .completed(_, resultJson, _, replayed, _):
                XCTAssertEqual(try object(resultJson), ["sent": true, "id": "msg_1"])
                if !replayed { fresh += 1 }
            case .inFlight:
                break  // another task held the call: it did not run twice
            default:
                XCTFail("unexpected outcome \(outcome)")
            }
        }
        XCTAssertEqual(fresh, 1, "exactly one task ran the tool")
        let after = try completed(await executor.execute(operationId: "op_1", round: 0, call: emailCall()))
        XCTAssertTrue(after.replayed)
        let callsAfter = await tool.calls.value
        XCTAssertEqual(callsAfter, 1)
        XCTAssertEqual(try downstream.count(), 1)
    }

    // MARK: the step API without the executor

    func testLedgerStepsBeginCommitReplayDeliver() throws {
        let (ledger, _, _) = try fixture()
        let spec = CallSpec(call: emailCall(), toolVersion: 1)

        guard case let .execute(ticket) = try ledger.begin(operationId: "op_1", round: 0, spec: spec) else {
            return XCTFail("expected .execute")
        }
        XCTAssertEqual(ticket.attempt, 1)
        XCTAssertTrue(ticket.downstreamKey.hasPrefix("tl_"), ticket.downstreamKey)

        XCTAssertEqual(ticket.argsJson, emailCall().arguments)  // as the model sent them
        XCTAssertTrue(try ledger.owns(ticket: ticket))

        let stored = try ledger.commit(ticket: ticket, resultJson: #"{"sent":true}"#, externalId: "msg_9")
        XCTAssertEqual(stored.resultJson, #"{"sent":true}"#)
        XCTAssertFalse(stored.partial)
        XCTAssertFalse(try ledger.owns(ticket: ticket), "committed: no longer running")
        XCTAssertThrowsError(try ledger.commit(ticket: ticket, resultJson: #"{"sent":false}"#, externalId: nil)) { error in
            guard case .AlreadyCommitted = error as? LedgerError else {
                return XCTFail("expected LedgerError.AlreadyCommitted, got \(error)")
            }
        }

        guard case let .replay(result) = try ledger.begin(operationId: "op_1", round: 0, spec: spec) else {
            return XCTFail("expected .replay")
        }
        XCTAssertEqual(result.resultJson, #"{"sent":true}"#)
        try ledger.markDelivered(executionIds: [ticket.executionId])
        XCTAssertEqual(try ledger.get(executionId: ticket.executionId)?.status, .resultDelivered)
        let steps = try ledger.transitions(executionId: ticket.executionId).map(\.transition)
        // The refused other result is kept as evidence, with a note in the log.
        XCTAssertEqual(Array(steps.suffix(3)), ["commit", "found_after_settled", "deliver"])
    }

    // MARK: provider formats

    func testOpenAIParseExecuteRenderRoundTrip() async throws {
        let (ledger, _, downstream) = try fixture()
        let response = #"""
            {"id":"chatcmpl-1","choices":[{"index":0,"finish_reason":"tool_calls","message":{
              "role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function",
              "function":{"name":"send_email","arguments":"{\"to\":\"a@example.com\",\"body\":\"hi\"}"}}]}}]}
            """#
        let calls = try parseToolCalls(provider: .openAiChat, responseJson: response, round: 0)
        XCTAssertEqual(calls.map(\.callId), ["call_abc"])
        XCTAssertEqual(calls.map(\.toolName), ["send_email"])
        XCTAssertEqual(try object(calls[0].arguments), ["to": "a@example.com", "body": "hi"])

        let tool = SendEmail(downstream: downstream)
        let executor = try executor(ledger, [tool])
        let outs = try await executor.executeRound(operationId: "op_1", round: 0, calls: calls)
        let out = try completed(XCTUnwrap(outs.first))
        let message = try object(renderToolResult(call: calls[0], outputJson: out.resultJson, isError: false))
        XCTAssertEqual(message["role"] as? String, "tool")
        XCTAssertEqual(message["tool_call_id"] as? String, "call_abc")

        let replays = try await executor.executeRound(operationId: "op_1", round: 0, calls: calls)
        let replayed = try completed(XCTUnwrap(replays.first))
        XCTAssertTrue(replayed.replayed)
        XCTAssertEqual(
            try renderToolResult(call: calls[0], outputJson: replayed.resultJson, isError: false),
            try renderToolResult(call: calls[0], outputJson: out.resultJson, isError: false))
        let n = await tool.calls.value
        XCTAssertEqual(n, 1)
    }

    func testMalformedProviderResponsesAreInvalidInput() throws {
        XCTAssertThrowsError(try parseToolCalls(provider: .anthropic, responseJson: "{not json", round: 0)) { error in
            guard case .InvalidInput = error as? LedgerError else {
                return XCTFail("expected LedgerError.InvalidInput, got \(error)")
            }
        }
        XCTAssertThrowsError(try renderAnthropicUserMessage(results: [])) { error in
            guard case .InvalidInput = error as? LedgerError else {
                return XCTFail("expected LedgerError.InvalidInput, got \(error)")
            }
        }
    }
}
