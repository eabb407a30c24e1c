//! Identifiers: newtypes that cannot be mixed up and cannot collide.
//!
//! An [`ExecutionId`] is the unit of idempotency. It is derived by the app from
//! trusted orchestration state (operation, round, provider call id, tool name,
//! tool version), never from anything the model can choose freely, and reads
//! like `op_77:round_3:call_123:send_email:v1`. Each component is escaped
//! (`%` → `%25`, `:` → `%3A`, `#` → `%23`, control characters → `%XX`) so that a
//! `:` inside a component can never make two different calls share an id.
//!
//! A [`DownstreamKey`] is what goes to the remote service as its idempotency
//! key: a pure function of the execution id, so every retry of the same
//! execution sends the same key, and short enough (51 ASCII characters) for
//! services that cap key length at 64.

use std::fmt;

use sha2::{Digest, Sha256};

/// Longest accepted component (operation id, call id, tool name), in bytes.
pub const MAX_COMPONENT_BYTES: usize = 256;

/// Longest execution id accepted anywhere (the one limit: `begin` refuses to
/// derive a longer one, and every later call — through the bindings too —
/// accepts every id `begin` handed out).
pub const MAX_EXECUTION_ID_BYTES: usize = 2048;

/// Room kept under [`MAX_EXECUTION_ID_BYTES`] for a batch item's
/// `#item_<n>` suffix, so that every item id of a valid id is valid too.
const ITEM_SUFFIX_ROOM: usize = 16;

/// The longest id `derive` and `compensation` produce.
const MAX_DERIVED_ID_BYTES: usize = MAX_EXECUTION_ID_BYTES - ITEM_SUFFIX_ROOM;

fn check_derived(id: String) -> Result<ExecutionId, IdError> {
    if id.len() > MAX_DERIVED_ID_BYTES {
        return Err(IdError::TooLong {
            component: "execution id",
            len: id.len(),
            max: MAX_DERIVED_ID_BYTES,
        });
    }
    Ok(ExecutionId(id))
}

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// A component was empty.
    #[error("{component} must not be empty")]
    Empty {
        /// Which component ("operation id", "call id", "tool name" …).
        component: &'static str,
    },
    /// A component was longer than [`MAX_COMPONENT_BYTES`].
    #[error("{component} is {len} bytes, longer than the limit of {max}")]
    TooLong {
        /// Which component.
        component: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A stored or supplied id string is not in the expected form.
    #[error("malformed {component}")]
    Malformed {
        /// Which kind of id.
        component: &'static str,
    },
}

fn check_component(component: &'static str, value: &str, max: usize) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { component });
    }
    if value.len() > max {
        return Err(IdError::TooLong {
            component,
            len: value.len(),
            max,
        });
    }
    Ok(())
}

/// Escapes one id component so it contains no `:`, `#`, `%` (other than as
/// escapes) and no control characters.
fn escape_component(out: &mut String, value: &str) {
    for ch in value.chars() {
        match ch {
            '%' | ':' | '#' => push_escape(out, ch as u32),
            c if c.is_control() && (c as u32) < 0x100 => push_escape(out, c as u32),
            c => out.push(c),
        }
    }
}

fn push_escape(out: &mut String, byte: u32) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[((byte >> 4) & 0xF) as usize] as char);
    out.push(HEX[(byte & 0xF) as usize] as char);
}

macro_rules! string_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Wraps a value read back from the ledger's own storage, which
            /// only ever holds values this module produced and validated.
            pub(crate) fn from_stored(value: String) -> $name {
                $name(value)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_newtype!(
    /// One user-visible conversation turn or workflow, chosen by the app (`op_77`).
    OperationId
);
string_newtype!(
    /// The durable identity of one logical tool call: the unit of idempotency.
    ExecutionId
);
string_newtype!(
    /// SHA-256 (lowercase hex) of the canonical `{args, tool, version}` JSON.
    ArgsDigest
);
string_newtype!(
    /// The idempotency key sent to the downstream service for one execution.
    DownstreamKey
);
string_newtype!(
    /// Identifies one live `Ledger` instance (one process or app extension).
    SessionId
);

impl OperationId {
    /// Validates an app-chosen operation id (1–256 bytes, no control
    /// characters).
    ///
    /// # Errors
    /// [`IdError::Empty`], [`IdError::TooLong`], or [`IdError::Malformed`]
    /// for control characters (NUL, newlines …).
    pub fn new(value: impl Into<String>) -> Result<OperationId, IdError> {
        let value = value.into();
        check_component("operation id", &value, MAX_COMPONENT_BYTES)?;
        if value.contains(char::is_control) {
            return Err(IdError::Malformed {
                component: "operation id",
            });
        }
        Ok(OperationId(value))
    }

    /// The half-open range `[start, end)` holding exactly the ids of this
    /// operation's executions (compensations included): every such id starts
    /// with the escaped operation id and `:`, and an escaped component never
    /// contains `:`, so no other operation's ids fall inside.
    pub fn execution_id_range(&self) -> (String, String) {
        let mut start = String::with_capacity(self.0.len() + 1);
        escape_component(&mut start, &self.0);
        let mut end = start.clone();
        start.push(':');
        // The character after ':' in code point (and byte) order.
        end.push(';');
        (start, end)
    }
}

/// The components an [`ExecutionId`] is derived from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionIdParts<'a> {
    /// The operation (conversation turn / workflow).
    pub operation: &'a OperationId,
    /// The model response within the operation, from 0.
    pub round: u32,
    /// The provider's call id (or one derived from round and position).
    pub call_id: &'a str,
    /// The tool name.
    pub tool_name: &'a str,
    /// The tool's version: a changed tool contract gets a new identity.
    pub tool_version: u32,
}

impl ExecutionId {
    /// Derives the id `op:round_N:call:tool:vN`, escaping every component.
    ///
    /// # Errors
    /// [`IdError`] when the call id or tool name is empty or too long.
    pub fn derive(parts: &ExecutionIdParts<'_>) -> Result<ExecutionId, IdError> {
        check_component("call id", parts.call_id, MAX_COMPONENT_BYTES)?;
        check_component("tool name", parts.tool_name, MAX_COMPONENT_BYTES)?;
        let mut id = String::with_capacity(
            parts.operation.0.len() + parts.call_id.len() + parts.tool_name.len() + 24,
        );
        escape_component(&mut id, &parts.operation.0);
        id.push_str(":round_");
        id.push_str(&parts.round.to_string());
        id.push(':');
        escape_component(&mut id, parts.call_id);
        id.push(':');
        escape_component(&mut id, parts.tool_name);
        id.push_str(":v");
        id.push_str(&parts.tool_version.to_string());
        check_derived(id)
    }

    /// The id of a compensation of `original`, performed by the call whose own
    /// id is `own`: `<own>:compensates:<original, escaped>`.
    ///
    /// # Errors
    /// [`IdError::TooLong`] when the result would exceed the id limit.
    pub fn compensation(own: &ExecutionId, original: &ExecutionId) -> Result<ExecutionId, IdError> {
        let mut id = own.0.clone();
        id.push_str(":compensates:");
        escape_component(&mut id, &original.0);
        check_derived(id)
    }

    /// The id of item `index` of an independent batch: `<id>#item_<index>`.
    pub fn batch_item(&self, index: u32) -> ExecutionId {
        ExecutionId(format!("{}#item_{index}", self.0))
    }

    /// Accepts an id previously produced by this module (from the store, or
    /// handed back by the app).
    ///
    /// # Errors
    /// [`IdError::Malformed`] for an empty string, one longer than
    /// [`MAX_EXECUTION_ID_BYTES`] or one with control characters.
    pub fn parse(value: impl Into<String>) -> Result<ExecutionId, IdError> {
        let value = value.into();
        if value.is_empty()
            || value.len() > MAX_EXECUTION_ID_BYTES
            || value.contains(char::is_control)
        {
            return Err(IdError::Malformed {
                component: "execution id",
            });
        }
        Ok(ExecutionId(value))
    }

    /// The downstream idempotency key of this execution: `tl_` followed by 48
    /// lowercase hex characters of SHA-256(id). Deterministic, ASCII, 51 chars.
    pub fn downstream_key(&self) -> DownstreamKey {
        let digest = Sha256::digest(self.0.as_bytes());
        let mut key = String::with_capacity(51);
        key.push_str("tl_");
        push_hex(&mut key, digest.get(..24).unwrap_or(&[]));
        DownstreamKey(key)
    }
}

impl ArgsDigest {
    /// Wraps a stored digest, checking it is 64 lowercase hex characters.
    ///
    /// # Errors
    /// [`IdError::Malformed`] otherwise.
    pub fn parse(value: impl Into<String>) -> Result<ArgsDigest, IdError> {
        let value = value.into();
        if value.len() == 64
            && value
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            Ok(ArgsDigest(value))
        } else {
            Err(IdError::Malformed {
                component: "args digest",
            })
        }
    }

    /// SHA-256 of `bytes` as a digest.
    pub(crate) fn of_bytes(bytes: &[u8]) -> ArgsDigest {
        let mut hex = String::with_capacity(64);
        push_hex(&mut hex, &Sha256::digest(bytes));
        ArgsDigest(hex)
    }
}

impl DownstreamKey {
    /// Wraps a stored key (ASCII, 1–64 characters).
    ///
    /// # Errors
    /// [`IdError::Malformed`] otherwise.
    pub fn parse(value: impl Into<String>) -> Result<DownstreamKey, IdError> {
        let value = value.into();
        if !value.is_empty() && value.len() <= 64 && value.bytes().all(|b| b.is_ascii_graphic()) {
            Ok(DownstreamKey(value))
        } else {
            Err(IdError::Malformed {
                component: "downstream key",
            })
        }
    }
}

impl SessionId {
    /// A fresh session id: 32 hex characters, unique per process start.
    pub fn generate() -> SessionId {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::time::{SystemTime, UNIX_EPOCH};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut hasher = Sha256::new();
        hasher.update(nanos.to_le_bytes());
        hasher.update(std::process::id().to_le_bytes());
        hasher.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        let mut hex = String::with_capacity(32);
        push_hex(&mut hex, hasher.finalize().get(..16).unwrap_or(&[]));
        SessionId(hex)
    }

    /// Wraps a stored session id.
    ///
    /// # Errors
    /// [`IdError::Malformed`] unless it is 1–64 ASCII alphanumerics.
    pub fn parse(value: impl Into<String>) -> Result<SessionId, IdError> {
        let value = value.into();
        if !value.is_empty()
            && value.len() <= 64
            && value.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            Ok(SessionId(value))
        } else {
            Err(IdError::Malformed {
                component: "session id",
            })
        }
    }
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 0xF) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(op: &str, round: u32, call: &str, tool: &str, v: u32) -> ExecutionId {
        ExecutionId::derive(&ExecutionIdParts {
            operation: &OperationId::new(op).unwrap(),
            round,
            call_id: call,
            tool_name: tool,
            tool_version: v,
        })
        .unwrap()
    }

    #[test]
    fn readable_form() {
        assert_eq!(
            id("op_77", 3, "call_123", "send_email", 1).as_str(),
            "op_77:round_3:call_123:send_email:v1"
        );
    }

    #[test]
    fn an_operation_range_holds_its_ids_and_no_other_operations() {
        let op = OperationId::new("a:b").unwrap();
        let (start, end) = op.execution_id_range();
        let inside = |id: &ExecutionId| start.as_str() <= id.as_str() && id.as_str() < end.as_str();
        let own = id("a:b", 7, "c", "t", 1);
        assert!(inside(&own));
        assert!(inside(
            &ExecutionId::compensation(&own, &id("x", 0, "c", "t", 1)).unwrap()
        ));
        for other in ["a", "a:", "a:b:c", "a%3Ab", "a:bc", "a:b;", "a:b%3A"] {
            assert!(!inside(&id(other, 0, "c", "t", 1)), "{other}");
        }
    }

    #[test]
    fn separators_inside_components_cannot_collide() {
        let a = id("op:1", 0, "c", "t", 1);
        let b = id("op", 0, "1:c", "t", 1);
        assert_ne!(a, b);
        assert_eq!(a.as_str(), "op%3A1:round_0:c:t:v1");
        // An escaped-looking literal stays distinct from a real separator.
        assert_ne!(id("a%3Ab", 0, "c", "t", 1), id("a:b", 0, "c", "t", 1));
        assert_ne!(
            id("a", 0, "c#item_1", "t", 1).as_str(),
            "a:round_0:c:t:v1#item_1"
        );
    }

    #[test]
    fn empty_and_long_components_are_refused() {
        assert_eq!(
            OperationId::new(""),
            Err(IdError::Empty {
                component: "operation id"
            })
        );
        let op = OperationId::new("op").unwrap();
        let long = "x".repeat(MAX_COMPONENT_BYTES + 1);
        let err = ExecutionId::derive(&ExecutionIdParts {
            operation: &op,
            round: 0,
            call_id: &long,
            tool_name: "t",
            tool_version: 1,
        });
        assert_eq!(
            err,
            Err(IdError::TooLong {
                component: "call id",
                len: 257,
                max: 256
            })
        );
    }

    #[test]
    fn downstream_key_is_stable_short_ascii() {
        let a = id("op_77", 3, "call_123", "send_email", 1);
        let k1 = a.downstream_key();
        let k2 = ExecutionId::parse(a.as_str()).unwrap().downstream_key();
        assert_eq!(k1, k2);
        assert_eq!(k1.as_str().len(), 51);
        assert!(k1.as_str().is_ascii());
        assert_ne!(
            k1,
            id("op_77", 3, "call_124", "send_email", 1).downstream_key()
        );
        assert_ne!(k1, a.batch_item(0).downstream_key());
    }

    #[test]
    fn compensation_ids_are_linked_and_distinct() {
        let orig = id("op", 1, "c1", "pay", 1);
        let own = id("op", 2, "c9", "refund", 1);
        let comp = ExecutionId::compensation(&own, &orig).unwrap();
        assert_eq!(
            comp.as_str(),
            "op:round_2:c9:refund:v1:compensates:op%3Around_1%3Ac1%3Apay%3Av1"
        );
    }

    #[test]
    fn every_id_begin_can_derive_is_accepted_back() {
        // Components at their limit, full of characters that escape to three
        // bytes: the derived id is refused if it would be too long, and
        // anything derived parses back (as an item id too).
        let worst = ":".repeat(MAX_COMPONENT_BYTES);
        let op = OperationId::new(worst.clone()).unwrap();
        let derived = ExecutionId::derive(&ExecutionIdParts {
            operation: &op,
            round: u32::MAX,
            call_id: &worst,
            tool_name: &worst,
            tool_version: u32::MAX,
        });
        assert!(
            matches!(
                derived,
                Err(IdError::TooLong {
                    component: "execution id",
                    ..
                })
            ),
            "{derived:?}"
        );
        let ok = ExecutionId::derive(&ExecutionIdParts {
            operation: &op,
            round: u32::MAX,
            call_id: &worst,
            tool_name: "t",
            tool_version: u32::MAX,
        })
        .unwrap();
        assert!(ExecutionId::parse(ok.as_str()).is_ok());
        assert!(ExecutionId::parse(ok.batch_item(u32::MAX).as_str()).is_ok());
        // A compensation of a long id is refused, never handed out too long.
        let long = ExecutionId::parse("x".repeat(MAX_DERIVED_ID_BYTES)).unwrap();
        assert!(ExecutionId::compensation(&ok, &long).is_err());
        assert!(ExecutionId::parse("x".repeat(MAX_EXECUTION_ID_BYTES + 1)).is_err());
    }

    #[test]
    fn session_ids_differ() {
        assert_ne!(SessionId::generate(), SessionId::generate());
        assert!(SessionId::parse(SessionId::generate().as_str()).is_ok());
    }
}
