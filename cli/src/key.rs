//! The key of an encrypted ledger, for every command: from the environment,
//! never from the command line (argv is visible to every process of the
//! machine and lands in shell histories).
//!
//! - `TOOLLEDGER_KEY`: the 32-byte key as 64 hex digits;
//! - `TOOLLEDGER_KEY_FILE`: a file holding the key as 32 raw bytes or 64 hex
//!   digits (a trailing newline is fine); it should be readable by its owner
//!   only.
//!
//! Neither set: the ledger is opened without a key (an encrypted one is
//! then refused with a typed error that says a key is needed).

use std::path::Path;

use toolledger::ledger::LedgerKey;

use crate::{CliError, CliResult};

/// The environment variable holding the key as hex.
pub const KEY_VAR: &str = "TOOLLEDGER_KEY";
/// The environment variable naming a file that holds the key.
pub const KEY_FILE_VAR: &str = "TOOLLEDGER_KEY_FILE";

/// The key given through the environment, if any.
///
/// # Errors
/// A malformed key (the message never shows it); an unreadable key file.
pub fn from_env() -> CliResult<Option<LedgerKey>> {
    if let Some(hex) = std::env::var_os(KEY_VAR) {
        let text = hex.to_str().map(str::trim).unwrap_or_default();
        return parse_hex(text.as_bytes())
            .map(Some)
            .ok_or_else(|| CliError::Other(format!("{KEY_VAR} must be 64 hex digits")));
    }
    if let Some(path) = std::env::var_os(KEY_FILE_VAR) {
        let bytes = std::fs::read(Path::new(&path))?;
        if bytes.len() == LedgerKey::LEN {
            return LedgerKey::from_bytes(&bytes)
                .map(Some)
                .map_err(|e| CliError::Ledger(e.into()));
        }
        let trimmed = bytes.trim_ascii();
        return parse_hex(trimmed).map(Some).ok_or_else(|| {
            CliError::Other(format!(
                "{KEY_FILE_VAR} must name a file of 32 raw bytes or 64 hex digits"
            ))
        });
    }
    Ok(None)
}

fn parse_hex(text: &[u8]) -> Option<LedgerKey> {
    if text.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes: Option<Vec<u8>> = text
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect();
    LedgerKey::from_bytes(&bytes?).ok()
}
