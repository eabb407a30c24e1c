//! The workload: what one run asks of the executor, the tools that do it, and
//! the list of logical effects the supervisor expects to find afterwards.
//!
//! Five rounds of one operation: an email and a payment (approval required)
//! in parallel, a calendar event, an independent batch of invitations
//! ([`BATCH_ITEMS`] items, each its own effect), a background export job
//! finished by webhook, and a confirmation email. Every tool talks HTTP to
//! the supervisor's service; what it may do after an unknown outcome depends
//! on the run's [`Mode`].

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use toolledger::executor::{
    BatchMode, LookupOutcome, PerformOutcome, ToolDescriptor, ToolError, ToolHandler, ToolRequest,
};
use toolledger::model::{DownstreamKey, ExecutionId, ExecutionIdParts, OperationId, ToolCall};

use toolledger::crashpoint::{self, CrashPoint};
use toolledger_test_support::http;

/// Items in the independent batch.
pub const BATCH_ITEMS: u32 = 6;
/// The batch tool's name.
pub const BATCH_TOOL: &str = "send_invites";
/// The job tool's name.
pub const JOB_TOOL: &str = "export_data";
/// Client timeout: generous, so a loaded machine never makes a spurious
/// unknown outcome (the harness kills on purpose, it does not time out).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// In live-owner runs, the service drops a request not received in full
/// within this long of its connection…
pub const LIVE_REQUEST_DEADLINE: Duration = Duration::from_millis(1_000);
/// … so a request can land at most this long after it was sent: the window
/// the tools declare there.
pub const LIVE_LANDING_WINDOW: Duration = Duration::from_millis(1_500);

/// What the downstream offers, and so what the tools may do after an
/// unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The service dedupes by idempotency key: resend under the same key.
    Keys,
    /// No keys, but effects can be looked up by reference.
    Lookup,
    /// Neither: unknown outcomes are surfaced and the app resolves them.
    Neither,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 3] = [Mode::Keys, Mode::Lookup, Mode::Neither];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Keys => "keys",
            Mode::Lookup => "lookup",
            Mode::Neither => "neither",
        }
    }

    /// Parses [`Mode::name`].
    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Effect,
    Job,
}

fn descriptor(mode: Mode, name: &str, live: bool) -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: mode == Mode::Keys,
        lookup: mode == Mode::Lookup,
        requires_approval: name == "pay",
        batch: if name == BATCH_TOOL {
            BatchMode::Independent
        } else {
            BatchMode::Atomic
        },
        // Kill runs: the supervisor restarts a worker only after the dead
        // worker's requests have settled at the service
        // (`Service::quiesce`), so no request of an earlier life lands later.
        // Live runs: workers are stopped mid-request; the service bounds how
        // late a request can land, and the tools say so.
        landing_window: if live {
            LIVE_LANDING_WINDOW
        } else {
            Duration::ZERO
        },
        ..ToolDescriptor::side_effect(name, 1)
    }
}

/// The tools of a run in `mode` (`live`: a live-owner run), talking to the
/// service at `addr`.
pub fn tools(mode: Mode, addr: SocketAddr, live: bool) -> Vec<HttpTool> {
    ["send_email", "pay", "create_event", BATCH_TOOL, JOB_TOOL]
        .into_iter()
        .map(|name| HttpTool {
            desc: descriptor(mode, name, live),
            addr,
            kind: if name == JOB_TOOL {
                Kind::Job
            } else {
                Kind::Effect
            },
        })
        .collect()
}

/// The rounds of the workload: `(round, calls)`.
pub fn rounds() -> Vec<(u32, Vec<ToolCall>)> {
    let invites: Vec<Value> = (0..BATCH_ITEMS)
        .map(|i| json!({ "to": format!("guest{i}@example.com"), "event": "offsite" }))
        .collect();
    let mut pay = ToolCall::custom(
        "call_pay_1",
        "pay",
        r#"{"amount":"12.50","currency":"EUR","to":"Bob"}"#,
    );
    pay.position = 1;
    vec![
        (
            0,
            vec![
                ToolCall::custom(
                    "call_mail_1",
                    "send_email",
                    r#"{"to":"alice@example.com","subject":"Agenda","body":"See you at 10 ☕"}"#,
                ),
                pay,
            ],
        ),
        (
            1,
            vec![ToolCall::custom(
                "call_evt_1",
                "create_event",
                r#"{"title":"Offsite","start":"2030-05-01T10:00:00Z","minutes":90}"#,
            )],
        ),
        (
            2,
            vec![ToolCall::custom(
                "call_inv_1",
                BATCH_TOOL,
                json!({ "items": invites }).to_string(),
            )],
        ),
        (
            3,
            vec![ToolCall::custom(
                "call_exp_1",
                JOB_TOOL,
                r#"{"format":"csv","range":"2030-Q1"}"#,
            )],
        ),
        (
            4,
            vec![ToolCall::custom(
                "call_mail_2",
                "send_email",
                r#"{"to":"alice@example.com","subject":"Done","body":"All set."}"#,
            )],
        ),
    ]
}

/// One logical call the supervisor expects: its execution and the
/// downstream keys of its effects (one, or one per batch item).
#[derive(Debug, Clone)]
pub struct Expected {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The keys of its effects.
    pub keys: Vec<DownstreamKey>,
}

/// Every logical call of the workload under operation `op`.
pub fn expected(op: &OperationId) -> Result<Vec<Expected>, String> {
    let mut out = Vec::new();
    for (round, calls) in rounds() {
        for call in calls {
            let id = ExecutionId::derive(&ExecutionIdParts {
                operation: op,
                round,
                call_id: &call.call_id,
                tool_name: &call.tool_name,
                tool_version: 1,
            })
            .map_err(|e| e.to_string())?;
            let keys = if call.tool_name == BATCH_TOOL {
                (0..BATCH_ITEMS)
                    .map(|i| id.batch_item(i).downstream_key())
                    .collect()
            } else {
                vec![id.downstream_key()]
            };
            out.push(Expected {
                execution_id: id,
                keys,
            });
        }
    }
    Ok(out)
}

/// A tool that performs against the service over HTTP. 2xx → committed (or
/// job started), 4xx → provably not committed, 5xx → unknown, transport
/// errors → `Err` (unknown).
pub struct HttpTool {
    desc: ToolDescriptor,
    addr: SocketAddr,
    kind: Kind,
}

async fn send(
    addr: SocketAddr,
    method: &'static str,
    target: String,
    key: Option<String>,
    body: String,
    in_flight: bool,
) -> Result<http::Response, ToolError> {
    tokio::task::spawn_blocking(move || {
        http::request_then(
            addr,
            method,
            &target,
            key.as_deref(),
            &body,
            CLIENT_TIMEOUT,
            || {
                if in_flight {
                    crashpoint::hit(CrashPoint::InFlight);
                }
            },
        )
    })
    .await
    .map_err(|e| ToolError::new(format!("client task: {e}")))?
    .map_err(|e| ToolError::new(format!("transport: {e}")))
}

fn field(body: &str, name: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    value.get(name)?.as_str().map(str::to_owned)
}

#[async_trait]
impl ToolHandler for HttpTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.desc.clone()
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let path = match self.kind {
            Kind::Effect => "/effects",
            Kind::Job => "/jobs",
        };
        let resp = send(
            self.addr,
            "POST",
            path.into(),
            Some(req.downstream_key.as_str().to_owned()),
            req.arguments_json.clone(),
            true,
        )
        .await?;
        Ok(match (resp.status, self.kind) {
            (200..=299, Kind::Job) => PerformOutcome::JobStarted {
                job_id: field(&resp.body, "job_id").unwrap_or_default(),
            },
            (200..=299, Kind::Effect) => PerformOutcome::Committed {
                external_id: field(&resp.body, "effect_id"),
                result_json: resp.body,
            },
            (400..=499, _) => PerformOutcome::FailedBeforeCommit {
                reason: format!("refused ({})", resp.status),
                retryable: false,
            },
            (status, _) => PerformOutcome::Unknown {
                reason: format!("server error ({status})"),
            },
        })
    }

    async fn lookup(&self, req: ToolRequest) -> Result<LookupOutcome, ToolError> {
        if !self.desc.lookup {
            return Ok(LookupOutcome::Unsupported);
        }
        let target = format!("/effects?key={}", http::encode(req.downstream_key.as_str()));
        let resp = send(self.addr, "GET", target, None, String::new(), false).await?;
        match resp.status {
            200 => Ok(LookupOutcome::Found {
                external_id: field(&resp.body, "effect_id").or_else(|| field(&resp.body, "job_id")),
                result_json: resp.body,
            }),
            404 => Ok(LookupOutcome::NotFound),
            status => Err(ToolError::new(format!("lookup failed ({status})"))),
        }
    }

    fn approval_preview(&self, arguments_json: &str) -> Option<String> {
        let args: Value = serde_json::from_str(arguments_json).ok()?;
        Some(json!({ "amount": args.get("amount"), "to": args.get("to") }).to_string())
    }
}

/// The app's ground-truth query ("the user checked their bank"): the
/// effect's result if the service committed one under `key`.
pub fn truth(addr: SocketAddr, key: &str) -> Result<Option<(String, Option<String>)>, String> {
    let target = format!("/truth?key={}", http::encode(key));
    let resp = http::request_blocking(addr, "GET", &target, None, "", CLIENT_TIMEOUT)
        .map_err(|e| format!("truth query failed: {e}"))?;
    match resp.status {
        200 => {
            let ext = field(&resp.body, "effect_id").or_else(|| field(&resp.body, "job_id"));
            Ok(Some((resp.body, ext)))
        }
        404 => Ok(None),
        status => Err(format!("truth query answered {status}")),
    }
}

/// The webhook event of a finished job: `(event id, result JSON)`.
pub fn job_event(addr: SocketAddr, job_id: &str) -> Result<(String, String), String> {
    let target = format!("/jobs/{}", http::encode(job_id));
    let resp = http::request_blocking(addr, "GET", &target, None, "", CLIENT_TIMEOUT)
        .map_err(|e| format!("job query failed: {e}"))?;
    if resp.status != 200 {
        return Err(format!("job query answered {}", resp.status));
    }
    let event = field(&resp.body, "event_id").ok_or("job event without id")?;
    let result = field(&resp.body, "result").ok_or("job event without result")?;
    Ok((event, result))
}
