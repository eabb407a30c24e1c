//! Turning a ledger's keys on, and over: reading the wrapped keys at open,
//! and rewriting every sealed column when a plain ledger is encrypted in
//! place or an encrypted one is re-keyed.
//!
//! The state lives in `meta`: `encryption` (the scheme) and `wrapped_keys`
//! (see `crypt`). An encrypted ledger also carries guard triggers that
//! refuse a value written in the clear (a writer that does not know the
//! ledger is encrypted, e.g. an older build), like the schema's other
//! guards.

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::codec::{unseal, unseal_some, Sealed};
use super::crypt::{hex, unhex, Col, Keys, LedgerKey, NewKeys, Row, SCHEME};
use super::error::{Error, Result};
use super::history::reseal_reasons;
use crate::model::ArgsDigest;

/// The guards of an encrypted ledger: a sealed column never takes TEXT.
const SEALED_GUARDS: &str = "
CREATE TRIGGER IF NOT EXISTS sealed_executions_insert BEFORE INSERT ON executions
WHEN typeof(NEW.args_json) = 'text'
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the ledger is encrypted; a value came in the clear');
END;
CREATE TRIGGER IF NOT EXISTS sealed_executions_update BEFORE UPDATE ON executions
WHEN typeof(NEW.result_json) = 'text' OR typeof(NEW.external_id) = 'text'
  OR typeof(NEW.last_reason) = 'text'
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the ledger is encrypted; a value came in the clear');
END;
CREATE TRIGGER IF NOT EXISTS sealed_approvals BEFORE INSERT ON approvals
WHEN typeof(NEW.preview_json) = 'text'
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the ledger is encrypted; a value came in the clear');
END;
CREATE TRIGGER IF NOT EXISTS sealed_batch_items BEFORE INSERT ON batch_items
WHEN typeof(NEW.result_json) = 'text' OR typeof(NEW.external_id) = 'text'
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the ledger is encrypted; a value came in the clear');
END;
CREATE TRIGGER IF NOT EXISTS sealed_jobs BEFORE INSERT ON jobs
WHEN typeof(NEW.job_id) = 'text'
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the ledger is encrypted; a value came in the clear');
END;
CREATE TRIGGER IF NOT EXISTS sealed_evidence BEFORE INSERT ON evidence
WHEN typeof(NEW.result_json) = 'text' OR typeof(NEW.external_id) = 'text'
  OR typeof(NEW.reason) = 'text'
BEGIN
    SELECT RAISE(ABORT, 'toolledger: the ledger is encrypted; a value came in the clear');
END;
";

pub(super) fn meta_value(conn: &Connection, key: &str) -> Result<Option<String>> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'meta')",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    Ok(conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()?)
}

/// True when the ledger holds nothing yet (a key given to it encrypts it
/// from the start).
fn is_empty(conn: &Connection) -> Result<bool> {
    Ok(conn.query_row(
        "SELECT NOT EXISTS (SELECT 1 FROM executions) AND NOT EXISTS (SELECT 1 FROM tombstones)
            AND NOT EXISTS (SELECT 1 FROM operations)",
        [],
        |r| r.get(0),
    )?)
}

/// The keys a ledger opens with: unwraps `meta.wrapped_keys` with `key`.
/// A writable open of an empty plain ledger with a key encrypts it.
///
/// # Errors
/// [`Error::WrongKey`], [`Error::KeyRequired`], [`Error::NotEncrypted`]
/// (a writable open of a plain ledger that holds records); nothing is
/// written in each case.
pub(super) fn load_keys(
    conn: &Connection,
    ledger_id: Option<&str>,
    key: Option<&LedgerKey>,
    writable: bool,
) -> Result<Option<Keys>> {
    let wrapped = meta_value(conn, "wrapped_keys")?;
    match (wrapped, key) {
        (Some(wrapped), Some(key)) => {
            Keys::unwrap(key, ledger_id.unwrap_or_default(), &wrapped).map(Some)
        }
        (Some(_), None) => Err(Error::KeyRequired),
        (None, None) => Ok(None),
        (None, Some(_)) if !writable => Ok(None),
        (None, Some(key)) => {
            if !is_empty(conn)? {
                return Err(Error::NotEncrypted);
            }
            let fresh = NewKeys::make(key, ledger_id.unwrap_or_default(), None)?;
            let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
            // Another process may have encrypted it meanwhile.
            if let Some(wrapped) = meta_value(&tx, "wrapped_keys")? {
                return Keys::unwrap(key, ledger_id.unwrap_or_default(), &wrapped).map(Some);
            }
            if !is_empty(&tx)? {
                return Err(Error::NotEncrypted);
            }
            write_keys(&tx, &fresh.keys)?;
            tx.execute_batch(SEALED_GUARDS)?;
            tx.commit()?;
            Ok(Some(fresh.keys))
        }
    }
}

fn write_keys(conn: &Connection, keys: &Keys) -> Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('encryption', ?1), ('wrapped_keys', ?2)",
        params![SCHEME, keys.wrapped],
    )?;
    Ok(())
}

/// Checks that the ledger is still under `keys` (a reconnect after
/// `suspend`: another process may have re-keyed it meanwhile).
///
/// # Errors
/// [`Error::WrongKey`] when it was re-keyed or its encryption changed.
pub(super) fn check_keys(conn: &Connection, keys: Option<&Keys>) -> Result<()> {
    let wrapped = meta_value(conn, "wrapped_keys")?;
    if wrapped.as_deref() == keys.map(|k| k.wrapped.as_str()) {
        Ok(())
    } else if keys.is_none() {
        Err(Error::KeyRequired)
    } else {
        Err(Error::WrongKey)
    }
}

/// Inside a write transaction of an encrypted ledger: `keys` are still the
/// ledger's (no rotation committed since they were loaded). Run on every
/// write of an encrypted ledger, so it reads the schema version first
/// (SQLite keeps it in the header: cheap) and the wrapped keys only when the
/// schema changed since they were last found stored. That is enough because
/// every write of `meta.wrapped_keys` (a rotation, an encryption in place,
/// a new encrypted file) also changes the schema in the same transaction
/// (it creates the sealed-column guards, after dropping the guards of
/// `executions` in a rotation), and a schema version only grows
/// (`encryption_review` races a session against a rotation).
///
/// # Errors
/// [`Error::WrongKey`] when the stored wrapped keys are others (or gone).
pub(super) fn keys_current(conn: &Connection, keys: &Keys) -> Result<()> {
    use std::sync::atomic::Ordering;
    let schema: i64 = conn
        .prepare_cached("PRAGMA schema_version")?
        .query_row([], |r| r.get(0))?;
    if schema == keys.checked_schema.load(Ordering::Relaxed) {
        return Ok(());
    }
    let wrapped: Option<String> = conn
        .prepare_cached("SELECT value FROM meta WHERE key = 'wrapped_keys'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    if wrapped.as_deref() == Some(keys.wrapped.as_str()) {
        keys.checked_schema.store(schema, Ordering::Relaxed);
        Ok(())
    } else {
        Err(Error::WrongKey)
    }
}

/// One value column to rewrite: `(table, column, sealed column)`.
type ValueRewrite = (&'static str, &'static str, Col);

/// Rewrites every sealed column from `old` (plain when `None`) to `new`,
/// keys argument digests (from plain), stores the new wrapped keys and the
/// guards, in one IMMEDIATE transaction with `secure_delete` on.
pub(super) fn reseal_all(conn: &Connection, old: Option<&Keys>, new: &NewKeys) -> Result<()> {
    conn.pragma_update(None, "secure_delete", true)?;
    let done = reseal_in(conn, old, &new.keys);
    let restored = conn.pragma_update(None, "secure_delete", false);
    done?;
    Ok(restored?)
}

fn reseal_in(conn: &Connection, old: Option<&Keys>, new: &Keys) -> Result<()> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    // The schema guards forbid rewriting a committed result and the log;
    // this rewrite keeps every value as it was, so they step aside for it.
    let guards: Vec<(String, String)> = {
        let mut stmt = tx.prepare(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND tbl_name = 'executions'",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (name, _) in &guards {
        tx.execute_batch(&format!("DROP TRIGGER \"{}\"", name.replace('"', "\"\"")))?;
    }
    reseal_executions(&tx, old, new)?;
    let by_execution: [ValueRewrite; 1] = [("jobs", "job_id", Col::JobId)];
    for (table, column, col) in by_execution {
        reseal_simple(&tx, table, column, col, old, new)?;
    }
    reseal_keyed_rows(&tx, old, new)?;
    if old.is_none() {
        key_digests(&tx, new)?;
    }
    write_keys(&tx, new)?;
    for (name, sql) in &guards {
        if !name.starts_with("sealed_") {
            tx.execute_batch(sql)?;
        }
    }
    tx.execute_batch(SEALED_GUARDS)?;
    tx.commit()?;
    Ok(())
}

fn open_text(
    old: Option<&Keys>,
    col: Col,
    row: Row<'_>,
    value: rusqlite::types::ValueRef<'_>,
) -> Result<Option<String>> {
    Ok(unseal(old, col, row, value)?)
}

fn seal<'v>(new: &Keys, col: Col, row: Row<'_>, value: Option<&'v str>) -> Result<Sealed<'v>> {
    Ok(match value {
        None => Sealed::Null,
        Some(v) => Sealed::Blob(new.seal(col, row, v.as_bytes())?),
    })
}

/// The executions, a page of rows at a time (a ledger may hold millions).
fn reseal_executions(tx: &Connection, old: Option<&Keys>, new: &Keys) -> Result<()> {
    const PAGE: i64 = 512;
    let mut cursor = 0i64;
    loop {
        let mut stmt = tx.prepare_cached(
            "SELECT rowid, execution_id, args_json, result_json, external_id, last_reason, history
             FROM executions WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
        )?;
        type Plain = (
            i64,
            String,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            String,
        );
        let rows: Vec<Plain> = stmt
            .query_map(params![cursor, PAGE], |r| {
                let id: String = r.get(1)?;
                let row = Row::of(&id);
                Ok((
                    r.get(0)?,
                    id.clone(),
                    unseal_some(old, Col::Args, row, r.get_ref(2)?)?,
                    unseal(old, Col::Result, row, r.get_ref(3)?)?,
                    unseal(old, Col::ExternalId, row, r.get_ref(4)?)?,
                    unseal(old, Col::Reason, row, r.get_ref(5)?)?,
                    r.get(6)?,
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        drop(stmt);
        let Some(last) = rows.last().map(|r| r.0) else {
            return Ok(());
        };
        for (rowid, id, args, result, external, reason, history) in rows {
            let row = Row::of(&id);
            let history = reseal_reasons(&history, |text| {
                let plain = match old {
                    None => text.to_owned(),
                    Some(old) => {
                        let bytes = unhex(text).ok_or(Error::Undecryptable)?;
                        old.open(Col::History, row, &bytes)?
                    }
                };
                Ok(hex(&new.seal(Col::History, row, plain.as_bytes())?))
            })?;
            tx.prepare_cached(
                "UPDATE executions SET args_json = ?2, result_json = ?3, external_id = ?4,
                    last_reason = ?5, history = ?6 WHERE rowid = ?1",
            )?
            .execute(params![
                rowid,
                seal(new, Col::Args, row, Some(&args))?,
                seal(new, Col::Result, row, result.as_deref())?,
                seal(new, Col::ExternalId, row, external.as_deref())?,
                seal(new, Col::Reason, row, reason.as_deref())?,
                history,
            ])?;
        }
        cursor = last;
    }
}

/// A table keyed by execution id with one sealed column.
fn reseal_simple(
    tx: &Connection,
    table: &str,
    column: &str,
    col: Col,
    old: Option<&Keys>,
    new: &Keys,
) -> Result<()> {
    let rows: Vec<(String, Option<String>)> = {
        let mut stmt = tx.prepare(&format!("SELECT execution_id, {column} FROM {table}"))?;
        let rows = stmt.query_map([], |r| {
            let id: String = r.get(0)?;
            let value = unseal(old, col, Row::of(&id), r.get_ref(1)?)?;
            Ok((id, value))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let sql = format!("UPDATE {table} SET {column} = ?2 WHERE execution_id = ?1");
    for (id, value) in rows {
        tx.execute(
            &sql,
            params![id, seal(new, col, Row::of(&id), value.as_deref())?],
        )?;
    }
    Ok(())
}

/// Approvals (by execution and digest), batch items (by item) and
/// evidence (by attempt).
fn reseal_keyed_rows(tx: &Connection, old: Option<&Keys>, new: &Keys) -> Result<()> {
    let approvals: Vec<(String, String, Option<String>)> = {
        let mut stmt =
            tx.prepare("SELECT execution_id, args_digest, preview_json FROM approvals")?;
        let rows = stmt.query_map([], |r| {
            let id: String = r.get(0)?;
            let preview = open_text(old, Col::Preview, Row::of(&id), r.get_ref(2)?)
                .map_err(|_| sealed_error())?;
            Ok((id, r.get(1)?, preview))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (id, digest, preview) in approvals {
        tx.execute(
            "UPDATE approvals SET preview_json = ?3 WHERE execution_id = ?1 AND args_digest = ?2",
            params![
                id,
                digest,
                seal(new, Col::Preview, Row::of(&id), preview.as_deref())?
            ],
        )?;
    }
    let items: Vec<(String, i64, String, Option<String>)> = {
        let mut stmt = tx.prepare(
            "SELECT execution_id, item_index, result_json, external_id FROM batch_items",
        )?;
        let rows = stmt.query_map([], |r| {
            let id: String = r.get(0)?;
            let index: i64 = r.get(1)?;
            let row = Row::with(&id, index);
            Ok((
                id.clone(),
                index,
                unseal_some(old, Col::ItemResult, row, r.get_ref(2)?)?,
                unseal(old, Col::ItemExternalId, row, r.get_ref(3)?)?,
            ))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (id, index, result, external) in items {
        let row = Row::with(&id, index);
        tx.execute(
            "UPDATE batch_items SET result_json = ?3, external_id = ?4
             WHERE execution_id = ?1 AND item_index = ?2",
            params![
                id,
                index,
                seal(new, Col::ItemResult, row, Some(&result))?,
                seal(new, Col::ItemExternalId, row, external.as_deref())?
            ],
        )?;
    }
    type EvidenceRow = (
        i64,
        String,
        i64,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let evidence: Vec<EvidenceRow> = {
        let mut stmt = tx.prepare(
            "SELECT rowid, execution_id, attempt, result_json, external_id, reason FROM evidence",
        )?;
        let rows = stmt.query_map([], |r| {
            let id: String = r.get(1)?;
            let attempt: i64 = r.get(2)?;
            let row = Row::with(&id, attempt);
            Ok((
                r.get(0)?,
                id.clone(),
                attempt,
                unseal(old, Col::EvidenceResult, row, r.get_ref(3)?)?,
                unseal(old, Col::EvidenceExternalId, row, r.get_ref(4)?)?,
                unseal(old, Col::EvidenceReason, row, r.get_ref(5)?)?,
            ))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (rowid, id, attempt, result, external, reason) in evidence {
        let row = Row::with(&id, attempt);
        tx.execute(
            "UPDATE evidence SET result_json = ?2, external_id = ?3, reason = ?4 WHERE rowid = ?1",
            params![
                rowid,
                seal(new, Col::EvidenceResult, row, result.as_deref())?,
                seal(new, Col::EvidenceExternalId, row, external.as_deref())?,
                seal(new, Col::EvidenceReason, row, reason.as_deref())?
            ],
        )?;
    }
    Ok(())
}

fn sealed_error() -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Blob,
        Box::new(super::error::SealBroken),
    )
}

/// Plain digests become keyed ones: executions, approvals, tombstones.
fn key_digests(tx: &Connection, new: &Keys) -> Result<()> {
    for (table, key) in [
        ("executions", "rowid"),
        ("approvals", "execution_id"),
        ("tombstones", "execution_id"),
    ] {
        let rows: Vec<(rusqlite::types::Value, String)> = {
            let mut stmt = tx.prepare(&format!("SELECT {key}, args_digest FROM {table}"))?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let sql =
            format!("UPDATE {table} SET args_digest = ?3 WHERE {key} = ?1 AND args_digest = ?2");
        for (id, digest) in rows {
            let keyed = new.keyed_digest(&ArgsDigest::from_stored(digest.clone()));
            tx.execute(&sql, params![id, digest, keyed.as_str()])?;
        }
    }
    Ok(())
}

/// After a rewrite: `VACUUM` rebuilds the file from the live rows only
/// (free space inside pages and free pages may still hold bytes of values
/// deleted or rewritten before, in the clear), keeping row ids (every table
/// with row ids has an index, so SQLite copies them as they are); then the
/// WAL, which held the earlier page images, is checkpointed and truncated.
///
/// # Errors
/// [`Error::Busy`] when another connection keeps the checkpoint from
/// completing; storage errors of the vacuum.
pub(super) fn scrub(conn: &Connection, memory: bool) -> Result<()> {
    conn.execute_batch("VACUUM")?;
    let (busy, _, _): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    if busy != 0 && !memory {
        return Err(Error::Busy);
    }
    Ok(())
}
