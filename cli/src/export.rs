//! `toolledger export <db>`: every execution as one JSON line.
//!
//! Without `--show-args` a line carries ids, tool, status, attempts, flags and
//! times, never values: no arguments, no result, no external id, no reason.
//! With `--show-args` it adds `args` and `result` (the stored JSON, numbers
//! byte for byte), `external_id` and `reason`, for someone who is allowed to see them. Lines go to stdout or to
//! `--out <file>`; progress and the summary go to stderr.
//!
//! The file is opened read-only and never written (an older schema is read
//! from a migrated copy). The store is read page by page (500 rows per read transaction), so a large
//! database neither holds a long read snapshot nor sits in memory at once.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use toolledger::ledger::{private_file, PageCursor};
use toolledger::model::ExecutionRecord;

use crate::args::ExportArgs;
use crate::maintenance::open_for_reading;
use crate::progress::Progress;
use crate::{CliError, CliResult};

const PAGE: u32 = 500;

/// Runs `export`.
///
/// # Errors
/// A missing file; the store's typed errors; I/O errors of the output.
pub fn run(args: &ExportArgs) -> CliResult<()> {
    if let Some(out) = &args.out {
        refuse_ledger_files(&args.db.db, out)?;
    }
    let reading = open_for_reading(&args.db.db)?;
    let inspector = reading.inspector();
    let total = inspector.execution_count()?;
    let mut out: Box<dyn Write> = match &args.out {
        // Readable by the owner only, whatever the umask: it may hold values.
        Some(path) => Box::new(BufWriter::new(private_file(path)?)),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let mut bar = Progress::new("export", total);
    let mut cursor = PageCursor::default();
    let mut written = 0u64;
    loop {
        let (page, next) = inspector.executions_page(cursor, PAGE)?;
        if page.is_empty() {
            break;
        }
        cursor = next;
        for rec in &page {
            match writeln!(out, "{}", line(rec, args.db.show_args)) {
                Ok(()) => {}
                // `toolledger export db | head`: stop quietly.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            written += 1;
        }
        bar.update(written, total);
        if page.len() < PAGE as usize {
            break;
        }
    }
    match out.flush() {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    bar.finish(written);
    let target = args
        .out
        .as_ref()
        .map_or_else(|| "stdout".to_owned(), |p| p.display().to_string());
    eprintln!(
        "export: {written} execution(s) written to {target}{}",
        if args.db.show_args {
            " (with argument and result values)"
        } else {
            " (no argument or result values; --show-args to include them)"
        }
    );
    Ok(())
}

/// The files SQLite keeps beside a ledger (and the ledger itself): `--out`
/// must name none of them, or opening it (truncating) would destroy
/// records.
const LEDGER_SUFFIXES: [&str; 4] = ["", "-wal", "-shm", "-journal"];

/// Where `path` leads: symlinks followed (also a dangling one, whose target
/// would be created), the parent directory resolved, so two spellings of one
/// file compare equal. `None` when it cannot be resolved (the open will then
/// fail on its own).
fn resolved(path: &Path) -> Option<PathBuf> {
    let mut path = path.to_path_buf();
    // Bounded: the kernel gives up on a chain of 40 links too.
    for _ in 0..40 {
        if let Ok(real) = std::fs::canonicalize(&path) {
            return Some(real);
        }
        match std::fs::read_link(&path) {
            // A dangling link: where its target would be created.
            Ok(target) => {
                path = match path.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            // A file that does not exist yet, in a directory that does.
            Err(_) => {
                let name = path.file_name()?.to_owned();
                let dir = match path.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                return Some(std::fs::canonicalize(dir).ok()?.join(name));
            }
        }
    }
    None
}

/// Refuses an `--out` that is the ledger, one of its SQLite files, or the
/// same file under another name (a symlink, a hard link, another spelling).
///
/// # Errors
/// [`CliError::Other`] naming the clash; nothing is opened or written.
fn refuse_ledger_files(db: &Path, out: &Path) -> CliResult<()> {
    let refuse = || {
        Err(CliError::Other(format!(
            "--out {} would overwrite the ledger {} or one of its files; choose another file",
            out.display(),
            db.display()
        )))
    };
    let (Some(db_real), Some(out_real)) = (std::fs::canonicalize(db).ok(), resolved(out)) else {
        // The ledger's own open reports a missing ledger; an unresolvable
        // `--out` fails when it is opened.
        return Ok(());
    };
    for suffix in LEDGER_SUFFIXES {
        let mut name = db_real.as_os_str().to_os_string();
        name.push(suffix);
        let file = PathBuf::from(name);
        if file == out_real || same_file(&file, &out_real) {
            return refuse();
        }
    }
    Ok(())
}

/// True when both paths exist and are one file (device and inode).
#[cfg(unix)]
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_a: &Path, _b: &Path) -> bool {
    false
}

/// Appends stored JSON text (arguments or a result) to `out` as it was
/// stored, numbers byte for byte (`-0`, integers beyond 64 bits, 17-digit
/// doubles: a `serde_json::Value` would rewrite them), with the whitespace
/// between tokens removed so that a line stays one line. Text that is not
/// JSON (not expected: the ledger checks arguments and results) becomes a
/// JSON string; no text becomes `null`.
fn push_stored(out: &mut String, text: Option<&str>) {
    let Some(text) = text else {
        out.push_str("null");
        return;
    };
    // Parsed only to check it is JSON; what is written is `text`.
    if serde_json::from_str::<Value>(text).is_err() {
        out.push_str(&Value::String(text.to_owned()).to_string());
        return;
    }
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
            in_string = c == '"';
        }
    }
}

/// One line of the export: a JSON object (keys sorted), then, with
/// `show_args`, the values with the stored JSON written verbatim.
fn line(r: &ExecutionRecord, show_args: bool) -> String {
    let v = json!({
        "format_version": crate::FORMAT_VERSION,
        "execution_id": r.execution_id.as_str(),
        "operation_id": r.operation_id.as_str(),
        "round": r.round,
        "position": r.position,
        "provider": r.provider.as_str(),
        "provider_call_id": r.provider_call_id,
        "tool": r.tool_name,
        "tool_version": r.tool_version,
        "args_digest": r.args_digest.as_str(),
        "downstream_key": r.downstream_key.as_str(),
        "requires_approval": r.requires_approval,
        "status": r.status.as_str(),
        "attempts": r.attempt_count,
        "retryable": r.retryable,
        "has_result": r.result_json.is_some(),
        "has_external_id": r.external_id.is_some(),
        "compensates": r.compensates.as_ref().map(|c| c.as_str()),
        "created_ms": r.created_ms,
        "updated_ms": r.updated_ms,
    });
    let mut text = v.to_string();
    if show_args && text.ends_with('}') {
        text.pop();
        text.push_str(",\"args\":");
        push_stored(&mut text, Some(&r.args_json));
        text.push_str(",\"result\":");
        push_stored(&mut text, r.result_json.as_deref());
        text.push_str(",\"external_id\":");
        text.push_str(&json!(r.external_id).to_string());
        text.push_str(",\"reason\":");
        text.push_str(&json!(r.last_reason).to_string());
        text.push('}');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::push_stored;

    fn stored(text: &str) -> String {
        let mut out = String::new();
        push_stored(&mut out, Some(text));
        out
    }

    #[test]
    fn stored_json_keeps_its_numbers_and_loses_only_whitespace() {
        assert_eq!(
            stored("{\n  \"p\": 224.18827276432074,\n  \"n\": [-0, 18446744073709551617, 1E+2],\n  \"s\": \"a \\\" b\\\\\"\n}"),
            r#"{"p":224.18827276432074,"n":[-0,18446744073709551617,1E+2],"s":"a \" b\\"}"#
        );
        assert_eq!(stored("not json"), r#""not json""#);
        let mut none = String::new();
        push_stored(&mut none, None);
        assert_eq!(none, "null");
    }
}
