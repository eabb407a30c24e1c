//! The simulated remote service: an "outbox" in its own SQLite file.
//!
//! This is not ledger storage (that SQL lives in `src/store/` only). It stands
//! in for the world outside the device: a mail service and a payment provider.
//! It lives in a separate file, `<db>.outbox`, and never shares a transaction
//! with the ledger, exactly as a real remote would not. Each real-world effect
//! is one row of
//!
//! ```text
//! demo_effects(seq INTEGER PRIMARY KEY, tool, reference, external_id, at_ms)
//! ```
//!
//! where `reference` is the downstream key the ledger handed us. The two
//! services behave differently on purpose:
//!
//! - the mail service honours idempotency keys: a second request with a known
//!   reference returns the stored message instead of sending again;
//! - the payment provider has no idempotency keys, only lookup by reference:
//!   every request charges again.
//!
//! So a protocol bug (a blind retry after an unknown outcome) shows up as a
//! second `pay` row with the same reference: `duplicates` is the number of
//! rows minus the number of distinct references, and must stay 0.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

/// How a simulated service treats a repeated reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedupe {
    /// Idempotency keys: a known reference returns the existing effect.
    ByReference,
    /// None: every request creates a new effect.
    Never,
}

/// What one request did downstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Performed {
    /// The remote's id for the effect.
    pub external_id: String,
    /// True when the remote returned an existing effect instead of a new one.
    pub deduplicated: bool,
}

/// Counts taken from the remote's own records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectCounts {
    /// Rows: real-world effects.
    pub effects: u64,
    /// Distinct references among them.
    pub distinct_references: u64,
}

impl EffectCounts {
    /// Effects beyond the first for the same reference.
    pub fn duplicates(&self) -> u64 {
        self.effects.saturating_sub(self.distinct_references)
    }
}

/// A connection to the simulated remote.
#[derive(Debug)]
pub struct Remote {
    conn: Connection,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Remote {
    /// Opens (creating if needed) the outbox file. Opening also rolls back
    /// any transaction a crashed process left open: that request never
    /// committed at the remote.
    ///
    /// # Errors
    /// SQLite errors.
    pub fn open(path: &Path) -> rusqlite::Result<Remote> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS demo_effects (
                 seq         INTEGER PRIMARY KEY,
                 tool        TEXT NOT NULL,
                 reference   TEXT NOT NULL,
                 external_id TEXT NOT NULL,
                 at_ms       INTEGER NOT NULL
             );
             CREATE INDEX IF NOT EXISTS demo_effects_reference ON demo_effects(reference);",
        )?;
        Ok(Remote { conn })
    }

    /// Serves one request: creates the effect for `reference` in one remote
    /// transaction (or returns the existing one, for a deduping service).
    /// `in_flight` runs after the effect is written and before the remote
    /// commits: the request has arrived but is not yet committed there.
    ///
    /// # Errors
    /// SQLite errors; nothing committed then.
    pub fn perform(
        &mut self,
        tool: &str,
        id_prefix: &str,
        dedupe: Dedupe,
        reference: &str,
        in_flight: impl FnOnce(),
    ) -> rusqlite::Result<Performed> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        if dedupe == Dedupe::ByReference {
            if let Some(existing) = lookup_in(&tx, reference)? {
                in_flight();
                tx.commit()?;
                return Ok(Performed {
                    external_id: existing,
                    deduplicated: true,
                });
            }
        }
        let seq: i64 = tx.query_row(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM demo_effects",
            [],
            |r| r.get(0),
        )?;
        let external_id = format!("{id_prefix}_{seq:04}");
        tx.execute(
            "INSERT INTO demo_effects (seq, tool, reference, external_id, at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            rusqlite::params![seq, tool, reference, external_id, now_ms()],
        )?;
        in_flight();
        tx.commit()?;
        Ok(Performed {
            external_id,
            deduplicated: false,
        })
    }

    /// Looks an effect up by our reference (the downstream key): the
    /// reconciliation query both services offer. Returns its external id.
    ///
    /// # Errors
    /// SQLite errors.
    pub fn lookup(&self, reference: &str) -> rusqlite::Result<Option<String>> {
        lookup_in(&self.conn, reference)
    }

    /// Counts effects and distinct references.
    ///
    /// # Errors
    /// SQLite errors.
    pub fn counts(&self) -> rusqlite::Result<EffectCounts> {
        self.conn.query_row(
            "SELECT count(*), count(DISTINCT reference) FROM demo_effects",
            [],
            |r| {
                Ok(EffectCounts {
                    effects: r.get(0)?,
                    distinct_references: r.get(1)?,
                })
            },
        )
    }
}

fn lookup_in(conn: &Connection, reference: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT external_id FROM demo_effects WHERE reference = ?1 ORDER BY seq LIMIT 1",
        [reference],
        |r| r.get(0),
    )
    .optional()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_remote(name: &str) -> (std::path::PathBuf, Remote) {
        let dir = std::env::temp_dir().join(format!(
            "toolledger-remote-test-{}-{name}-{}",
            std::process::id(),
            now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let remote = Remote::open(&dir.join("outbox")).unwrap();
        (dir, remote)
    }

    #[test]
    fn mail_dedupes_payments_do_not() {
        let (dir, mut remote) = temp_remote("dedupe");
        let a = remote
            .perform("send_email", "msg", Dedupe::ByReference, "k1", || {})
            .unwrap();
        let b = remote
            .perform("send_email", "msg", Dedupe::ByReference, "k1", || {})
            .unwrap();
        assert_eq!(a.external_id, b.external_id);
        assert!(b.deduplicated);
        remote
            .perform("pay", "pay", Dedupe::Never, "k2", || {})
            .unwrap();
        remote
            .perform("pay", "pay", Dedupe::Never, "k2", || {})
            .unwrap();
        let counts = remote.counts().unwrap();
        assert_eq!(counts.effects, 3);
        assert_eq!(counts.duplicates(), 1);
        assert_eq!(remote.lookup("k2").unwrap().as_deref(), Some("pay_0002"));
        assert_eq!(remote.lookup("nope").unwrap(), None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
