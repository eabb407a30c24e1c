//! The conversation stand-in: what the model was given, as JSON lines.
//!
//! Every time a tool result is handed to the model, one line
//! `{"execution_id": …, "result_json": …}` is appended to `<db>.transcript`.
//! A result may be handed over more than once (after a crash, on a reloaded
//! conversation); the ledger promises it is then byte for byte the same.
//! [`Transcript::check`] counts the lines that break that promise.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use toolledger::model::ExecutionId;

use crate::CliResult;

/// The transcript file, open for appending.
#[derive(Debug)]
pub struct Transcript {
    path: PathBuf,
    file: File,
}

/// What [`Transcript::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TranscriptCheck {
    /// Lines (results handed to the model).
    pub entries: usize,
    /// Lines whose result differs from the first one given for the same
    /// execution, plus lines that cannot be read at all.
    pub mismatches: usize,
}

impl Transcript {
    /// Opens (creating if needed) the transcript at `path`.
    ///
    /// # Errors
    /// I/O errors.
    pub fn open(path: &Path) -> CliResult<Transcript> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Transcript {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Records that the model was given `result_json` for `id`. One
    /// `write` of a whole line, so a crash right after leaves it complete.
    ///
    /// # Errors
    /// I/O errors.
    pub fn give(&mut self, id: &ExecutionId, result_json: &str) -> CliResult<()> {
        let mut line = serde_json::json!({
            "execution_id": id.as_str(),
            "result_json": result_json,
        })
        .to_string();
        line.push('\n');
        self.file.write_all(line.as_bytes())?;
        self.file.flush()?;
        Ok(())
    }

    /// Re-reads the whole transcript and counts mismatches.
    ///
    /// # Errors
    /// I/O errors.
    pub fn check(&self) -> CliResult<TranscriptCheck> {
        let text = std::fs::read_to_string(&self.path)?;
        let mut first: HashMap<String, String> = HashMap::new();
        let mut check = TranscriptCheck::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            check.entries += 1;
            let parsed: Option<(String, String)> = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| {
                    Some((
                        v.get("execution_id")?.as_str()?.to_owned(),
                        v.get("result_json")?.as_str()?.to_owned(),
                    ))
                });
            match parsed {
                Some((id, result)) => {
                    let seen = first.entry(id).or_insert_with(|| result.clone());
                    if *seen != result {
                        check.mismatches += 1;
                    }
                }
                None => check.mismatches += 1,
            }
        }
        Ok(check)
    }
}
