//! Sizes of stored text (docs/design.md): free text (reasons, a job's
//! state label) is stored cut to a bound and says how long it was, so a
//! step is always recorded; foreign ids (external ids, job ids, webhook
//! sources and event ids) that are empty or too long are refused with a
//! typed error before anything is written. Through the executor, a tool's
//! id the ledger cannot store is left out and its effect still recorded.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use support::*;
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{
    AttemptId, Begin, Error as LedgerError, JobApplied, JobUpdate, Ledger, Resolution,
};
use toolledger::model::text::{MAX_FOREIGN_ID_BYTES, MAX_LABEL_BYTES, MAX_REASON_BYTES};
use toolledger::model::{ExecutionId, ExecutionStatus, IdError, ToolCall};
use toolledger_test_support as support;

const BIG: usize = 8 << 20;

fn executing(ledger: &Ledger, call_id: &str) -> AttemptId {
    match ledger
        .begin(&op("op"), 0, &spec(call_id, "t", "{}"))
        .unwrap()
    {
        Begin::Execute(ticket) => ticket.attempt_id(),
        other => panic!("expected Execute, got {other:?}"),
    }
}

fn file_bytes(db: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .map(|suffix| {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
        })
        .sum()
}

fn marker(len: usize) -> String {
    format!(" [cut: {len} bytes in all]")
}

/// `stored` is `full` cut to `max` bytes with the marker.
fn assert_cut(stored: &str, full: &str, max: usize) {
    assert!(stored.len() <= max, "{} bytes stored", stored.len());
    assert!(stored.ends_with(&marker(full.len())), "{stored:.80}…");
    let kept = stored.trim_end_matches(&marker(full.len()));
    assert!(full.starts_with(kept));
    assert!(kept.len() > max / 2, "most of the room is the text");
}

#[test]
fn long_reasons_are_recorded_cut_and_say_their_length() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, _clock) = open_at(&db);
    // Multi-byte characters straddle the cut.
    let long = "é".repeat(BIG / 2);

    // A retryable failure, three times over: each is recorded, each cut.
    for _ in 0..3 {
        let a = executing(&ledger, "fails");
        ledger.fail_before_commit(&a, &long, true).unwrap();
        let rec = ledger.get(&a.execution_id).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
        assert_cut(rec.last_reason.as_deref().unwrap(), &long, MAX_REASON_BYTES);
    }
    let log = ledger
        .transitions(&ExecutionId::parse("op:round_0:fails:t:v1").unwrap())
        .unwrap();
    let reasons: Vec<_> = log.iter().filter_map(|t| t.reason.as_deref()).collect();
    assert_eq!(reasons.len(), 3, "{log:?}");
    for r in reasons {
        assert_cut(r, &long, MAX_REASON_BYTES);
    }

    // An unknown outcome and a stale attempt's evidence.
    let a = executing(&ledger, "unknown");
    ledger.mark_outcome_unknown(&a, &long).unwrap();
    let rec = ledger.get(&a.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_cut(rec.last_reason.as_deref().unwrap(), &long, MAX_REASON_BYTES);
    let _next = ledger
        .resolve_unknown(&a, Resolution::NotFoundRetry)
        .unwrap();
    assert_eq!(
        ledger.get(&a.execution_id).unwrap().unwrap().attempt_count,
        2
    );
    let stale = ledger.fail_before_commit(&a, &long, false).unwrap_err();
    assert!(
        matches!(stale, LedgerError::StaleAttempt { .. }),
        "{stale:?}"
    );
    let evidence = ledger.evidence(&a.execution_id).unwrap();
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    assert_cut(
        evidence[0].reason.as_deref().unwrap(),
        &long,
        MAX_REASON_BYTES,
    );

    // A rejected approval.
    let s = spec("approve", "t", "{}").with_approval();
    let Begin::NeedsApproval(req) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!("expected NeedsApproval");
    };
    ledger
        .reject(&req.execution_id, &req.args_digest, &long)
        .unwrap();
    let rec = ledger.get(&req.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Rejected);
    assert_cut(rec.last_reason.as_deref().unwrap(), &long, MAX_REASON_BYTES);

    // Five steps with 8 MiB reasons, and the file holds kilobytes of them.
    assert!(file_bytes(&db) < 2 << 20, "{} bytes", file_bytes(&db));
}

#[test]
fn a_job_failure_and_a_job_label_are_stored_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let a = executing(&ledger, "job");
    ledger.record_job(&a, "job_1").unwrap();
    let label = "q".repeat(BIG);
    let applied = ledger
        .ingest_webhook(
            "render",
            "evt_1",
            &a.execution_id,
            &JobUpdate::Progress {
                state: label.clone(),
            },
        )
        .unwrap();
    assert_eq!(applied, JobApplied::Progress);
    let (job_id, state) = ledger.job(&a.execution_id).unwrap().unwrap();
    assert_eq!(job_id, "job_1");
    assert_cut(&state, &label, MAX_LABEL_BYTES);

    let reason = "r".repeat(BIG);
    let applied = ledger
        .ingest_webhook(
            "render",
            "evt_2",
            &a.execution_id,
            &JobUpdate::Failed {
                reason: reason.clone(),
            },
        )
        .unwrap();
    assert_eq!(applied, JobApplied::Failed);
    let rec = ledger.get(&a.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    assert_cut(
        rec.last_reason.as_deref().unwrap(),
        &reason,
        MAX_REASON_BYTES,
    );
}

fn is_empty_id(e: &LedgerError, what: &str) -> bool {
    matches!(e, LedgerError::Id(IdError::Empty { component }) if *component == what)
}

fn is_long_id(e: &LedgerError, what: &str) -> bool {
    matches!(
        e,
        LedgerError::Id(IdError::TooLong { component, len, max })
            if *component == what && *len == MAX_FOREIGN_ID_BYTES + 1 && *max == MAX_FOREIGN_ID_BYTES
    )
}

#[test]
fn empty_and_oversized_foreign_ids_are_refused_and_record_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let long = "x".repeat(MAX_FOREIGN_ID_BYTES + 1);
    let longest = "x".repeat(MAX_FOREIGN_ID_BYTES);

    // External ids: refused, the call still executing with none stored, and
    // the real id recorded after (an empty one stored first used to make it
    // `AlreadyCommitted`).
    let a = executing(&ledger, "ext");
    let e = ledger.record_external_id(&a, "").unwrap_err();
    assert!(is_empty_id(&e, "external id"), "{e:?}");
    let e = ledger.record_external_id(&a, &long).unwrap_err();
    assert!(is_long_id(&e, "external id"), "{e:?}");
    let e = ledger.commit(&a, "{}", Some("")).unwrap_err();
    assert!(is_empty_id(&e, "external id"), "{e:?}");
    let rec = ledger.get(&a.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    assert_eq!(rec.external_id, None);
    ledger.record_external_id(&a, "msg_1").unwrap();
    ledger.commit(&a, "{}", Some("msg_1")).unwrap();
    assert_eq!(
        ledger.get(&a.execution_id).unwrap().unwrap().external_id,
        Some("msg_1".to_owned())
    );
    // The longest id accepted is accepted.
    let b = executing(&ledger, "longest");
    ledger.commit(&b, "{}", Some(&longest)).unwrap();

    // A resolution naming an unusable id: refused, still unknown.
    let c = executing(&ledger, "resolve");
    ledger.mark_outcome_unknown(&c, "timeout").unwrap();
    let e = ledger
        .resolve_unknown(
            &c,
            Resolution::Found {
                result_json: "{}".into(),
                external_id: Some(String::new()),
            },
        )
        .unwrap_err();
    assert!(is_empty_id(&e, "external id"), "{e:?}");
    assert_eq!(
        ledger.get(&c.execution_id).unwrap().unwrap().status,
        ExecutionStatus::OutcomeUnknown
    );

    // A batch item.
    let d = executing(&ledger, "batch");
    let e = ledger.record_batch_item(&d, 0, "{}", Some("")).unwrap_err();
    assert!(is_empty_id(&e, "external id"), "{e:?}");
    assert!(ledger.batch_items(&d.execution_id).unwrap().is_empty());

    // Job ids.
    let j = executing(&ledger, "job");
    let e = ledger.record_job(&j, "").unwrap_err();
    assert!(is_empty_id(&e, "job id"), "{e:?}");
    let e = ledger.record_job(&j, &long).unwrap_err();
    assert!(is_long_id(&e, "job id"), "{e:?}");
    assert_eq!(ledger.job(&j.execution_id).unwrap(), None);
    ledger.record_job(&j, "job_1").unwrap();

    // Webhooks: an empty event id would make every other empty one a
    // "duplicate" and drop it. Refused, and nothing of it recorded: the
    // same update under a real id applies.
    let progress = JobUpdate::Progress {
        state: "queued".into(),
    };
    let e = ledger
        .ingest_webhook("render", "", &j.execution_id, &progress)
        .unwrap_err();
    assert!(is_empty_id(&e, "webhook event id"), "{e:?}");
    let e = ledger
        .ingest_webhook("", "evt_1", &j.execution_id, &progress)
        .unwrap_err();
    assert!(is_empty_id(&e, "webhook source"), "{e:?}");
    let e = ledger
        .ingest_webhook("render", &long, &j.execution_id, &progress)
        .unwrap_err();
    assert!(is_long_id(&e, "webhook event id"), "{e:?}");
    let e = ledger
        .ingest_webhook(&long, "evt_1", &j.execution_id, &progress)
        .unwrap_err();
    assert!(is_long_id(&e, "webhook source"), "{e:?}");
    assert_eq!(
        ledger.job(&j.execution_id).unwrap(),
        Some(("job_1".to_owned(), "started".to_owned()))
    );
    let done = JobUpdate::Succeeded {
        result_json: r#"{"url":"u"}"#.into(),
    };
    assert!(matches!(
        ledger
            .ingest_webhook("render", "evt_1", &j.execution_id, &done)
            .unwrap(),
        JobApplied::Committed(_)
    ));
    assert_eq!(
        ledger
            .ingest_webhook("render", "evt_1", &j.execution_id, &done)
            .unwrap(),
        JobApplied::DuplicateEvent
    );
}

/// A side-effecting tool that answers what it is told and counts its
/// performs.
struct Scripted {
    answer: Mutex<Option<PerformOutcome>>,
    performs: AtomicUsize,
}

#[async_trait]
impl ToolHandler for Scripted {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::side_effect("t", 1)
    }

    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer.lock().unwrap().take();
        Ok(answer.expect("performed once"))
    }
}

fn run_once(ledger: Ledger, call_id: &str, answer: PerformOutcome) -> (Executor, CallOutcome) {
    let tool = Arc::new(Scripted {
        answer: Mutex::new(Some(answer)),
        performs: AtomicUsize::new(0),
    });
    let exec = Executor::new(Arc::new(ledger), ExecutorConfig::default());
    exec.register(tool.clone()).unwrap();
    let out = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(exec.execute(&op("op"), 0, ToolCall::custom(call_id, "t", "{}")))
        .unwrap();
    assert_eq!(tool.performs.load(Ordering::SeqCst), 1);
    (exec, out)
}

#[test]
fn through_the_executor_an_unusable_id_is_left_out_and_the_effect_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");

    // A committed effect with an empty or oversized external id: the
    // result is stored, the id is not.
    for (call_id, bad) in [
        ("empty", String::new()),
        ("long", "x".repeat(MAX_FOREIGN_ID_BYTES + 1)),
    ] {
        let (ledger, _clock) = open_at(&db);
        let (exec, out) = run_once(
            ledger,
            call_id,
            PerformOutcome::Committed {
                result_json: r#"{"sent":true}"#.into(),
                external_id: Some(bad),
            },
        );
        let CallOutcome::Completed {
            execution_id,
            result_json,
            ..
        } = out
        else {
            panic!("expected Completed, got {out:?}");
        };
        assert_eq!(result_json, r#"{"sent":true}"#);
        let rec = exec.ledger().get(&execution_id).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Committed);
        assert_eq!(rec.external_id, None);
    }

    // A job started under an empty id cannot be followed: unknown, and the
    // reason says why.
    let (ledger, _clock) = open_at(&db);
    let (exec, out) = run_once(
        ledger,
        "job",
        PerformOutcome::JobStarted {
            job_id: String::new(),
        },
    );
    let CallOutcome::Unknown {
        execution_id,
        reason,
        ..
    } = out
    else {
        panic!("expected Unknown, got {out:?}");
    };
    assert!(reason.contains("job id must not be empty"), "{reason}");
    let rec = exec.ledger().get(&execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(exec.ledger().job(&execution_id).unwrap(), None);

    // A tool's long failure reason: recorded cut.
    let (ledger, _clock) = open_at(&db);
    let long = "f".repeat(BIG);
    let (exec, out) = run_once(
        ledger,
        "fails",
        PerformOutcome::FailedBeforeCommit {
            reason: long.clone(),
            retryable: false,
        },
    );
    let CallOutcome::Failed { execution_id, .. } = out else {
        panic!("expected Failed, got {out:?}");
    };
    let rec = exec.ledger().get(&execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    assert_cut(rec.last_reason.as_deref().unwrap(), &long, MAX_REASON_BYTES);
}
