//! Metrics and privacy: argument and result values (and what a badly behaved
//! tool puts in its error messages) never reach metrics, the `Debug` output
//! of outcomes and errors, or anything the CLI prints without `--show-args`,
//! while the counters still add up.

use toolledger_test_support as support;

use std::process::Command;
use std::sync::Arc;

use async_trait::async_trait;
use support::*;
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{Begin, Resolution};
use toolledger::model::ArgsDigest;

const BIN: &str = env!("CARGO_BIN_EXE_toolledger");

/// Argument and result values: they must never leak.
const SECRETS: &[&str] = &[
    "secret-iban-DE89370400440532013000",
    "DE89370400440532013000",
    "4111 1111 1111 1111",
    "4111111111111111",
    "Ada Lovelace-Byron",
    "1234.56",
    "conf-7f3a9c-SECRET",
];

/// What a badly behaved tool put into its error message (against the
/// `ToolError` contract). It is kept, verbatim, as the recorded reason of the
/// unknown outcome, so it shows in the transition log (and in `--show-args`
/// output), but never in metrics, outcomes, errors or the plain CLI output.
const TOOL_MESSAGE: &str = "sk_live_toolledger_secret";

fn args(amount: &str) -> String {
    format!(
        r#"{{"amount":"{amount}","card":"4111 1111 1111 1111","iban":"secret-iban-DE89370400440532013000","name":"Ada Lovelace-Byron"}}"#
    )
}

const RESULT: &str = r#"{"confirmation":"conf-7f3a9c-SECRET","card_seen":"4111111111111111"}"#;

#[derive(Clone, Copy)]
enum Mode {
    Commit,
    Unknown,
    Fail,
    Error,
    ReadOnly,
}

struct Tool {
    name: &'static str,
    mode: Mode,
}

#[async_trait]
impl ToolHandler for Tool {
    fn descriptor(&self) -> ToolDescriptor {
        match self.mode {
            Mode::ReadOnly => ToolDescriptor::read_only(self.name, 1),
            _ => ToolDescriptor::side_effect(self.name, 1),
        }
    }

    async fn perform(&self, request: ToolRequest) -> Result<PerformOutcome, ToolError> {
        assert!(request.arguments_json.contains("4111 1111 1111 1111"));
        match self.mode {
            Mode::Commit | Mode::ReadOnly => Ok(PerformOutcome::Committed {
                result_json: RESULT.into(),
                external_id: Some("conf-7f3a9c-SECRET".into()),
            }),
            Mode::Unknown => Ok(PerformOutcome::Unknown {
                reason: "timed out".into(),
            }),
            Mode::Fail => Ok(PerformOutcome::FailedBeforeCommit {
                reason: "declined".into(),
                retryable: false,
            }),
            // A badly behaved tool: its error message carries data.
            Mode::Error => Err(ToolError::new(
                "connection reset while sending with key sk_live_toolledger_secret",
            )),
        }
    }
}

fn assert_clean(what: &str, text: &str) {
    assert_values_clean(what, text);
    assert!(
        !text.contains(TOOL_MESSAGE),
        "{what} leaks the tool's message:\n{text}"
    );
}

fn assert_values_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} leaks {secret:?}:\n{text}");
    }
}

fn cli(args: &[&str]) -> (String, String) {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "toolledger {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn values_never_reach_metrics_debug_output_or_the_cli_and_the_counters_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let (ledger, _clock) = open_at(&db);
    let ledger = Arc::new(ledger);
    let executor = Executor::new(
        ledger.clone(),
        ExecutorConfig {
            max_attempts: 1,
            ..ExecutorConfig::default()
        },
    );
    for (name, mode) in [
        ("pay", Mode::Commit),
        ("pay_unknown", Mode::Unknown),
        ("pay_fail", Mode::Fail),
        ("pay_error", Mode::Error),
        ("balance", Mode::ReadOnly),
    ] {
        executor.register(Arc::new(Tool { name, mode })).unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let o = op("op_privacy");
    let mut debug = Vec::new();
    let mut run = |round: u32, call_id: &str, tool: &str, amount: &str| -> CallOutcome {
        let outcome = rt
            .block_on(executor.execute(&o, round, call(call_id, tool, &args(amount))))
            .unwrap();
        debug.push(format!("{outcome:?} {:?}", outcome.label()));
        outcome
    };

    // success, replay, conflict, unknown (twice: a plain unknown and a tool
    // error), failure, read-only.
    let paid = run(0, "call_pay", "pay", "1234.56");
    assert!(matches!(
        paid,
        CallOutcome::Completed {
            replayed: false,
            ..
        }
    ));
    assert_eq!(paid.result_json(), Some(RESULT), "the model gets the value");
    let replay = run(0, "call_pay", "pay", "1234.56");
    assert!(matches!(
        replay,
        CallOutcome::Completed { replayed: true, .. }
    ));
    let conflict = run(0, "call_pay", "pay", "9999.99");
    assert!(matches!(conflict, CallOutcome::Conflict { .. }));
    let unknown = run(0, "call_unknown", "pay_unknown", "1234.56");
    assert!(matches!(unknown, CallOutcome::Unknown { .. }));
    let errored = run(0, "call_error", "pay_error", "1234.56");
    assert!(
        matches!(errored, CallOutcome::Unknown { .. }),
        "{errored:?}"
    );
    let failed = run(1, "call_fail", "pay_fail", "1234.56");
    assert!(matches!(
        failed,
        CallOutcome::Failed {
            retryable: false,
            ..
        }
    ));
    let read = run(1, "call_balance", "balance", "1234.56");
    assert!(matches!(read, CallOutcome::Completed { .. }));

    // Errors on the way, each carrying values in its input.
    let mut errors = Vec::new();
    errors.push(format!(
        "{:?}",
        rt.block_on(executor.execute(
            &o,
            2,
            call("call_bad", "pay", r#"{"card":"4111 1111 1111 1111","#)
        ))
        .unwrap_err()
    ));
    errors.push(format!(
        "{:?}",
        rt.block_on(executor.execute(&o, 2, call("call_x", "nope", &args("1234.56"))))
            .unwrap_err()
    ));
    let paid_id = paid.execution_id().clone();
    errors.push(format!(
        "{:?}",
        ledger
            .commit(
                &current(&ledger, &paid_id),
                r#"{"confirmation":"conf-7f3a9c-SECRET","v":2}"#,
                None
            )
            .unwrap_err()
    ));
    errors.push(format!(
        "{:?}",
        ledger
            .commit(
                &current(&ledger, &paid_id),
                r#"{"card":"4111 1111 1111 1111""#,
                None
            )
            .unwrap_err()
    ));
    errors.push(format!(
        "{:?}",
        rt.block_on(executor.resolve_unknown(
            &current(&ledger, &paid_id),
            Resolution::Found {
                result_json: RESULT.into(),
                external_id: Some("conf-7f3a9c-SECRET".into()),
            },
        ))
        .unwrap_err()
    ));
    errors.push(format!(
        "{:?}",
        ledger
            .approve(
                &paid_id,
                &ArgsDigest::parse("0".repeat(64)).unwrap(),
                Some(RESULT)
            )
            .unwrap_err()
    ));
    // What the ledger itself hands out: answers, records, tickets, logs.
    match ledger
        .begin(&o, 0, &spec("call_pay", "pay", &args("1234.56")))
        .unwrap()
    {
        answer @ Begin::Replay(_) => debug.push(format!("{answer:?}")),
        other => panic!("expected a replay, got {other:?}"),
    }
    let mut logs = Vec::new();
    for rec in ledger.list(&o).unwrap() {
        debug.push(format!("{rec:?}"));
        logs.push(format!(
            "{:?}",
            ledger.transitions(&rec.execution_id).unwrap()
        ));
    }
    for log in &logs {
        assert_values_clean("a transition log", log);
    }
    debug.push(format!("{:?}", ledger.recover().unwrap()));
    for (what, text) in debug.iter().chain(&errors).enumerate() {
        assert_clean(&format!("Debug output #{what}"), text);
    }

    // The counters.
    let snapshot = executor.metrics();
    assert_clean("the metrics snapshot", &format!("{snapshot:?}"));
    assert_clean("the metrics snapshot (pretty)", &format!("{snapshot:#?}"));
    assert_eq!(
        snapshot.attempts, 5,
        "pay, pay_unknown, pay_error, pay_fail, balance"
    );
    assert_eq!(snapshot.replays, 1);
    assert_eq!(snapshot.conflicts, 1);
    assert_eq!(snapshot.outcome_unknown, 2);
    assert_eq!(snapshot.in_flight, 0);
    assert_eq!(
        snapshot.prevented_duplicates, 2,
        "one replay + one conflict"
    );
    for tool in ["pay", "pay_unknown", "pay_error", "pay_fail", "balance"] {
        let summary = snapshot
            .latency
            .iter()
            .find(|l| l.tool == tool)
            .unwrap_or_else(|| panic!("no latency for {tool}: {snapshot:?}"));
        assert_eq!(summary.count, 1, "{tool}");
        assert!(summary.p99_us >= summary.p50_us);
    }
    drop(executor);
    drop(ledger);

    // The CLI, without --show-args, prints none of it.
    let path = db.to_str().unwrap();
    for command in [
        vec!["inspect", path],
        vec!["inspect", path, "--json"],
        vec!["stats", path],
        vec!["stats", path, "--json"],
        vec!["recover", path],
        vec!["recover", path, "--json"],
        vec!["export", path],
    ] {
        let (stdout, stderr) = cli(&command);
        assert!(!stdout.is_empty(), "{command:?} printed nothing");
        assert_clean(
            &format!("`toolledger {}` stdout", command.join(" ")),
            &stdout,
        );
        assert_clean(
            &format!("`toolledger {}` stderr", command.join(" ")),
            &stderr,
        );
    }
    // With --show-args the values are there (so the checks above can see them).
    let (shown, _) = cli(&["export", path, "--show-args"]);
    assert!(shown.contains("secret-iban-DE89370400440532013000"));
    assert!(shown.contains("conf-7f3a9c-SECRET"));
    let (prune_out, prune_err) = cli(&["prune", path, "--older-than", "0s", "--json"]);
    assert_clean("`toolledger prune` stdout", &prune_out);
    assert_clean("`toolledger prune` stderr", &prune_err);
}
