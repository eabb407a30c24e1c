//! Caller-driven steps through one plain C call each, for a layer that
//! writes and reads UniFFI's own serialized form itself (Kotlin's `ktx`
//! layer: `SyncTool` calls).
//!
//! The generated bindings pass every argument and answer of the
//! caller-driven methods (`driven`) as a `RustBuffer` *structure by value*,
//! allocated by a separate call into the library per argument, plus a
//! `RustCallStatus` structure and a clone of the object handle: for JNA
//! that is five to seven native calls and several reflective `Structure`s
//! per step. [`toolledger_direct_step`] takes the same values, serialized
//! exactly as the generated code serializes them (UniFFI's `Lift::try_read`
//! / `Lower::write` with this crate's tag, so the two can never disagree),
//! in one buffer that the *caller* owns, and writes the answer back into
//! that buffer: integer arguments only, no structure, no allocation on
//! either side of a call whose answer fits.
//!
//! The buffer: bytes `[0, 8)` are a native-endian `u64` the library sets to
//! the answer's length; the request is at `[HEADER, HEADER + input_len)`,
//! the answer is written at `[HEADER, …)` when it fits in the buffer's
//! capacity. When it does not (a result larger than the buffer), the
//! library keeps it for this thread and answers [`NEEDS_SPACE`] with the
//! length in the header; the caller makes a buffer large enough and calls
//! [`toolledger_direct_take`] on the same thread. Nothing runs twice.
//!
//! [`STEP_START_NOW`] is `start_now`: `start`'s request, answered at once
//! (a replay) or [`WOULD_BLOCK`] (nothing ran): the suspending layers try it
//! on the caller's thread before they hop to a thread that may wait.
//!
//! [`toolledger_direct_step_borrowed`] is the same step with the object's
//! own handle borrowed, not a clone consumed (Python's layer: no clone
//! call per step), and [`STEP_REPORT_ATTEMPT`] reports a side-effecting
//! attempt by its fencing token (`report_attempt`).
//!
//! The rules are `driven`'s, by calling its methods: this file only moves
//! bytes. Nothing panics across the boundary (a panic becomes [`PANIC`]).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use toolledger_core::model::{ExecutionId, OperationId};
use uniffi::{HandleAlloc, Lift, Lower};

use super::driven::{CallerAttempt, CallerStep};
use super::error::LedgerError;
use super::executor::ToolExecutor;
use super::records::ToolCall;
use super::tool::{LookupOutcome, PerformOutcome};
use crate::UniFfiTag;

/// Bytes before the request and the answer in the caller's buffer.
pub const HEADER: usize = 8;

/// Answered: a serialized `CallerStep` at `HEADER`.
pub const OK: i32 = 0;
/// Failed: a serialized `LedgerError` at `HEADER`.
pub const ERROR: i32 = 1;
/// A bug (a panic, a request that does not parse): a UTF-8 message at `HEADER`.
pub const PANIC: i32 = 2;
/// The answer is longer than the buffer: take it with [`toolledger_direct_take`].
pub const NEEDS_SPACE: i32 = 3;
/// The C call's own arguments are wrong (a null or short buffer, no
/// answer kept to take); nothing ran and the header is not set.
pub const BAD_CALL: i32 = 4;
/// [`STEP_START_NOW`] could not answer without waiting (or has no answer
/// that needs no write): nothing ran; make the call with [`STEP_START`]
/// where waiting is allowed. The header is set to 0.
pub const WOULD_BLOCK: i32 = 5;

/// `start(operation_id, round, call)`.
pub const STEP_START: i32 = 1;
/// `report(attempt, outcome)`.
pub const STEP_REPORT: i32 = 2;
/// `report_lookup(attempt, found)`.
pub const STEP_REPORT_LOOKUP: i32 = 3;
/// `report_lookup_error(attempt, message)`.
pub const STEP_REPORT_LOOKUP_ERROR: i32 = 4;
/// `retry(attempt)`.
pub const STEP_RETRY: i32 = 5;
/// `report_attempt(execution_id, attempt, outcome)`.
pub const STEP_REPORT_ATTEMPT: i32 = 6;
/// `start_now(operation_id, round, call)`: `start`'s request; [`OK`] with
/// the step when it answers at once (a replay), else [`WOULD_BLOCK`].
pub const STEP_START_NOW: i32 = 7;

thread_local! {
    /// An answer that did not fit, kept for this thread's next take.
    static PENDING: RefCell<Option<(i32, Vec<u8>)>> = const { RefCell::new(None) };
}

/// Runs one caller-driven step of the `ToolExecutor` behind `handle`.
///
/// `handle` is an owned handle (what the generated `uniffiCloneHandle()`
/// returns; consumed here). `buf` points at `capacity` bytes the caller
/// owns, the request serialized at `HEADER` (`input_len` bytes). Returns
/// [`OK`], [`ERROR`], [`PANIC`], [`NEEDS_SPACE`] or (for [`STEP_START_NOW`])
/// [`WOULD_BLOCK`] and sets the header, or [`BAD_CALL`].
///
/// `buf` is an address as a `u64` (the same signature on 32- and 64-bit
/// targets).
///
/// # Safety
/// `handle` must be an owned `ToolExecutor` handle of this library;
/// `buf` must be valid for reads and writes of `capacity` bytes,
/// `capacity >= HEADER + input_len`, and not be used by anything else for
/// the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn toolledger_direct_step(
    handle: u64,
    step: i32,
    buf: u64,
    capacity: u64,
    input_len: u64,
) -> i32 {
    // The handle is consumed first, whatever happens next.
    let Ok(executor) = <Arc<ToolExecutor> as Lift<UniFfiTag>>::try_lift(
        uniffi::Handle::from_raw_unchecked(handle),
    ) else {
        return BAD_CALL;
    };
    // SAFETY: the caller's guarantees are this function's.
    unsafe { step_in(&executor, step, buf, capacity, input_len) }
}

/// [`toolledger_direct_step`] with a *borrowed* handle: the object's own
/// handle (the generated object's `_handle`), not consumed, so the caller
/// makes no clone call first (Python's layer: one crossing per step).
///
/// # Safety
/// As [`toolledger_direct_step`], except that `handle` is a live
/// `ToolExecutor` handle of this library that the caller keeps alive
/// (holds the object) for the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn toolledger_direct_step_borrowed(
    handle: u64,
    step: i32,
    buf: u64,
    capacity: u64,
    input_len: u64,
) -> i32 {
    if handle == 0 {
        return BAD_CALL;
    }
    // SAFETY: the caller keeps the handle alive during the call; `get_arc`
    // takes a reference of its own and leaves the handle's.
    let executor = unsafe {
        <ToolExecutor as HandleAlloc<UniFfiTag>>::get_arc(uniffi::Handle::from_raw_unchecked(
            handle,
        ))
    };
    // SAFETY: the caller's guarantees are this function's.
    unsafe { step_in(&executor, step, buf, capacity, input_len) }
}

/// The step of both entry points, once the executor is in hand.
///
/// # Safety
/// `buf` valid for reads and writes of `capacity` bytes, as above.
unsafe fn step_in(
    executor: &ToolExecutor,
    step: i32,
    buf: u64,
    capacity: u64,
    input_len: u64,
) -> i32 {
    let buf = buf as usize as *mut u8;
    let (Ok(capacity), Ok(input_len)) = (usize::try_from(capacity), usize::try_from(input_len))
    else {
        return BAD_CALL;
    };
    if buf.is_null() || capacity < HEADER || input_len > capacity - HEADER {
        return BAD_CALL;
    }
    // SAFETY: the caller guarantees `buf` holds `capacity` bytes.
    let memory = unsafe { std::slice::from_raw_parts_mut(buf, capacity) };
    let request = &memory[HEADER..HEADER + input_len];
    let (code, bytes) = match catch_unwind(AssertUnwindSafe(|| run(executor, step, request))) {
        Ok(Ok(Ok(Some(next)))) => (OK, lowered(next)),
        Ok(Ok(Ok(None))) => (WOULD_BLOCK, Vec::new()),
        Ok(Ok(Err(error))) => (ERROR, lowered(error)),
        Ok(Err(bug)) => (PANIC, bug.into_bytes()),
        Err(_) => (PANIC, b"toolledger: a caller-driven step panicked".to_vec()),
    };
    answer(memory, code, bytes)
}

/// Moves the answer kept by the last [`NEEDS_SPACE`] of this thread into
/// `buf` (at `HEADER`, its length in the header) and returns its code, or
/// [`BAD_CALL`] when there is none or it does not fit (then it is kept).
///
/// # Safety
/// As [`toolledger_direct_step`]: `buf` valid for `capacity` bytes.
#[no_mangle]
pub unsafe extern "C" fn toolledger_direct_take(buf: u64, capacity: u64) -> i32 {
    let buf = buf as usize as *mut u8;
    let Ok(capacity) = usize::try_from(capacity) else {
        return BAD_CALL;
    };
    if buf.is_null() || capacity < HEADER {
        return BAD_CALL;
    }
    // SAFETY: the caller guarantees `buf` holds `capacity` bytes.
    let memory = unsafe { std::slice::from_raw_parts_mut(buf, capacity) };
    let Some((code, bytes)) = PENDING.with(|p| p.borrow_mut().take()) else {
        return BAD_CALL;
    };
    if bytes.len() > capacity - HEADER {
        PENDING.with(|p| *p.borrow_mut() = Some((code, bytes)));
        return BAD_CALL;
    }
    write_answer(memory, &bytes);
    code
}

/// One step: the request parsed with the generated code's converters, the
/// `driven` method called. `Err(String)` is a request that does not parse.
/// `Ok(None)`: [`STEP_START_NOW`] would block.
fn run(
    executor: &ToolExecutor,
    step: i32,
    mut request: &[u8],
) -> Result<Result<Option<CallerStep>, LedgerError>, String> {
    let r = &mut request;
    let answer = match step {
        STEP_START | STEP_START_NOW => {
            let operation_id = match read_id::<OperationId>(r) {
                Ok(id) => id,
                Err(e) => return Ok(Err(e)),
            };
            let round = read::<u32>(r)?;
            let call = read::<ToolCall>(r)?;
            done(r)?;
            if step == STEP_START_NOW {
                return Ok(executor.start_now(operation_id, round, call));
            }
            executor.start(operation_id, round, call)
        }
        STEP_REPORT => {
            let attempt = read::<CallerAttempt>(r)?;
            let outcome = read::<PerformOutcome>(r)?;
            done(r)?;
            executor.report(attempt, outcome)
        }
        STEP_REPORT_LOOKUP => {
            let attempt = read::<CallerAttempt>(r)?;
            let found = read::<LookupOutcome>(r)?;
            done(r)?;
            executor.report_lookup(attempt, found)
        }
        STEP_REPORT_LOOKUP_ERROR => {
            let attempt = read::<CallerAttempt>(r)?;
            let message = read::<String>(r)?;
            done(r)?;
            executor.report_lookup_error(attempt, message)
        }
        STEP_RETRY => {
            let attempt = read::<CallerAttempt>(r)?;
            done(r)?;
            executor.retry(attempt)
        }
        STEP_REPORT_ATTEMPT => {
            let execution_id = match read_id::<ExecutionId>(r) {
                Ok(id) => id,
                Err(e) => return Ok(Err(e)),
            };
            let attempt = read::<u32>(r)?;
            let outcome = read::<PerformOutcome>(r)?;
            done(r)?;
            executor.report_attempt(execution_id, attempt, outcome)
        }
        other => return Err(format!("toolledger_direct_step: unknown step {other}")),
    };
    Ok(answer.map(Some))
}

/// An id read with its validating converter; one it refuses is the
/// `LedgerError` that converter carries (as the generated method gives it).
fn read_id<T: Lift<UniFfiTag>>(r: &mut &[u8]) -> Result<T, LedgerError> {
    T::try_read(r).map_err(invalid)
}

fn read<T: Lift<UniFfiTag>>(r: &mut &[u8]) -> Result<T, String> {
    T::try_read(r).map_err(|e| format!("toolledger_direct_step: malformed request: {e}"))
}

fn done(r: &[u8]) -> Result<(), String> {
    if r.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "toolledger_direct_step: {} bytes left after the request",
            r.len()
        ))
    }
}

/// The `LedgerError` an id converter's refusal carries (as UniFFI's own
/// lifting recovers it), else an `InvalidInput`.
fn invalid(e: uniffi::deps::anyhow::Error) -> LedgerError {
    e.downcast::<LedgerError>()
        .unwrap_or_else(|e| LedgerError::InvalidInput {
            message: e.to_string(),
        })
}

fn lowered<T: Lower<UniFfiTag>>(value: T) -> Vec<u8> {
    let mut bytes = Vec::new();
    T::write(value, &mut bytes);
    bytes
}

/// Writes the answer into the caller's buffer, or keeps it for
/// [`toolledger_direct_take`] when it does not fit.
fn answer(memory: &mut [u8], code: i32, bytes: Vec<u8>) -> i32 {
    if bytes.len() > memory.len() - HEADER {
        memory[..HEADER].copy_from_slice(&(bytes.len() as u64).to_ne_bytes());
        PENDING.with(|p| *p.borrow_mut() = Some((code, bytes)));
        return NEEDS_SPACE;
    }
    write_answer(memory, &bytes);
    code
}

fn write_answer(memory: &mut [u8], bytes: &[u8]) {
    memory[..HEADER].copy_from_slice(&(bytes.len() as u64).to_ne_bytes());
    memory[HEADER..HEADER + bytes.len()].copy_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use crate::outcome::ExecutorConfig;
    use crate::records::{LedgerConfig, Provider};

    fn executor(dir: &tempfile::TempDir) -> Arc<ToolExecutor> {
        let path = dir.path().join("l.db").to_string_lossy().into_owned();
        let config = LedgerConfig::for_tests();
        let ledger = Ledger::open(path, config, None).unwrap();
        let config = ExecutorConfig {
            max_attempts: 3,
            read_only_max_attempts: 3,
            perform_timeout_ms: Some(30_000),
            backoff_base_ms: 200,
            backoff_max_ms: 5_000,
            max_parallel: 4,
        };
        ToolExecutor::new(ledger, config)
    }

    /// An owned handle, as the generated `uniffiCloneHandle()` gives one.
    fn handle(executor: &Arc<ToolExecutor>) -> u64 {
        <Arc<ToolExecutor> as Lower<UniFfiTag>>::lower(executor.clone()).as_raw()
    }

    fn start_request(op: &str, tool: &str) -> Vec<u8> {
        let mut bytes = Vec::new();
        <String as Lower<UniFfiTag>>::write(op.to_owned(), &mut bytes);
        <u32 as Lower<UniFfiTag>>::write(0, &mut bytes);
        let call = ToolCall {
            provider: Provider::Custom,
            call_id: "call_1".into(),
            tool_name: tool.into(),
            arguments: "{}".into(),
            position: 0,
            call_id_derived: false,
        };
        <ToolCall as Lower<UniFfiTag>>::write(call, &mut bytes);
        bytes
    }

    /// Runs one step in a buffer of `capacity` bytes: (code, answer bytes).
    fn step(
        executor: &Arc<ToolExecutor>,
        step: i32,
        request: &[u8],
        capacity: usize,
    ) -> (i32, Vec<u8>) {
        let mut buf = vec![0u8; capacity.max(HEADER + request.len())];
        buf[HEADER..HEADER + request.len()].copy_from_slice(request);
        let code = unsafe {
            toolledger_direct_step(
                handle(executor),
                step,
                buf.as_mut_ptr() as u64,
                capacity as u64,
                request.len() as u64,
            )
        };
        let len = u64::from_ne_bytes(buf[..HEADER].try_into().unwrap()) as usize;
        let answer = if code == NEEDS_SPACE {
            Vec::new()
        } else {
            buf[HEADER..HEADER + len].to_vec()
        };
        (code, answer)
    }

    #[test]
    fn errors_and_bugs_come_back_as_codes_and_every_handle_is_consumed() {
        let dir = tempfile::tempdir().unwrap();
        let executor = executor(&dir);

        // A typed error: exactly the bytes UniFFI lowers the same error to.
        let (code, answer) = step(
            &executor,
            STEP_START,
            &start_request("op_1", "nobody"),
            4096,
        );
        assert_eq!(code, ERROR);
        let expected = lowered(LedgerError::UnknownTool {
            name: "nobody".into(),
        });
        assert_eq!(answer, expected);

        // An operation id the id converter refuses: its own InvalidInput.
        let (code, answer) = step(&executor, STEP_START, &start_request("", "nobody"), 4096);
        assert_eq!(code, ERROR);
        let mut read = answer.as_slice();
        let error = <LedgerError as Lift<UniFfiTag>>::try_read(&mut read).unwrap();
        assert!(
            matches!(error, LedgerError::InvalidInput { .. }),
            "{error:?}"
        );

        // A request that does not parse, bytes left over, an unknown step: a message, no panic.
        let mut request = start_request("op_1", "nobody");
        request.truncate(request.len() - 3);
        let (code, message) = step(&executor, STEP_START, &request, 4096);
        assert_eq!(code, PANIC);
        assert!(String::from_utf8(message)
            .unwrap()
            .contains("malformed request"));
        let mut request = start_request("op_1", "nobody");
        request.push(0);
        let (code, message) = step(&executor, STEP_START, &request, 4096);
        assert_eq!(code, PANIC);
        assert!(String::from_utf8(message).unwrap().contains("1 bytes left"));
        let (code, message) = step(&executor, 99, &[], 64);
        assert_eq!(code, PANIC);
        assert!(String::from_utf8(message)
            .unwrap()
            .contains("unknown step 99"));

        // The C call's own arguments wrong: nothing runs.
        let code = unsafe { toolledger_direct_step(handle(&executor), STEP_START, 0, 64, 0) };
        assert_eq!(code, BAD_CALL);
        let mut small = [0u8; 16];
        let code = unsafe {
            toolledger_direct_step(
                handle(&executor),
                STEP_START,
                small.as_mut_ptr() as u64,
                16,
                9,
            )
        };
        assert_eq!(code, BAD_CALL);
        // Nothing kept to take.
        let code = unsafe { toolledger_direct_take(small.as_mut_ptr() as u64, 16) };
        assert_eq!(code, BAD_CALL);

        // Every handle given was consumed, whatever the outcome.
        assert_eq!(Arc::strong_count(&executor), 1);
    }

    #[test]
    fn a_borrowed_handle_is_not_consumed_and_a_token_report_parses_its_request() {
        let dir = tempfile::tempdir().unwrap();
        let executor = executor(&dir);
        let borrowed = handle(&executor);
        assert_eq!(Arc::strong_count(&executor), 2);

        let run = |step: i32, request: &[u8]| {
            let mut buf = vec![0u8; HEADER + 4096];
            buf[HEADER..HEADER + request.len()].copy_from_slice(request);
            let code = unsafe {
                toolledger_direct_step_borrowed(
                    borrowed,
                    step,
                    buf.as_mut_ptr() as u64,
                    buf.len() as u64,
                    request.len() as u64,
                )
            };
            let len = u64::from_ne_bytes(buf[..HEADER].try_into().unwrap()) as usize;
            (code, buf[HEADER..HEADER + len].to_vec())
        };

        // The same typed error as through the owned handle.
        let (code, answer) = run(STEP_START, &start_request("op_1", "nobody"));
        assert_eq!(code, ERROR);
        assert_eq!(
            answer,
            lowered(LedgerError::UnknownTool {
                name: "nobody".into()
            })
        );

        // A token report: an id the converter refuses is its InvalidInput;
        // a well-formed id of no execution is NotFound.
        let token = |id: &str| {
            let mut bytes = Vec::new();
            <String as Lower<UniFfiTag>>::write(id.to_owned(), &mut bytes);
            <u32 as Lower<UniFfiTag>>::write(1, &mut bytes);
            <PerformOutcome as Lower<UniFfiTag>>::write(
                PerformOutcome::Committed {
                    result_json: "1".into(),
                    external_id: None,
                },
                &mut bytes,
            );
            bytes
        };
        let (code, answer) = run(STEP_REPORT_ATTEMPT, &token(""));
        assert_eq!(code, ERROR);
        let error = <LedgerError as Lift<UniFfiTag>>::try_read(&mut answer.as_slice()).unwrap();
        assert!(
            matches!(error, LedgerError::InvalidInput { .. }),
            "{error:?}"
        );
        let (code, answer) = run(STEP_REPORT_ATTEMPT, &token("ex_0123456789abcdef"));
        assert_eq!(code, ERROR);
        let error = <LedgerError as Lift<UniFfiTag>>::try_read(&mut answer.as_slice()).unwrap();
        assert!(matches!(error, LedgerError::NotFound { .. }), "{error:?}");
        let mut short = token("ex_0123456789abcdef");
        short.truncate(short.len() - 1);
        let (code, message) = run(STEP_REPORT_ATTEMPT, &short);
        assert_eq!(code, PANIC);
        assert!(String::from_utf8(message)
            .unwrap()
            .contains("malformed request"));

        // A null handle: nothing runs.
        let mut small = [0u8; 64];
        let code = unsafe {
            toolledger_direct_step_borrowed(0, STEP_START, small.as_mut_ptr() as u64, 64, 0)
        };
        assert_eq!(code, BAD_CALL);

        // Borrowed every time: the handle is still the caller's.
        assert_eq!(Arc::strong_count(&executor), 2);
        drop(
            <Arc<ToolExecutor> as Lift<UniFfiTag>>::try_lift(uniffi::Handle::from_raw_unchecked(
                borrowed,
            ))
            .unwrap(),
        );
        assert_eq!(Arc::strong_count(&executor), 1);
    }

    /// A side-effecting tool the steps never call back (the caller runs it).
    struct Quiet;

    #[async_trait::async_trait]
    impl crate::tool::ToolHandler for Quiet {
        fn descriptor(&self) -> Result<crate::tool::ToolDescriptor, crate::tool::ToolCallError> {
            Ok(crate::tool::ToolDescriptor {
                name: "send".into(),
                version: 1,
                effect: crate::tool::EffectClass::SideEffect,
                batch: crate::tool::BatchMode::Atomic,
                idempotency_key: true,
                lookup: false,
                requires_approval: false,
                landing_window_ms: 0,
                key_lifetime_ms: None,
            })
        }
        async fn perform(
            &self,
            _: crate::tool::ToolRequest,
        ) -> Result<PerformOutcome, crate::tool::ToolCallError> {
            unreachable!("caller-driven: the library never calls the tool back")
        }
        async fn lookup(
            &self,
            _: crate::tool::ToolRequest,
        ) -> Result<LookupOutcome, crate::tool::ToolCallError> {
            unreachable!("caller-driven: the library never calls the tool back")
        }
        fn approval_preview(
            &self,
            _: String,
        ) -> Result<Option<String>, crate::tool::ToolCallError> {
            Ok(None)
        }
    }

    #[test]
    fn start_now_answers_a_replay_as_start_does_and_would_block_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let executor = executor(&dir);
        executor.register(Arc::new(Quiet)).unwrap();

        // An unknown tool: the same typed error as `start`, byte for byte.
        let unknown = start_request("op_1", "nobody");
        assert_eq!(
            step(&executor, STEP_START_NOW, &unknown, 4096),
            step(&executor, STEP_START, &unknown, 4096)
        );

        // A new call: would block, nothing recorded, the header set to 0.
        let request = start_request("op_1", "send");
        let (code, answer) = step(&executor, STEP_START_NOW, &request, 4096);
        assert_eq!((code, answer.len()), (WOULD_BLOCK, 0));
        let op = OperationId::new("op_1").unwrap();
        assert!(executor.inner.ledger().list(&op).unwrap().is_empty());

        // Run it, commit it; then the replay answers at once, exactly as `start`.
        let (code, answer) = step(&executor, STEP_START, &request, 4096);
        assert_eq!(code, OK);
        let CallerStep::Perform { attempt } =
            <CallerStep as Lift<UniFfiTag>>::try_read(&mut answer.as_slice()).unwrap()
        else {
            panic!("a new call is performed");
        };
        executor
            .report(
                attempt,
                PerformOutcome::Committed {
                    result_json: "{\"sent\":1}".into(),
                    external_id: Some("msg_1".into()),
                },
            )
            .unwrap();
        let now = step(&executor, STEP_START_NOW, &request, 4096);
        assert_eq!(now.0, OK);
        assert_eq!(now, step(&executor, STEP_START, &request, 4096));
        let CallerStep::Done { outcome } =
            <CallerStep as Lift<UniFfiTag>>::try_read(&mut now.1.as_slice()).unwrap()
        else {
            panic!("a replay is done");
        };
        assert!(matches!(
            outcome,
            crate::outcome::CallOutcome::Completed { replayed: true, ref result_json, .. }
                if result_json == "{\"sent\":1}"
        ));
        assert_eq!(Arc::strong_count(&executor), 1);
    }

    #[test]
    fn an_answer_longer_than_the_buffer_is_kept_for_take() {
        // (A step's request is always at least as long as its error; the
        // case comes from a result larger than the buffer, as in the Kotlin
        // suite's 700 KB echo. Here the writer itself.)
        let long: Vec<u8> = (0..100u8).collect();
        let mut memory = vec![0u8; HEADER + 50];
        assert_eq!(answer(&mut memory, OK, long.clone()), NEEDS_SPACE);
        assert_eq!(
            u64::from_ne_bytes(memory[..HEADER].try_into().unwrap()),
            100
        );
        // Too small a buffer to take it: refused, still kept.
        let mut tiny = vec![0u8; HEADER + 99];
        assert_eq!(
            unsafe { toolledger_direct_take(tiny.as_mut_ptr() as u64, tiny.len() as u64) },
            BAD_CALL
        );
        let mut big = vec![0u8; HEADER + 128];
        assert_eq!(
            unsafe { toolledger_direct_take(big.as_mut_ptr() as u64, big.len() as u64) },
            OK
        );
        assert_eq!(u64::from_ne_bytes(big[..HEADER].try_into().unwrap()), 100);
        assert_eq!(&big[HEADER..HEADER + 100], long.as_slice());
        // Taken once.
        assert_eq!(
            unsafe { toolledger_direct_take(big.as_mut_ptr() as u64, big.len() as u64) },
            BAD_CALL
        );
        // One that fits is written at once.
        let mut memory = vec![0u8; HEADER + 100];
        assert_eq!(answer(&mut memory, ERROR, long.clone()), ERROR);
        assert_eq!(&memory[HEADER..], long.as_slice());
    }
}
