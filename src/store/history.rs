//! The transition log of an execution (the `history` column, schema
//! version 3 and later): the one place that writes and reads its lines.
//! `Dao::move_status` appends a line in the same UPDATE that changes the
//! status; migration 003 builds the lines of older files with
//! [`fill_from_transitions`]; `Ledger::transitions` parses them back.

use rusqlite::{params, Connection};

use super::error::Result;
use crate::model::{ExecutionId, ExecutionStatus, SessionId, TransitionEntry};

/// One entry of an execution's transition log, as written.
pub(super) struct LogLine<'a> {
    pub at_ms: i64,
    pub transition: &'a str,
    pub from: Option<ExecutionStatus>,
    pub to: ExecutionStatus,
    pub attempt: u32,
    pub session: &'a SessionId,
    pub reason: Option<&'a str>,
}

/// Formats one line of the `history` column (the transition log, schema
/// version 3): `at_ms|transition|from|to|attempt|session[|reason]` and a
/// newline. `from` is empty for the creation of the record; the reason is
/// present only when there is one, with `%`, `|`, CR and LF escaped as
/// `%25 %7C %0D %0A`. Every other field is an integer, a fixed word or an
/// alphanumeric session id, so it needs no escaping.
pub(super) fn history_line(line: &LogLine<'_>) -> String {
    let mut out = String::with_capacity(96);
    push_decimal(&mut out, line.at_ms);
    out.push('|');
    out.push_str(line.transition);
    out.push('|');
    out.push_str(line.from.map_or("", ExecutionStatus::as_str));
    out.push('|');
    out.push_str(line.to.as_str());
    out.push('|');
    push_decimal(&mut out, i64::from(line.attempt));
    out.push('|');
    out.push_str(line.session.as_str());
    if let Some(reason) = line.reason {
        out.push('|');
        out.push_str(&escape_reason(reason));
    }
    out.push('\n');
    out
}

/// Appends `v` in decimal, as `to_string` writes it, without the
/// formatting machinery (three log lines per call).
fn push_decimal(out: &mut String, v: i64) {
    if v < 0 {
        out.push('-');
    }
    let mut n = v.unsigned_abs();
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // `n % 10` is below 10.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // ASCII digits: always UTF-8.
    if let Some(text) = digits.get(at..).and_then(|d| std::str::from_utf8(d).ok()) {
        out.push_str(text);
    }
}

/// Parses a `history` column back into log entries, oldest first.
pub(super) fn parse_history(
    history: &str,
) -> std::result::Result<Vec<TransitionEntry>, &'static str> {
    history
        .split_terminator('\n')
        .map(|line| {
            let mut f = line.splitn(7, '|');
            let mut next = || f.next().ok_or("truncated transition log line");
            let at_ms = next()?.parse().map_err(|_| "bad time in transition log")?;
            let transition = next()?.to_owned();
            let from = match next()? {
                "" => None,
                s => Some(ExecutionStatus::parse(s).ok_or("unknown status in transition log")?),
            };
            let to = ExecutionStatus::parse(next()?).ok_or("unknown status in transition log")?;
            let attempt = next()?
                .parse()
                .map_err(|_| "bad attempt in transition log")?;
            let _session = next()?;
            let reason = f.next().map(unescape_reason);
            Ok(TransitionEntry {
                from,
                to,
                transition,
                attempt,
                reason,
                at_ms,
            })
        })
        .collect()
}

/// Rewrites the reason of every line of a `history` column with `f` (given
/// the reason unescaped, returning the text to store, written escaped):
/// sealing the reasons when a ledger is encrypted or re-keyed.
///
/// # Errors
/// Whatever `f` returns.
pub(super) fn reseal_reasons(
    history: &str,
    mut f: impl FnMut(&str) -> Result<String>,
) -> Result<String> {
    let mut out = String::with_capacity(history.len() * 2);
    for line in history.split_terminator('\n') {
        let mut fields = line.splitn(7, '|');
        let head: Vec<&str> = fields.by_ref().take(6).collect();
        out.push_str(&head.join("|"));
        if let Some(reason) = fields.next() {
            out.push('|');
            out.push_str(&escape_reason(&f(&unescape_reason(reason))?));
        }
        out.push('\n');
    }
    Ok(out)
}

fn escape_reason(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    for ch in reason.chars() {
        match ch {
            '%' => out.push_str("%25"),
            '|' => out.push_str("%7C"),
            '\r' => out.push_str("%0D"),
            '\n' => out.push_str("%0A"),
            c => out.push(c),
        }
    }
    out
}

fn unescape_reason(text: &str) -> String {
    text.replace("%0A", "\n")
        .replace("%0D", "\r")
        .replace("%7C", "|")
        .replace("%25", "%")
}

/// Migration 003's step between its two SQL parts: writes each execution's
/// `history` (in the rebuilt `executions_v3`) from its rows of the version 2
/// `transitions` table, oldest first, with [`history_line`]. Rows naming no
/// execution are left for the second part, which keeps them.
///
/// # Errors
/// Storage errors; a stored status that is not a status name.
pub(super) fn fill_from_transitions(tx: &Connection) -> Result<()> {
    let mut read = tx.prepare(
        "SELECT t.execution_id, t.at_ms, t.transition, t.from_status, t.to_status, t.attempt,
                t.session_id, t.reason
         FROM transitions t JOIN executions_v3 e ON e.execution_id = t.execution_id
         ORDER BY t.execution_id, t.seq",
    )?;
    let mut write = tx.prepare("UPDATE executions_v3 SET history = ?2 WHERE execution_id = ?1")?;
    let mut rows = read.query([])?;
    let mut current: Option<ExecutionId> = None;
    let mut text = String::new();
    while let Some(row) = rows.next()? {
        let id: ExecutionId = row.get(0)?;
        if current.as_ref() != Some(&id) {
            if let Some(done) = current.replace(id) {
                write.execute(params![done, text])?;
            }
            text.clear();
        }
        let transition: String = row.get(2)?;
        let session: SessionId = row.get(6)?;
        let reason: Option<String> = row.get(7)?;
        text.push_str(&history_line(&LogLine {
            at_ms: row.get(1)?,
            transition: &transition,
            from: row.get(3)?,
            to: row.get(4)?,
            attempt: row.get(5)?,
            session: &session,
            reason: reason.as_deref(),
        }));
    }
    if let Some(done) = current {
        write.execute(params![done, text])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_round_trip_every_reason() {
        let session = SessionId::generate();
        let reasons = [
            None,
            Some(""),
            Some("plain"),
            Some("a|b|c"),
            Some("100% sure, %7C is not a pipe, %25 not a percent"),
            Some("line one\nline two\r\n"),
            Some("ünïcødé ✓ |%\n"),
        ];
        let mut history = String::new();
        for (i, reason) in reasons.iter().enumerate() {
            history.push_str(&history_line(&LogLine {
                at_ms: 1_700_000_000_000 + i as i64,
                transition: "fail_before_commit",
                from: (i > 0).then_some(ExecutionStatus::Executing),
                to: ExecutionStatus::FailedBeforeCommit,
                attempt: i as u32,
                session: &session,
                reason: *reason,
            }));
        }
        assert_eq!(
            history.matches('\n').count(),
            reasons.len(),
            "one line each"
        );
        let parsed = parse_history(&history).unwrap();
        assert_eq!(parsed.len(), reasons.len());
        for (i, (entry, reason)) in parsed.iter().zip(reasons).enumerate() {
            assert_eq!(entry.reason.as_deref(), reason, "entry {i}");
            assert_eq!(entry.attempt, i as u32);
            assert_eq!(entry.at_ms, 1_700_000_000_000 + i as i64);
            assert_eq!(entry.from, (i > 0).then_some(ExecutionStatus::Executing));
            assert_eq!(entry.transition, "fail_before_commit");
        }
    }

    #[test]
    fn decimals_are_written_as_to_string_writes_them() {
        for v in [0, 7, 10, 1_700_000_000_000, -1, -90, i64::MAX, i64::MIN] {
            let mut out = String::new();
            push_decimal(&mut out, v);
            assert_eq!(out, v.to_string());
        }
    }

    #[test]
    fn a_damaged_log_is_a_typed_error_not_a_panic() {
        for bad in [
            "x|start||executing|1|s\n",
            "1|start\n",
            "1|start||nope|1|s\n",
            "1|start||executing|-1|s\n",
        ] {
            assert!(parse_history(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_history("").unwrap(), Vec::new());
    }
}
