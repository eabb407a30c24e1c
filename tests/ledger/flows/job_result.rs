//! A finished job's result that is not JSON, or is over the size limit: it
//! is recorded (as the tool path records it), never refused with the effect
//! already made.

use super::*;

// ---------------------------------------------------------------------------
// A background job that succeeded downstream with a result the tool path
// would store (as a JSON string, or a size marker) is refused when it comes
// by webhook or poll: the effect happened, and nothing can record it.
// ---------------------------------------------------------------------------
struct JobTool;

#[async_trait]
impl ToolHandler for JobTool {
    fn descriptor(&self) -> ToolDescriptor {
        keyed("render")
    }
    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        Ok(PerformOutcome::JobStarted {
            job_id: "job_1".into(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_is_recorded_whatever_its_result_looks_like() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(1, 4));
    exec.register(Arc::new(JobTool)).unwrap();
    let max = exec.ledger().config().json_limits.max_bytes;
    for (call, result) in [
        ("c_text", "https://cdn.example/render/42.png".to_owned()),
        ("c_big", format!("\"{}\"", "x".repeat(max + 16))),
    ] {
        let out = exec
            .execute(&opid(), 0, tcall(call, "render", "{}"))
            .await
            .unwrap();
        assert!(matches!(out, CallOutcome::Pending { .. }), "{out:?}");
        let id = out.execution_id().clone();
        let webhook = exec.ingest_webhook(
            "svc",
            &format!("done_{call}"),
            &id,
            &JobUpdate::Succeeded {
                result_json: result.clone(),
            },
        );
        let poll = exec.record_job_update(
            &id,
            &JobUpdate::Succeeded {
                result_json: result.clone(),
            },
        );
        let status = exec.ledger().get(&id).unwrap().unwrap().status;
        eprintln!("{call}: webhook {webhook:?}; poll {poll:?}; status {status}");
        assert_eq!(
            status,
            ExecutionStatus::Committed,
            "{call}: the job succeeded downstream, but the ledger could not record it \
             (webhook {webhook:?}, poll {poll:?})"
        );
    }
}
