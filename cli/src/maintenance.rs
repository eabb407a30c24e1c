//! `toolledger stats|recover|prune <db>`: looking after a database pulled from
//! a device.
//!
//! - `stats` counts executions per status and per tool, transitions,
//!   tombstones and the file's size (read-only: the file is never written;
//!   see [`open_for_reading`]).
//! - `recover` runs `Ledger::recover` exactly as the app does at start-up
//!   (executing rows of dead sessions become `outcome_unknown`) and lists what
//!   needs attention with the next step for each.
//! - `prune` runs `Ledger::prune` with a progress bar on stderr.
//!
//! Tables for people, `--json` for scripts. Argument and result values are
//! never printed; with `--show-args`, `recover` adds the recorded reasons
//! (which come from tools and could, in a badly written tool, carry data).

use std::path::Path;
use std::process::ExitCode;

use serde_json::{json, Value};
use toolledger::ledger::{
    Inspector, Ledger, LedgerConfig, PruneCutoff, PruneOptions, PruneReport, StorageError,
};

use crate::args::{Cutoff, DbArgs, PruneArgs, RecoverArgs};
use crate::inspect::format_utc;
use crate::progress::Progress;
use crate::{CliError, CliResult};

/// Refuses a path that is not an existing file: the tools never create a
/// ledger.
pub fn existing(db: &Path) -> CliResult<()> {
    if db.is_file() {
        Ok(())
    } else {
        Err(CliError::Other(format!(
            "{}: no such ledger file",
            db.display()
        )))
    }
}

/// A database opened for looking only (`inspect`, `stats`, `export`): the
/// file is never written, and a cleanly closed file gets no `-wal`/`-shm`
/// beside it. A file with an older schema (or one SQLite cannot open
/// read-only, e.g. in a read-only directory without its `-shm`) is read from
/// a migrated copy in a temporary directory, removed afterwards.
pub struct Reading {
    inspector: Inspector,
    /// Holds the migrated copy; dropped after the inspector (field order).
    _scratch: Option<tempfile::TempDir>,
}

impl Reading {
    /// The schema version of the file itself, when it is older than the one
    /// read (a migrated copy).
    pub fn older_schema(&self) -> Option<i64> {
        self.inspector.copied_from_schema()
    }

    /// The read-only view.
    pub fn inspector(&self) -> &Inspector {
        &self.inspector
    }
}

/// Opens `db` to write (recover, prune), with the key from the
/// environment when there is one (`key.rs`).
///
/// # Errors
/// The ledger's typed errors; a malformed key.
fn open_for_writing(db: &Path) -> CliResult<Ledger> {
    let key = crate::key::from_env()?;
    Ok(Ledger::open_with(
        db,
        LedgerConfig::default(),
        std::sync::Arc::new(toolledger::ledger::SystemClock),
        key.as_ref(),
    )?)
}

/// Opens `db` for reading without writing to it (see [`Reading`]).
///
/// # Errors
/// A missing file; the ledger's typed errors (not a database, corrupt,
/// newer schema); I/O errors of the copy.
pub fn open_for_reading(db: &Path) -> CliResult<Reading> {
    use toolledger::ledger::Error as L;
    existing(db)?;
    let key = crate::key::from_env()?;
    match Inspector::open_keyed(db, key.as_ref()) {
        Ok(inspector) => Ok(Reading {
            inspector,
            _scratch: None,
        }),
        Err(L::Store(
            why @ (StorageError::OlderSchema { .. }
            | StorageError::CannotOpen
            | StorageError::ReadOnly),
        )) => {
            let scratch = tempfile::Builder::new()
                .prefix("toolledger-read-")
                .tempdir()?;
            eprintln!(
                "toolledger: note: {} ({why}); reading a migrated copy, the file is left as it is",
                db.display()
            );
            let inspector = Inspector::open_migrated_copy_keyed(db, scratch.path(), key.as_ref())?;
            Ok(Reading {
                inspector,
                _scratch: Some(scratch),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Prints rows as an aligned table, indented by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        say!("  {}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A byte count for people: `1.5 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn wal_bytes(db: &Path) -> u64 {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wal");
    std::fs::metadata(name).map(|m| m.len()).unwrap_or(0)
}

/// Runs `stats`.
///
/// # Errors
/// A missing file; the store's typed errors (not a database, newer schema …).
pub fn stats(args: &DbArgs) -> CliResult<()> {
    let reading = open_for_reading(&args.db)?;
    let summary = reading.inspector().summary()?;
    let (stats, by_tool, tombstones, size, range, version) = (
        &summary.stats,
        &summary.by_tool,
        summary.tombstones,
        &summary.size,
        summary.time_range,
        summary.schema_version,
    );
    let executions: u64 = stats.executions_by_status.iter().map(|(_, n)| n).sum();
    let wal = wal_bytes(&args.db);
    if args.json {
        let value = json!({
        "format_version": crate::FORMAT_VERSION,
            "database": args.db.display().to_string(),
            "schema_version": reading.older_schema().unwrap_or(version),
            "read_from_migrated_copy": reading.older_schema().is_some(),
            "operations": stats.operations,
            "executions": executions,
            "executions_by_status": counts(&stats.executions_by_status),
            "executions_by_tool": counts(by_tool),
            "transitions": stats.transitions,
            "tombstones": tombstones,
            "oldest_created_ms": range.map(|r| r.0),
            "newest_updated_ms": range.map(|r| r.1),
            "file_bytes": size.bytes(),
            "free_bytes": size.freelist_count * size.page_size,
            "page_size": size.page_size,
            "wal_bytes": wal,
        });
        say!("{value:#}");
        return Ok(());
    }
    match reading.older_schema() {
        Some(old) => say!(
            "ledger {} (schema v{old}; read from a copy migrated to v{version})",
            args.db.display()
        ),
        None => say!("ledger {} (schema v{version})", args.db.display()),
    }
    say!(
        "file {} ({} pages of {} B, {} free), wal {}",
        human_bytes(size.bytes()),
        size.page_count,
        size.page_size,
        size.freelist_count,
        human_bytes(wal)
    );
    say!(
        "operations {}  executions {}  transitions {}  tombstones {}",
        stats.operations,
        executions,
        stats.transitions,
        tombstones
    );
    if let Some((oldest, newest)) = range {
        say!(
            "oldest created {}  newest update {}",
            format_utc(oldest),
            format_utc(newest)
        );
    }
    say!();
    let rows: Vec<Vec<String>> = stats
        .executions_by_status
        .iter()
        .map(|(s, n)| vec![s.clone(), n.to_string()])
        .collect();
    table(&["STATUS", "EXECUTIONS"], &rows);
    say!();
    let rows: Vec<Vec<String>> = by_tool
        .iter()
        .map(|(t, n)| vec![t.clone(), n.to_string()])
        .collect();
    table(&["TOOL", "EXECUTIONS"], &rows);
    Ok(())
}

fn counts(pairs: &[(String, u64)]) -> Value {
    Value::Object(pairs.iter().map(|(k, n)| (k.clone(), json!(n))).collect())
}

/// Runs `recover`.
///
/// # Errors
/// A missing file; the ledger's typed errors.
pub fn recover(cmd: &RecoverArgs) -> CliResult<ExitCode> {
    let args = &cmd.db;
    existing(&args.db)?;
    let ledger = open_for_writing(&args.db)?;
    let started = std::time::Instant::now();
    let pending = ledger.recover()?;
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let next: Vec<&str> = pending
        .iter()
        .map(|r| ledger.next_step(r).map(|n| n.as_str()))
        .collect::<Result<_, _>>()?;
    let code = if cmd.exit_code && !pending.is_empty() {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    };
    if args.json {
        let items: Vec<Value> = pending
            .iter()
            .zip(&next)
            .map(|(r, next)| {
                let mut item = json!({
                    "execution_id": r.execution_id.as_str(),
                    "operation_id": r.operation_id.as_str(),
                    "tool": r.tool_name,
                    "status": r.status.as_str(),
                    "attempts": r.attempt_count,
                    "requires_approval": r.requires_approval,
                    "has_result": r.result_json.is_some(),
                    "next": next,
                    "updated_ms": r.updated_ms,
                    "updated": format_utc(r.updated_ms),
                });
                if args.show_args {
                    item["reason"] = json!(r.last_reason);
                }
                item
            })
            .collect();
        let value = json!({
            "format_version": crate::FORMAT_VERSION,
            "database": args.db.display().to_string(),
            "recover_ms": elapsed_ms,
            "needs_attention": pending.len(),
            "executions": items,
        });
        say!("{value:#}");
        return Ok(code);
    }
    say!(
        "recover {}: {} execution(s) need attention ({elapsed_ms:.2} ms)",
        args.db.display(),
        pending.len()
    );
    if pending.is_empty() {
        return Ok(code);
    }
    let mut header = vec![
        "EXECUTION ID",
        "TOOL",
        "STATUS",
        "ATTEMPTS",
        "UPDATED (UTC)",
        "NEXT",
    ];
    if args.show_args {
        header.push("REASON");
    }
    let rows: Vec<Vec<String>> = pending
        .iter()
        .zip(&next)
        .map(|(r, next)| {
            let mut row = vec![
                r.execution_id.to_string(),
                r.tool_name.clone(),
                r.status.to_string(),
                r.attempt_count.to_string(),
                format_utc(r.updated_ms),
                (*next).to_owned(),
            ];
            if args.show_args {
                row.push(r.last_reason.clone().unwrap_or_default());
            }
            row
        })
        .collect();
    table(&header, &rows);
    Ok(code)
}

/// Runs `prune`.
///
/// # Errors
/// A missing file; the ledger's typed errors.
pub fn prune(args: &PruneArgs) -> CliResult<()> {
    existing(&args.db.db)?;
    let ledger = open_for_writing(&args.db.db)?;
    let options = PruneOptions {
        cutoff: match args.cutoff() {
            Cutoff::OlderThan(age) => PruneCutoff::OlderThan(age),
            Cutoff::BeforeMs(ms) => PruneCutoff::BeforeMs(ms),
        },
        keep_tombstones: args.keep_tombstones(),
        batch_size: args.batch,
    };
    let mut bar = Progress::new("prune", 0);
    let mut last = 0;
    let report = ledger.prune_with(&options, &mut |p| {
        last = p.done;
        bar.update(p.done, p.total);
    })?;
    bar.finish(last);
    if args.db.json {
        say!("{:#}", report_json(&args.db.db, &report));
        return Ok(());
    }
    say!(
        "pruned {}: executions updated before {} ({} ms)",
        args.db.db.display(),
        format_utc(report.cutoff_ms),
        report.cutoff_ms
    );
    let rows: Vec<Vec<String>> = [
        ("executions", report.executions),
        ("transitions", report.transitions),
        ("approvals", report.approvals),
        ("batch items", report.batch_items),
        ("jobs", report.jobs),
        ("webhook events", report.webhook_events),
        ("operations", report.operations),
        ("tombstones written", report.tombstones_written),
        ("tombstones removed", report.tombstones_removed),
        ("kept (compensated)", report.kept_for_compensations),
    ]
    .iter()
    .map(|(k, n)| vec![(*k).to_owned(), n.to_string()])
    .collect();
    table(&["DELETED", "ROWS"], &rows);
    say!(
        "file {} -> {}",
        human_bytes(report.bytes_before),
        human_bytes(report.bytes_after)
    );
    Ok(())
}

fn report_json(db: &Path, r: &PruneReport) -> Value {
    json!({
        "format_version": crate::FORMAT_VERSION,
        "database": db.display().to_string(),
        "cutoff_ms": r.cutoff_ms,
        "executions": r.executions,
        "transitions": r.transitions,
        "approvals": r.approvals,
        "batch_items": r.batch_items,
        "jobs": r.jobs,
        "webhook_events": r.webhook_events,
        "operations": r.operations,
        "tombstones_written": r.tombstones_written,
        "tombstones_removed": r.tombstones_removed,
        "kept_for_compensations": r.kept_for_compensations,
        "bytes_before": r.bytes_before,
        "bytes_after": r.bytes_after,
    })
}
