//! A loopback HTTP/1.1 downstream service for the executor tests, the
//! minimal client that talks to it, and [`HttpTool`], a `ToolHandler` built
//! on that client.
//!
//! The service commits side effects and counts them, so a test can assert
//! exactly how many real effects a scenario left behind. Per test it can be
//! told ([`Behaviour`]) to dedupe by `Idempotency-Key` (or not), to fail with
//! a 500 before or after committing, to commit and then hang or drop the
//! connection, to throttle, and to answer lookups (`GET /effects?key=…`).
//! Everything is bounded: the server stops when dropped, every socket has a
//! timeout, and a "hang" lasts at most [`HANG_MAX`] (less if the server is
//! dropped first).
//!

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::http::{self, read_request, write_response};
pub use crate::http::{encode, request_blocking, Response};
use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use toolledger::executor::{
    ExecutorConfig, LookupOutcome, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};

/// The longest a "commit then hang" request is held before it answers.
pub const HANG_MAX: Duration = Duration::from_secs(3);
/// How long a request waits for its rendezvous partners at most.
const RENDEZVOUS_MAX: Duration = Duration::from_secs(1);
/// Socket timeouts on the server side.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(2);
/// The default client timeout of [`HttpTool`].
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a test waits for a tool to reach a pause or crash point.
pub const WAIT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------

/// How the service behaves. Counters are consumed one per side-effecting
/// request (POST) that is not answered from the idempotency store, in the
/// order they are checked: `throttle`, `fail_before_commit`,
/// `close_before_commit`, then the commit, then `fail_after_commit`,
/// `close_after_commit`, `hang_after_commit`.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// A repeat with the same key and body returns the original response
    /// (no new effect); the same key with another body is a 422.
    pub idempotency: bool,
    /// The next N POSTs answer 429 without committing.
    pub throttle: u32,
    /// The next N POSTs answer 500 without committing.
    pub fail_before_commit: u32,
    /// The next N POSTs close the connection without committing.
    pub close_before_commit: u32,
    /// The next N POSTs commit, then answer 500.
    pub fail_after_commit: u32,
    /// The next N POSTs commit, then close the connection unanswered.
    pub close_after_commit: u32,
    /// The next N POSTs commit, then hold the answer for [`HANG_MAX`].
    pub hang_after_commit: u32,
    /// The next N reads (`GET /weather`) answer 503.
    pub read_unavailable: u32,
    /// Every read answers 503.
    pub read_always_unavailable: bool,
    /// Each request waits (at most 1 s) until this many requests are in
    /// flight together, so that allowed parallelism really overlaps.
    pub rendezvous: usize,
    /// Each request is held this long (service latency) before it is handled.
    pub latency: Duration,
    /// Each POST is held this long before it is applied, while lookups are
    /// answered at once: a slow server that applies a request after the
    /// client gave up waiting for it.
    pub post_delay: Duration,
}

/// One committed side effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// The service's id for it (`eff_1`, `eff_2`, …).
    pub id: String,
    /// The `Idempotency-Key` it was sent with.
    pub key: Option<String>,
    /// `/effects` or `/jobs`.
    pub path: String,
    /// The request body.
    pub body: String,
}

/// One request as the service saw it.
pub type Seen = http::Request;

#[derive(Debug, Default)]
struct State {
    behaviour: Behaviour,
    effects: Vec<Effect>,
    seen: Vec<Seen>,
    /// Idempotency store: key → (request body, status, response body).
    replies: HashMap<String, (String, u16, String)>,
    in_flight: usize,
    max_in_flight: usize,
    stopped: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `done` holds, the server stops, or `max` passes.
    fn wait_until<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        max: Duration,
        done: impl Fn(&State) -> bool,
    ) -> MutexGuard<'a, State> {
        let deadline = Instant::now() + max;
        while !done(&st) && !st.stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st
    }
}

/// What to do with one request.
enum Reply {
    Respond(u16, String),
    /// Hold the answer for up to [`HANG_MAX`], then send it.
    Hang(u16, String),
    /// Close the connection without answering.
    Close,
}

/// The running service. Dropping it stops the accept loop and joins every
/// connection thread (each bounded by socket timeouts and [`HANG_MAX`]).
pub struct Downstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Downstream {
    /// Starts a service on 127.0.0.1 (a free port) with `behaviour`.
    pub fn start(behaviour: Behaviour) -> Downstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared::default());
        shared.lock().behaviour = behaviour;
        let accept_shared = shared.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                if accept_shared.lock().stopped {
                    break;
                }
                let Ok(stream) = conn else { continue };
                let worker_shared = accept_shared.clone();
                let worker = thread::spawn(move || serve(&worker_shared, stream));
                accept_shared
                    .workers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(worker);
            }
        });
        Downstream {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The committed side effects, in commit order.
    pub fn effects(&self) -> Vec<Effect> {
        self.shared.lock().effects.clone()
    }

    /// Every request received, in arrival order.
    pub fn requests(&self) -> Vec<Seen> {
        self.shared.lock().seen.clone()
    }

    /// The side-effecting requests (POSTs) received.
    pub fn posts(&self) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|s| s.method == "POST")
            .collect()
    }

    /// The lookups (`GET /effects`) received.
    pub fn lookups(&self) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|s| s.method == "GET" && s.path == "/effects")
            .collect()
    }

    /// The most requests that were ever in flight at the same time.
    pub fn max_concurrent(&self) -> usize {
        self.shared.lock().max_in_flight
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.changed.notify_all();
        // Wake the blocking accept() so the loop sees `stopped`.
        let _ = TcpStream::connect_timeout(&self.addr, SOCKET_TIMEOUT);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let workers = std::mem::take(
            &mut *self
                .shared
                .workers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for worker in workers {
            let _ = worker.join();
        }
    }
}

fn serve(shared: &Shared, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(SOCKET_TIMEOUT));
    let _ = stream.set_write_timeout(Some(SOCKET_TIMEOUT));
    let Ok(Some(req)) = read_request(&stream) else {
        return;
    };
    let mut st = shared.lock();
    st.seen.push(req.clone());
    st.in_flight += 1;
    st.max_in_flight = st.max_in_flight.max(st.in_flight);
    shared.changed.notify_all();
    let rendezvous = st.behaviour.rendezvous;
    st = shared.wait_until(st, RENDEZVOUS_MAX, |s| s.in_flight >= rendezvous);
    let mut latency = st.behaviour.latency;
    if req.method == "POST" {
        latency += st.behaviour.post_delay;
    }
    if !latency.is_zero() {
        st = shared.wait_until(st, latency, |_| false);
    }
    let reply = handle(&mut st, &req);
    let reply = match reply {
        Reply::Hang(status, body) => {
            st = shared.wait_until(st, HANG_MAX, |_| false);
            Reply::Respond(status, body)
        }
        other => other,
    };
    drop(st);
    if let Reply::Respond(status, body) = reply {
        let _ = write_response(&mut stream, status, &body);
    }
    drop(stream);
    shared.lock().in_flight -= 1;
    shared.changed.notify_all();
}

fn take(counter: &mut u32) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}

fn error_body(message: &str) -> String {
    json!({ "error": message }).to_string()
}

fn effect_json(effect: &Effect) -> String {
    let body: Value =
        serde_json::from_str(&effect.body).unwrap_or_else(|_| Value::String(effect.body.clone()));
    json!({ "effect_id": effect.id, "key": effect.key, "body": body }).to_string()
}

fn handle(st: &mut State, req: &Seen) -> Reply {
    match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/effects" | "/jobs") => post(st, req),
        ("GET", "/effects") => {
            let key = req.query.iter().find(|(k, _)| k == "key").map(|(_, v)| v);
            match st.effects.iter().find(|e| e.key.as_ref() == key) {
                Some(effect) if key.is_some() => Reply::Respond(200, effect_json(effect)),
                _ => Reply::Respond(404, error_body("no such effect")),
            }
        }
        ("GET", "/weather") => {
            if take(&mut st.behaviour.read_unavailable) || st.behaviour.read_always_unavailable {
                return Reply::Respond(503, error_body("unavailable"));
            }
            match req.query.iter().find(|(k, _)| k == "city") {
                Some((_, city)) if !city.is_empty() => {
                    Reply::Respond(200, json!({ "city": city, "temp_c": 21 }).to_string())
                }
                _ => Reply::Respond(400, error_body("city is required")),
            }
        }
        _ => Reply::Respond(404, error_body("no such endpoint")),
    }
}

fn post(st: &mut State, req: &Seen) -> Reply {
    if st.behaviour.idempotency {
        if let Some(key) = &req.key {
            if let Some((body, status, response)) = st.replies.get(key) {
                return if *body == req.body {
                    Reply::Respond(*status, response.clone())
                } else {
                    Reply::Respond(422, error_body("idempotency key reused with another body"))
                };
            }
        }
    }
    let b = &mut st.behaviour;
    if take(&mut b.throttle) {
        return Reply::Respond(429, error_body("slow down"));
    }
    if take(&mut b.fail_before_commit) {
        return Reply::Respond(500, error_body("internal error"));
    }
    if take(&mut b.close_before_commit) {
        return Reply::Close;
    }
    let effect = Effect {
        id: format!("eff_{}", st.effects.len() + 1),
        key: req.key.clone(),
        path: req.path.clone(),
        body: req.body.clone(),
    };
    let response = effect_json(&effect);
    let status = if req.path == "/jobs" { 202 } else { 201 };
    st.effects.push(effect);
    if let (true, Some(key)) = (st.behaviour.idempotency, &req.key) {
        st.replies
            .insert(key.clone(), (req.body.clone(), status, response.clone()));
    }
    let b = &mut st.behaviour;
    if take(&mut b.fail_after_commit) {
        Reply::Respond(500, error_body("internal error"))
    } else if take(&mut b.close_after_commit) {
        Reply::Close
    } else if take(&mut b.hang_after_commit) {
        Reply::Hang(status, response)
    } else {
        Reply::Respond(status, response)
    }
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// [`request_blocking`] on tokio's blocking pool.
pub async fn request(
    addr: SocketAddr,
    method: &'static str,
    target: String,
    key: Option<String>,
    body: String,
    timeout: Duration,
) -> io::Result<Response> {
    tokio::task::spawn_blocking(move || {
        request_blocking(addr, method, &target, key.as_deref(), &body, timeout)
    })
    .await
    .map_err(|e| io::Error::other(e.to_string()))?
}

// ---------------------------------------------------------------------------
// The tool
// ---------------------------------------------------------------------------

/// What an [`HttpTool`] does with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /effects`: a 2xx is a committed effect.
    Effect,
    /// `POST /jobs`: a 2xx is a background job started.
    Job,
    /// `GET /weather?city=…` (read-only).
    Read,
}

/// Where a tool "crashes" (hangs so that the test can kill its process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Before the request leaves.
    BeforeSend,
    /// After the downstream answered, before the executor hears of it.
    AfterResponse,
}

/// The test's side of a pause: learn that the tool reached it, release it.
pub struct PauseHandle {
    reached: mpsc::UnboundedReceiver<()>,
    release: Arc<Notify>,
}

impl PauseHandle {
    /// Waits (bounded) until the tool is paused.
    pub async fn reached(&mut self) {
        tokio::time::timeout(WAIT, self.reached.recv())
            .await
            .expect("the tool reached its pause in time")
            .expect("the tool is alive");
    }

    /// Lets the paused tool go on.
    pub fn release(&self) {
        self.release.notify_one();
    }
}

/// The test's side of a crash point: learn that the tool is hanging there.
pub struct CrashHandle {
    reached: mpsc::UnboundedReceiver<()>,
}

impl CrashHandle {
    /// Waits (bounded) until the tool hangs at its crash point.
    pub async fn reached(&mut self) {
        tokio::time::timeout(WAIT, self.reached.recv())
            .await
            .expect("the tool reached its crash point in time")
            .expect("the tool is alive");
    }
}

struct Pause {
    reached: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

struct Crash {
    item: Option<u32>,
    point: CrashPoint,
    reached: mpsc::UnboundedSender<()>,
}

/// A tool that performs its calls against a [`Downstream`]: it sends the
/// execution's downstream key as `Idempotency-Key` and maps answers as a
/// real client must: 2xx → committed (or job started), 429 → provably not
/// committed and retryable, other 4xx → provably not committed, 5xx →
/// unknown (a client cannot tell whether a 500 came before or after the
/// commit), transport errors and timeouts → `Err` (unknown).
pub struct HttpTool {
    desc: ToolDescriptor,
    addr: SocketAddr,
    kind: Kind,
    timeout: Duration,
    preview: Option<fn(&str) -> String>,
    pause: Mutex<Option<Pause>>,
    crash: Mutex<Option<Crash>>,
}

impl HttpTool {
    /// A tool of `kind` described by `desc`, talking to `service`.
    pub fn new(desc: ToolDescriptor, kind: Kind, service: &Downstream) -> HttpTool {
        HttpTool {
            desc,
            addr: service.addr(),
            kind,
            timeout: CLIENT_TIMEOUT,
            preview: None,
            pause: Mutex::new(None),
            crash: Mutex::new(None),
        }
    }

    /// Uses `timeout` as the client timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> HttpTool {
        self.timeout = timeout;
        self
    }

    /// Shows `preview(arguments)` in approval prompts.
    pub fn with_preview(mut self, preview: fn(&str) -> String) -> HttpTool {
        self.preview = Some(preview);
        self
    }

    /// The first `perform` pauses before sending until released.
    pub fn pause_first_perform(&self) -> PauseHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        *self.pause.lock().unwrap() = Some(Pause {
            reached: tx,
            release: release.clone(),
        });
        PauseHandle {
            reached: rx,
            release,
        }
    }

    /// The perform of batch item `item` (`None`: a whole call) hangs at
    /// `point` (once), as if the process froze there.
    pub fn crash_at(&self, item: Option<u32>, point: CrashPoint) -> CrashHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.crash.lock().unwrap() = Some(Crash {
            item,
            point,
            reached: tx,
        });
        CrashHandle { reached: rx }
    }

    /// Hangs (bounded) if this is the crash point; an `Err` if the hang
    /// ever ends, since a "dead" process must not go on.
    async fn crash_if(&self, item: Option<u32>, point: CrashPoint) -> Result<(), ToolError> {
        let crash = {
            let mut slot = self.crash.lock().unwrap();
            match slot.as_ref() {
                Some(c) if c.item == item && c.point == point => slot.take(),
                _ => None,
            }
        };
        if let Some(crash) = crash {
            let _ = crash.reached.send(());
            tokio::time::sleep(Duration::from_secs(10)).await;
            return Err(ToolError::new(
                "the crash hang ended; the test should have killed us",
            ));
        }
        Ok(())
    }

    async fn send(&self, req: &ToolRequest) -> io::Result<Response> {
        let key = Some(req.downstream_key.as_str().to_owned());
        match self.kind {
            Kind::Effect => {
                let body = req.arguments_json.clone();
                request(
                    self.addr,
                    "POST",
                    "/effects".into(),
                    key,
                    body,
                    self.timeout,
                )
                .await
            }
            Kind::Job => {
                let body = req.arguments_json.clone();
                request(self.addr, "POST", "/jobs".into(), key, body, self.timeout).await
            }
            Kind::Read => {
                let args: Value = serde_json::from_str(&req.arguments_json).unwrap_or(Value::Null);
                let city = args.get("city").and_then(Value::as_str).unwrap_or("");
                let target = format!("/weather?city={}", encode(city));
                request(self.addr, "GET", target, None, String::new(), self.timeout).await
            }
        }
    }
}

fn effect_id(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    value.get("effect_id")?.as_str().map(str::to_owned)
}

#[async_trait]
impl ToolHandler for HttpTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.desc.clone()
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let pause = self.pause.lock().unwrap().take();
        if let Some(pause) = pause {
            let _ = pause.reached.send(());
            tokio::time::timeout(WAIT, pause.release.notified())
                .await
                .map_err(|_| ToolError::new("the pause was never released"))?;
        }
        self.crash_if(req.item_index, CrashPoint::BeforeSend)
            .await?;
        let sent = self.send(&req).await;
        if sent.is_ok() {
            self.crash_if(req.item_index, CrashPoint::AfterResponse)
                .await?;
        }
        let resp = sent.map_err(|e| ToolError::new(format!("transport: {e}")))?;
        Ok(match resp.status {
            200..=299 => match self.kind {
                Kind::Job => PerformOutcome::JobStarted {
                    job_id: effect_id(&resp.body).unwrap_or_default(),
                },
                Kind::Effect | Kind::Read => PerformOutcome::Committed {
                    external_id: effect_id(&resp.body),
                    result_json: resp.body,
                },
            },
            429 => PerformOutcome::FailedBeforeCommit {
                reason: "throttled (429)".into(),
                retryable: true,
            },
            400..=499 => PerformOutcome::FailedBeforeCommit {
                reason: format!("refused ({})", resp.status),
                retryable: false,
            },
            status => PerformOutcome::Unknown {
                reason: format!("server error ({status})"),
            },
        })
    }

    async fn lookup(&self, req: ToolRequest) -> Result<LookupOutcome, ToolError> {
        if !self.desc.lookup {
            return Ok(LookupOutcome::Unsupported);
        }
        let target = format!("/effects?key={}", encode(req.downstream_key.as_str()));
        let resp = request(self.addr, "GET", target, None, String::new(), self.timeout)
            .await
            .map_err(|e| ToolError::new(format!("lookup transport: {e}")))?;
        match resp.status {
            200 => Ok(LookupOutcome::Found {
                external_id: effect_id(&resp.body),
                result_json: resp.body,
            }),
            404 => Ok(LookupOutcome::NotFound),
            status => Err(ToolError::new(format!("lookup failed ({status})"))),
        }
    }

    fn approval_preview(&self, arguments_json: &str) -> Option<String> {
        self.preview.map(|p| p(arguments_json))
    }
}

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// An executor configuration that keeps the suite fast: 1 ms backoff,
/// a perform timeout well above the tools' client timeout.
pub fn fast_config() -> ExecutorConfig {
    ExecutorConfig {
        max_attempts: 3,
        read_only_max_attempts: 3,
        perform_timeout: Some(Duration::from_secs(2)),
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(4),
        max_parallel: 4,
    }
}

/// Runs `fut` as one "process": on its own runtime, which is shut down when
/// `fut` returns, dropping every task it still had (a tool hanging at a crash
/// point, the executor and ledger they hold) as the OS would on a kill.
pub fn process<F: Future>(fut: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(fut);
    rt.shutdown_timeout(WAIT);
    out
}
