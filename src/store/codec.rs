//! How model values are stored: `ToSql`/`FromSql` for statuses, providers,
//! ids and digests, and the one mapping from an `executions` row to an
//! [`ExecutionRecord`].

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, Type, ValueRef};
use rusqlite::Row;

use super::crypt::{Col, Keys, Row as Bound};
use super::dao::Dao;
use super::error::{Result, SealBroken};

use crate::model::{
    ArgsDigest, DigestScheme, DownstreamKey, ExecutionId, ExecutionRecord, ExecutionStatus,
    Monotonic, OperationId, OperationStatus, Provider, SessionId,
};

/// Text columns holding a name the model parses (`status`, `provider`):
/// stored as the name, read back through the type's own parser; an unknown
/// name is a conversion error, never a default.
macro_rules! named_text {
    ($($ty:ty => $what:literal),* $(,)?) => {$(
        impl ToSql for $ty {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $ty {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                let text = value.as_str()?;
                <$ty>::parse(text).ok_or_else(|| {
                    FromSqlError::Other(format!(concat!("unknown ", $what, " {:?}"), text).into())
                })
            }
        }
    )*};
}

named_text!(
    ExecutionStatus => "execution status",
    OperationStatus => "operation status",
    Provider => "provider",
);

/// Ids and digests: stored as their text, read back as written (the store
/// only ever holds values the model produced and validated).
macro_rules! stored_text {
    ($($ty:ty),* $(,)?) => {$(
        impl ToSql for $ty {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $ty {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                String::column_result(value).map(<$ty>::from_stored)
            }
        }
    )*};
}

stored_text!(
    ExecutionId,
    OperationId,
    SessionId,
    ArgsDigest,
    DownstreamKey
);

/// `digest_scheme`: an integer, `NULL` in rows of schema version 3.
impl ToSql for DigestScheme {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_i64()))
    }
}

impl FromSql for DigestScheme {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        Option::<i64>::column_result(value).map(DigestScheme::from_stored)
    }
}

/// The columns `row_to_record` reads, as a literal so hot queries can be
/// built with `concat!` (no formatting per call).
macro_rules! execution_columns {
    () => {
        "execution_id, operation_id, round, position, provider, \
    provider_call_id, tool_name, tool_version, args_digest, args_json, downstream_key, \
    requires_approval, status, attempt_count, owner_session, unknown_since_ms, external_id, \
    result_json, last_reason, retryable, compensates, created_ms, updated_ms, unknown_boot, \
    partial, digest_scheme"
    };
}
pub(super) use execution_columns;

pub(super) const EXECUTION_COLUMNS: &str = execution_columns!();

/// A value column as bound: TEXT in a plain ledger, a sealed BLOB in an
/// encrypted one.
pub(super) enum Sealed<'v> {
    Text(&'v str),
    Blob(Vec<u8>),
    Null,
}

impl ToSql for Sealed<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Sealed::Text(t) => ToSqlOutput::from(*t),
            Sealed::Blob(b) => ToSqlOutput::from(b.as_slice()),
            Sealed::Null => ToSqlOutput::from(rusqlite::types::Null),
        })
    }
}

impl Dao<'_> {
    /// Seals `value` for column `col` of row `row` (as is in a plain ledger).
    pub(super) fn seal<'v>(
        &self,
        col: Col,
        row: Bound<'_>,
        value: Option<&'v str>,
    ) -> Result<Sealed<'v>> {
        Ok(match (value, self.keys) {
            (None, _) => Sealed::Null,
            (Some(v), None) => Sealed::Text(v),
            (Some(v), Some(keys)) => Sealed::Blob(keys.seal(col, row, v.as_bytes())?),
        })
    }
}

/// Opens a value column read back from row `row`: TEXT in a plain ledger,
/// a sealed BLOB in an encrypted one; anything else is refused.
pub(super) fn unseal(
    keys: Option<&Keys>,
    col: Col,
    row: Bound<'_>,
    value: ValueRef<'_>,
) -> rusqlite::Result<Option<String>> {
    let broken = || rusqlite::Error::FromSqlConversionFailure(0, Type::Blob, Box::new(SealBroken));
    match (value, keys) {
        (ValueRef::Null, _) => Ok(None),
        (ValueRef::Text(_), None) => Ok(Some(String::column_result(value)?)),
        (ValueRef::Blob(b), Some(keys)) => keys.open(col, row, b).map(Some).map_err(|_| broken()),
        _ => Err(broken()),
    }
}

/// [`unseal`] of a column that is never NULL.
pub(super) fn unseal_some(
    keys: Option<&Keys>,
    col: Col,
    row: Bound<'_>,
    value: ValueRef<'_>,
) -> rusqlite::Result<String> {
    unseal(keys, col, row, value)?.ok_or(rusqlite::Error::InvalidColumnType(
        0,
        "sealed value".into(),
        Type::Null,
    ))
}

/// One `executions` row (selected with [`EXECUTION_COLUMNS`] first).
pub(super) fn row_to_record(
    keys: Option<&Keys>,
    row: &Row<'_>,
) -> rusqlite::Result<ExecutionRecord> {
    let execution_id: ExecutionId = row.get(0)?;
    let bound = Bound::of(execution_id.as_str());
    let args_json = unseal_some(keys, Col::Args, bound, row.get_ref(9)?)?;
    let external_id = unseal(keys, Col::ExternalId, bound, row.get_ref(16)?)?;
    let result_json = unseal(keys, Col::Result, bound, row.get_ref(17)?)?;
    let last_reason = unseal(keys, Col::Reason, bound, row.get_ref(18)?)?;
    let unknown_ms: Option<i64> = row.get(15)?;
    let unknown_boot: Option<String> = row.get(23)?;
    let partial: Option<i64> = row.get(24)?;
    Ok(ExecutionRecord {
        execution_id,
        operation_id: row.get(1)?,
        round: row.get(2)?,
        position: row.get(3)?,
        provider: row.get(4)?,
        provider_call_id: row.get(5)?,
        tool_name: row.get(6)?,
        tool_version: row.get(7)?,
        args_digest: row.get(8)?,
        digest_scheme: row.get(25)?,
        args_json,
        downstream_key: row.get(10)?,
        requires_approval: row.get(11)?,
        status: row.get(12)?,
        attempt_count: row.get(13)?,
        owner_session: row.get(14)?,
        unknown_since: unknown_ms.map(|ms| Monotonic::new(unknown_boot.unwrap_or_default(), ms)),
        partial: partial == Some(1),
        external_id,
        result_json,
        last_reason,
        retryable: row.get(19)?,
        compensates: row.get(20)?,
        created_ms: row.get(21)?,
        updated_ms: row.get(22)?,
    })
}
