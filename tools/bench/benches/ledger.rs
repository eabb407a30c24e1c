//! Criterion micro-benchmarks of the ledger's hot paths:
//!
//! - `replay`: `begin` of a committed call (the answer every retry gets);
//! - `begin_round_of_8`: the durable intent of 8 parallel calls (one sync);
//! - `digest_1kib`: canonical JSON + SHA-256 of a 1 KiB argument object;
//! - `raw_floor_commit`: one bare rusqlite `BEGIN IMMEDIATE; INSERT; COMMIT`
//!   with the ledger's pragmas, for scale.
//!
//! Files live in a temporary directory next to each other. The side-by-side
//! figures with ratios, sync counts, recover and size live in
//! `toolledger-bench` (see README, "Performance").

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use toolledger::ledger::{Begin, CallSpec, Ledger, LedgerConfig};
use toolledger::model::{digest_arguments, JsonLimits, OperationId, ToolCall};

const ARGS: &str =
    r#"{"body":"See the attached figures.","subject":"Quarterly report","to":"ada@example.com"}"#;

/// A JSON object of about 1 KiB with nested values and mixed types.
fn args_1kib() -> String {
    let mut fields = Vec::new();
    let mut i = 0;
    loop {
        fields.push(format!(
            r#""field_{i:02}":{{"amount":{}.{:02},"note":"line {i} of the memo","ok":{}}}"#,
            i * 37,
            i % 100,
            i % 2 == 0
        ));
        let doc = format!("{{{}}}", fields.join(","));
        if doc.len() >= 1024 {
            return doc;
        }
        i += 1;
    }
}

fn bench_ledger(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger =
        Ledger::open(&dir.path().join("bench.db"), LedgerConfig::default()).expect("open ledger");

    // replay: one committed call asked for again and again.
    let op = OperationId::new("bench_op").expect("op id");
    let spec = CallSpec::new(ToolCall::custom("call_0", "send_email", ARGS), 1);
    if let Begin::Execute(t) = ledger.begin(&op, 0, &spec).expect("begin") {
        ledger
            .commit(&t.attempt_id(), r#"{"id":"msg_1"}"#, None)
            .expect("commit");
    }
    c.bench_function("replay", |b| {
        b.iter(|| {
            let answer = ledger.begin(&op, 0, black_box(&spec)).expect("replay");
            assert!(matches!(answer, Begin::Replay(_)));
        })
    });

    // begin of a round of 8 new calls: one IMMEDIATE transaction, one sync.
    let next = AtomicU64::new(0);
    let mut group = c.benchmark_group("durable");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(8));
    group.bench_function("begin_round_of_8", |b| {
        b.iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let op = OperationId::new(format!("round_op_{n}")).expect("op id");
            let specs: Vec<CallSpec> = (0..8u32)
                .map(|p| {
                    let mut call = ToolCall::custom(format!("call_{p}"), "send_email", ARGS);
                    call.position = p;
                    CallSpec::new(call, 1)
                })
                .collect();
            let answers = ledger.begin_round(&op, 0, &specs).expect("begin_round");
            assert_eq!(answers.len(), 8);
        })
    });

    // The floor for one durable commit, same directory and pragmas.
    let conn = rusqlite::Connection::open(dir.path().join("floor.db")).expect("floor");
    conn.execute_batch(
        "PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
         CREATE TABLE calls (id TEXT PRIMARY KEY NOT NULL, args TEXT NOT NULL);",
    )
    .expect("floor schema");
    let mut conn = conn;
    group.bench_function("raw_floor_commit", |b| {
        b.iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .expect("tx");
            tx.prepare_cached("INSERT INTO calls (id, args) VALUES (?1, ?2)")
                .expect("prepare")
                .execute(rusqlite::params![format!("floor_{n}"), ARGS])
                .expect("insert");
            tx.commit().expect("commit");
        })
    });
    group.finish();

    // Canonicalisation + digest of a 1 KiB argument object.
    let big = args_1kib();
    let limits = JsonLimits::default();
    c.bench_function("digest_1kib", |b| {
        b.iter(|| digest_arguments("pay", 1, black_box(&big), &limits).expect("digest"))
    });
}

criterion_group!(benches, bench_ledger);
criterion_main!(benches);
