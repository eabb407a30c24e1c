//! `driven_bench` (`cargo run --release -p toolledger-bench --bin driven_bench`): the caller-driven steps (`Executor::start` →
//! `report`) against `Executor::execute` of the same no-op call, in the Rust
//! API, in one run on one ledger — the part of a binding's executor figure
//! that is the core's and not the crossing's.
//!
//! ```text
//! driven_bench <dir> [calls per batch, default 200] [batches, default 10] [only]
//! ```
//!
//! Batches alternate between the ways; every figure is a p50 / p99 in µs.
//! `execute` and `start+report` are new calls to a no-op side-effecting tool
//! that dedupes by key (its key's lifetime undeclared, so the durability
//! policy keeps its commit durable: two syncs, on both paths); `start` and `report` are the two halves of the driven call, timed
//! apart; the replays ask for a call that committed (`replay_start_now`:
//! answered in place by `start_now`); `start_now_miss` is `start_now` of a
//! new call (not answered: what the suspending bindings pay before they
//! hop for one). `only` (`execute` or
//! `driven`) runs that one way for `--calls` calls and nothing else, for
//! `strace -f -c -e trace=fsync,fdatasync` to count its syncs.
//!
//! `TL_BENCH_EVICT_KIB=N` writes over N KiB of memory before each timed
//! step (not timed): the calls then run with the caches as a language
//! runtime leaves them between its crossings, not as a tight Rust loop
//! keeps them.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use toolledger::executor::{
    CallerStep, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{Ledger, LedgerConfig};
use toolledger::model::{OperationId, ToolCall};

/// A tool that does nothing and answers `"ok"`.
struct Noop(ToolDescriptor);

#[async_trait]
impl ToolHandler for Noop {
    fn descriptor(&self) -> ToolDescriptor {
        self.0.clone()
    }

    async fn perform(&self, _request: ToolRequest) -> Result<PerformOutcome, ToolError> {
        Ok(noop_result())
    }
}

fn noop_result() -> PerformOutcome {
    PerformOutcome::Committed {
        result_json: "\"ok\"".into(),
        external_id: None,
    }
}

type Failure = Box<dyn std::error::Error>;

struct Bench {
    /// Written over before each timed step (`TL_BENCH_EVICT_KIB`).
    evict: Vec<u8>,
    executor: Executor,
    rt: tokio::runtime::Runtime,
    op: OperationId,
    next: u64,
}

impl Bench {
    fn open(dir: &std::path::Path) -> Result<Bench, Failure> {
        let ledger = Arc::new(Ledger::open(
            &dir.join("driven.db"),
            LedgerConfig::default(),
        )?);
        let executor = Executor::new(ledger, ExecutorConfig::default());
        executor.register(Arc::new(Noop(ToolDescriptor {
            idempotency_key: true,
            ..ToolDescriptor::side_effect("noop", 1)
        })))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let evict_kib: usize = std::env::var("TL_BENCH_EVICT_KIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let this = Bench {
            evict: vec![0; evict_kib * 1024],
            executor,
            rt,
            op: OperationId::new("driven")?,
            next: 0,
        };
        this.rt
            .block_on(this.executor.execute(&this.op, 0, replayed()))?;
        Ok(this)
    }

    /// Leaves the caches as other work would (nothing when not asked).
    fn evict(&mut self) {
        let round = self.next as u8;
        for chunk in self.evict.chunks_mut(64) {
            chunk[0] = chunk[0].wrapping_add(round | 1);
        }
        std::hint::black_box(&self.evict);
    }

    fn new_call(&mut self) -> ToolCall {
        self.next += 1;
        ToolCall::custom(
            format!("call_{}", self.next),
            "noop",
            "{\"to\":\"a@example.com\"}",
        )
    }

    fn execute(&mut self) -> Result<Duration, Failure> {
        let call = self.new_call();
        self.evict();
        let t = Instant::now();
        self.rt.block_on(self.executor.execute(&self.op, 1, call))?;
        Ok(t.elapsed())
    }

    /// start → report of a new call: (start, report).
    fn driven(&mut self) -> Result<(Duration, Duration), Failure> {
        let call = self.new_call();
        self.evict();
        let t = Instant::now();
        let CallerStep::Perform(attempt) = self.executor.start(&self.op, 1, call)? else {
            return Err("a new call was not performed".into());
        };
        let started = t.elapsed();
        self.evict();
        let t = Instant::now();
        let step = self.executor.report(&attempt, Ok(noop_result()))?;
        let reported = t.elapsed();
        if !matches!(step, CallerStep::Done(_)) {
            return Err("a report did not finish the call".into());
        }
        Ok((started, reported))
    }

    fn replay_execute(&mut self) -> Result<Duration, Failure> {
        self.evict();
        let t = Instant::now();
        self.rt
            .block_on(self.executor.execute(&self.op, 0, replayed()))?;
        Ok(t.elapsed())
    }

    fn replay_start(&mut self) -> Result<Duration, Failure> {
        self.evict();
        let t = Instant::now();
        let step = self.executor.start(&self.op, 0, replayed())?;
        let took = t.elapsed();
        if !matches!(step, CallerStep::Done(_)) {
            return Err("a replay was not answered at once".into());
        }
        Ok(took)
    }

    /// `start_now` of the committed call: answered in place.
    fn replay_start_now(&mut self) -> Result<Duration, Failure> {
        self.evict();
        let call = replayed();
        let t = Instant::now();
        let step = self.executor.start_now(&self.op, 0, &call)?;
        let took = t.elapsed();
        if !matches!(step, Some(CallerStep::Done(_))) {
            return Err("a replay was not answered in place".into());
        }
        Ok(took)
    }

    /// `start_now` of a new call: not answered (nothing written), what a
    /// suspending binding pays before it hops for a new call.
    fn start_now_miss(&mut self) -> Result<Duration, Failure> {
        let call = self.new_call();
        self.evict();
        let t = Instant::now();
        let step = self.executor.start_now(&self.op, 1, &call)?;
        let took = t.elapsed();
        if step.is_some() {
            return Err("a new call was answered in place".into());
        }
        Ok(took)
    }
}

fn replayed() -> ToolCall {
    ToolCall::custom("replayed", "noop", "{\"to\":\"a@example.com\"}")
}

/// p50 and p99 of `samples`, in µs.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    (at(0.5), at(0.99))
}

fn arg<T: std::str::FromStr>(n: usize, default: T) -> Result<T, Failure> {
    match std::env::args().nth(n) {
        Some(s) => s.parse().map_err(|_| format!("bad argument {s}").into()),
        None => Ok(default),
    }
}

fn run() -> Result<(), Failure> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or("usage: driven_bench <dir> [calls] [batches] [execute|driven]")?;
    let calls: usize = arg(2, 200)?;
    let batches: usize = arg(3, 10)?;
    let only: Option<String> = std::env::args().nth(4);
    let mut bench = Bench::open(&dir)?;
    match only.as_deref() {
        Some("execute") => {
            for _ in 0..calls {
                bench.execute()?;
            }
            return Ok(());
        }
        Some("driven") => {
            for _ in 0..calls {
                bench.driven()?;
            }
            return Ok(());
        }
        Some(other) => return Err(format!("unknown way {other}").into()),
        None => {}
    }
    let names = [
        "execute",
        "start+report",
        "start",
        "report",
        "replay_execute",
        "replay_start",
        "replay_start_now",
        "start_now_miss",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    for _ in 0..batches {
        for _ in 0..calls {
            samples[0].push(bench.execute()?);
        }
        for _ in 0..calls {
            let (s, r) = bench.driven()?;
            samples[1].push(s + r);
            samples[2].push(s);
            samples[3].push(r);
        }
        for _ in 0..calls {
            samples[4].push(bench.replay_execute()?);
        }
        for _ in 0..calls {
            samples[5].push(bench.replay_start()?);
        }
        for _ in 0..calls {
            samples[6].push(bench.replay_start_now()?);
        }
        for _ in 0..calls {
            samples[7].push(bench.start_now_miss()?);
        }
    }
    let mut p50 = Vec::new();
    for (name, s) in names.iter().zip(samples.iter_mut()) {
        let (a, b) = percentiles(s);
        p50.push(a);
        println!("{name}_p50_us={a:.1} {name}_p99_us={b:.1}");
    }
    println!("driven_over_execute_p50_us={:.1}", p50[1] - p50[0]);
    println!("replay_start_over_execute_p50_us={:.1}", p50[5] - p50[4]);
    println!("replay_start_now_over_start_p50_us={:.1}", p50[6] - p50[5]);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("driven_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
