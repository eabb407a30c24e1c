//! `toolledger inspect <db>`: what the ledger holds, without what it stores.
//!
//! Lists operations with their status and, per operation, its executions:
//! id, tool, round, status, attempts, whether a result and an external id
//! exist, and the last update time. Argument and result values (and the
//! external ids themselves) are never printed: they may be personal data,
//! and docs/design.md keeps them out of logs and tooling. A table for people,
//! `--json` for scripts.
//!
//! The file must already exist: inspecting never creates a ledger, and it
//! never writes to the file (it is opened read-only; an older schema is read
//! from a migrated copy). A file that is not a ledger is reported with the
//! library's typed error and left untouched.

use serde_json::{json, Value};
use toolledger::ledger::OperationView;
use toolledger::model::ExecutionRecord;

use crate::args::InspectArgs;
use crate::maintenance::open_for_reading;
use crate::CliResult;

/// Runs `inspect`.
///
/// # Errors
/// [`CliError::Other`] for a missing file; the ledger's typed errors (not a
/// database, corrupt, newer schema …).
pub fn run(args: &InspectArgs) -> CliResult<()> {
    let reading = open_for_reading(&args.db)?;
    let stats = reading.inspector().stats()?;
    let operations = reading.inspector().operations(args.limit)?;
    if args.json {
        let value = json!({
        "format_version": crate::FORMAT_VERSION,
            "database": args.db.display().to_string(),
            "stats": {
                "operations": stats.operations,
                "executions_by_status": stats
                    .executions_by_status
                    .iter()
                    .map(|(s, n)| (s.clone(), json!(n)))
                    .collect::<serde_json::Map<_, _>>(),
                "transitions": stats.transitions,
            },
            "operations": operations.iter().map(operation_json).collect::<Vec<_>>(),
        });
        say!("{value:#}");
    } else {
        say!("ledger {}", args.db.display());
        let by_status = stats
            .executions_by_status
            .iter()
            .map(|(s, n)| format!("{s}={n}"))
            .collect::<Vec<_>>()
            .join(" ");
        say!(
            "operations={} transitions={} executions: {}",
            stats.operations,
            stats.transitions,
            if by_status.is_empty() {
                "none"
            } else {
                &by_status
            }
        );
        for op in &operations {
            say!();
            say!("operation {} ({})", op.id, op.status);
            print_table(&op.executions);
        }
    }
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn operation_json(op: &OperationView) -> Value {
    json!({
        "operation_id": op.id.as_str(),
        "status": op.status.as_str(),
        "executions": op.executions.iter().map(|r| json!({
            "execution_id": r.execution_id.as_str(),
            "tool": r.tool_name,
            "tool_version": r.tool_version,
            "round": r.round,
            "position": r.position,
            "status": r.status.as_str(),
            "attempts": r.attempt_count,
            "requires_approval": r.requires_approval,
            "has_result": r.result_json.is_some(),
            "has_external_id": r.external_id.is_some(),
            "updated_ms": r.updated_ms,
            "updated": format_utc(r.updated_ms),
        })).collect::<Vec<_>>(),
    })
}

fn print_table(executions: &[ExecutionRecord]) {
    if executions.is_empty() {
        say!("  (no executions)");
        return;
    }
    let header = [
        "EXECUTION ID",
        "TOOL",
        "STATUS",
        "ATTEMPTS",
        "RESULT",
        "EXT ID",
        "UPDATED (UTC)",
    ];
    let rows: Vec<[String; 7]> = executions
        .iter()
        .map(|r| {
            [
                r.execution_id.to_string(),
                r.tool_name.clone(),
                r.status.to_string(),
                r.attempt_count.to_string(),
                yes_no(r.result_json.is_some()).to_owned(),
                yes_no(r.external_id.is_some()).to_owned(),
                format_utc(r.updated_ms),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        say!("  {}", padded.join("  ").trim_end());
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub(crate) fn format_utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(format_utc(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
        assert_eq!(format_utc(-1), "1969-12-31T23:59:59.999Z");
    }
}
