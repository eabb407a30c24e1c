//! The downstream service the workers talk to. It runs in the supervisor, so
//! it outlives every worker it sees die, and it is the ground truth: it
//! counts committed effects per downstream key.
//!
//! One instance per run, in one of three behaviours ([`Mode`]):
//!
//! - `keys`: a repeated `Idempotency-Key` with the same body gets the
//!   original answer and no new effect;
//! - `lookup` and `neither`: every POST commits a new effect (so a blind
//!   resend *is* a duplicate); `GET /effects?key=` finds an effect by key
//!   (the `lookup` tools use it, the `neither` tools do not).
//!
//! `GET /truth?key=` is the app's own channel to the ground truth ("the user
//! checked their bank"): the harness's app resolves unknown outcomes with it.
//! `POST /jobs` starts a background job that finishes at once; `GET
//! /jobs/<id>` returns its webhook event. An effect commits when its whole
//! request has arrived; a request torn by the sender's death does nothing.
//!
//! [`Service::quiesce`] waits until every connection a dead worker opened has
//! been served, so the next worker never races the previous one's requests.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::workload::Mode;
use toolledger_test_support::http::{self, Request};

const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);
const QUIESCE_MAX: Duration = Duration::from_secs(15);

/// One committed side effect.
#[derive(Debug, Clone)]
pub struct Effect {
    /// `eff_N` or `job_N`.
    pub id: String,
    /// The `Idempotency-Key` / reference it was sent with.
    pub key: Option<String>,
    /// True for a background job.
    pub job: bool,
    /// The request body.
    pub body: String,
}

#[derive(Debug, Default)]
struct State {
    dedupe: bool,
    /// A request not fully received this long after it was accepted is
    /// dropped unapplied (live-owner runs: it bounds how late a request of a
    /// stopped worker can land, which the tools declare as their window).
    request_deadline: Option<Duration>,
    effects: Vec<Effect>,
    /// Idempotency store: key → (request body, status, response body).
    replies: HashMap<String, (String, u16, String)>,
    in_flight: usize,
    stopped: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running service on 127.0.0.1; stops when dropped.
pub struct Service {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Service {
    /// Starts a service with the behaviour of `mode` on a free port.
    pub fn start(mode: Mode) -> std::io::Result<Service> {
        Service::start_with(mode, None)
    }

    /// [`Service::start`], dropping requests not received in full within
    /// `request_deadline` of their connection.
    pub fn start_with(mode: Mode, request_deadline: Option<Duration>) -> std::io::Result<Service> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        shared.lock().dedupe = mode == Mode::Keys;
        shared.lock().request_deadline = request_deadline;
        let accept_shared = shared.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                {
                    let mut st = accept_shared.lock();
                    if st.stopped {
                        break;
                    }
                    // Counted at accept time, so `quiesce` sees it.
                    st.in_flight += 1;
                }
                let worker_shared = accept_shared.clone();
                thread::spawn(move || {
                    serve(&worker_shared, stream);
                    worker_shared.lock().in_flight -= 1;
                    worker_shared.changed.notify_all();
                });
            }
        });
        Ok(Service {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The committed effects, in commit order.
    pub fn effects(&self) -> Vec<Effect> {
        self.shared.lock().effects.clone()
    }

    /// Waits until every connection accepted so far (and every connection
    /// queued before a fence request of ours) has been served. Call after a
    /// worker died and before the next one starts. False on timeout.
    pub fn quiesce(&self) -> bool {
        // The listen queue is FIFO: once our fence is accepted, everything a
        // dead worker had queued before it is accepted and counted.
        let fenced = http::request_blocking(self.addr, "GET", "/fence", None, "", SOCKET_TIMEOUT)
            .is_ok_and(|r| r.status == 200);
        let deadline = Instant::now() + QUIESCE_MAX;
        let mut st = self.shared.lock();
        while st.in_flight > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        fenced
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        // Wake the blocking accept() so the loop sees `stopped`.
        let _ = TcpStream::connect_timeout(&self.addr, SOCKET_TIMEOUT);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let _ = self.quiesce();
    }
}

fn serve(shared: &Shared, mut stream: TcpStream) {
    let accepted = Instant::now();
    let _ = stream.set_read_timeout(Some(SOCKET_TIMEOUT));
    let _ = stream.set_write_timeout(Some(SOCKET_TIMEOUT));
    let Ok(Some(req)) = http::read_request(&stream) else {
        return;
    };
    let deadline = shared.lock().request_deadline;
    if deadline.is_some_and(|d| accepted.elapsed() > d) {
        return;
    }
    let (status, body) = handle(&mut shared.lock(), &req);
    let _ = http::write_response(&mut stream, status, &body);
}

fn error_body(message: &str) -> String {
    json!({ "error": message }).to_string()
}

/// What a POST /effects answers, and what a lookup of it returns.
fn effect_response(effect: &Effect) -> String {
    let request: Value =
        serde_json::from_str(&effect.body).unwrap_or_else(|_| Value::String(effect.body.clone()));
    json!({ "effect_id": effect.id, "key": effect.key, "request": request }).to_string()
}

/// The final result of a (finished) job: what its webhook carries and what
/// a lookup of it returns.
pub fn job_result(job_id: &str) -> String {
    json!({
        "job_id": job_id,
        "state": "succeeded",
        "url": format!("https://exports.invalid/{job_id}"),
    })
    .to_string()
}

fn found(effect: &Effect) -> String {
    if effect.job {
        job_result(&effect.id)
    } else {
        effect_response(effect)
    }
}

fn handle(st: &mut State, req: &Request) -> (u16, String) {
    match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/effects") => post(st, req, false),
        ("POST", "/jobs") => post(st, req, true),
        ("GET", "/effects" | "/truth") => {
            let key = req.param("key");
            match st
                .effects
                .iter()
                .find(|e| key.is_some() && e.key.as_deref() == key)
            {
                Some(effect) => (200, found(effect)),
                None => (404, error_body("no such effect")),
            }
        }
        ("GET", "/fence") => (200, "{}".into()),
        ("GET", path) if path.starts_with("/jobs/") => {
            let id = &path["/jobs/".len()..];
            match st.effects.iter().find(|e| e.job && e.id == id) {
                Some(effect) => (
                    200,
                    json!({ "event_id": format!("evt_{}", effect.id), "result": job_result(&effect.id) })
                        .to_string(),
                ),
                None => (404, error_body("no such job")),
            }
        }
        _ => (404, error_body("no such endpoint")),
    }
}

fn post(st: &mut State, req: &Request, job: bool) -> (u16, String) {
    if st.dedupe {
        if let Some(key) = &req.key {
            if let Some((body, status, response)) = st.replies.get(key) {
                return if *body == req.body {
                    (*status, response.clone())
                } else {
                    (422, error_body("idempotency key reused with another body"))
                };
            }
        }
    }
    let n = st.effects.len() + 1;
    let effect = Effect {
        id: if job {
            format!("job_{n}")
        } else {
            format!("eff_{n}")
        },
        key: req.key.clone(),
        job,
        body: req.body.clone(),
    };
    let (status, response) = if job {
        (202, json!({ "job_id": effect.id }).to_string())
    } else {
        (201, effect_response(&effect))
    };
    st.effects.push(effect);
    if let (true, Some(key)) = (st.dedupe, &req.key) {
        st.replies
            .insert(key.clone(), (req.body.clone(), status, response.clone()));
    }
    (status, response)
}
