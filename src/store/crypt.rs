//! Encryption at rest: values sealed one by one before they reach SQLite.
//!
//! The app holds one 32-byte key ([`LedgerKey`], kept in the Keychain or the
//! Android Keystore). It never encrypts a value itself: it wraps two random
//! keys that the ledger generates once, stored in `meta.wrapped_keys`:
//!
//! - the **data key** seals every value that may hold user data (arguments,
//!   results, previews, external ids, reasons, job ids) with
//!   XChaCha20-Poly1305, a random 24-byte nonce per value, and associated data
//!   naming the column and the row (execution id, item or attempt), so a
//!   ciphertext moved to another row or column fails to open;
//! - the **digest key** keys the argument digest: the stored digest is
//!   HMAC-SHA-256 over the plain SHA-256 digest, so a guessed low-entropy
//!   argument ("$50 to A") cannot be confirmed from the file, while the same
//!   call still gets the same digest (replay, conflicts, tombstones).
//!
//! Rotating the app key re-wraps both and seals every value again under a
//! fresh data key; the digest key stays (a tombstone keeps only a digest,
//! which could not be recomputed under a new one). A wrong app key fails to
//! unwrap (the AEAD tag): [`Error::WrongKey`], before anything is written.
//!
//! A sealed value is a BLOB: `0x01`, the data key's 4-byte id, the nonce,
//! the ciphertext and its tag. Plain ledgers keep TEXT; the schema guard of
//! an encrypted ledger refuses TEXT in a sealed column (a writer that does
//! not know the ledger is encrypted).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use super::error::{Error, Result};
use crate::model::ArgsDigest;

/// Format byte of a sealed value.
const VERSION: u8 = 1;
const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 24;
const HEADER_LEN: usize = 1 + KEY_ID_LEN + NONCE_LEN;
/// What `meta.encryption` says of an encrypted ledger.
pub(super) const SCHEME: &str = "xchacha20poly1305+hmac-sha256/v1";

/// The app's key for an encrypted ledger: exactly 32 bytes, from a
/// cryptographic random source, kept by the app (Keychain, Android
/// Keystore). `Debug` never prints it; the bytes are wiped on drop.
#[derive(Clone)]
pub struct LedgerKey(Zeroizing<[u8; 32]>);

impl LedgerKey {
    /// The key length in bytes.
    pub const LEN: usize = 32;

    /// Wraps 32 key bytes.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Result<LedgerKey> {
        let array: [u8; 32] = bytes.try_into().map_err(|_| Error::InvalidKey)?;
        Ok(LedgerKey(Zeroizing::new(array)))
    }

    /// A new random key from the operating system's generator.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the system has no random source.
    pub fn generate() -> Result<LedgerKey> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        getrandom::getrandom(bytes.as_mut()).map_err(|_| Error::InvalidKey)?;
        Ok(LedgerKey(bytes))
    }

    /// The key bytes (to store them in the Keychain / Keystore).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_ref()
    }
}

impl std::fmt::Debug for LedgerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LedgerKey(<redacted>)")
    }
}

/// Which sealed column a value belongs to: part of its associated data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Col {
    Args,
    Result,
    ExternalId,
    Reason,
    History,
    Preview,
    ItemResult,
    ItemExternalId,
    EvidenceResult,
    EvidenceExternalId,
    EvidenceReason,
    JobId,
}

impl Col {
    fn tag(self) -> &'static [u8] {
        match self {
            Col::Args => b"executions.args_json",
            Col::Result => b"executions.result_json",
            Col::ExternalId => b"executions.external_id",
            Col::Reason => b"executions.last_reason",
            Col::History => b"executions.history",
            Col::Preview => b"approvals.preview_json",
            Col::ItemResult => b"batch_items.result_json",
            Col::ItemExternalId => b"batch_items.external_id",
            Col::EvidenceResult => b"evidence.result_json",
            Col::EvidenceExternalId => b"evidence.external_id",
            Col::EvidenceReason => b"evidence.reason",
            Col::JobId => b"jobs.job_id",
        }
    }
}

/// The row a value is bound to: the execution id, and for rows below an
/// execution the item index or attempt number.
#[derive(Debug, Clone, Copy)]
pub(super) struct Row<'a> {
    pub id: &'a str,
    pub extra: Option<i64>,
}

impl<'a> Row<'a> {
    pub fn of(id: &'a str) -> Row<'a> {
        Row { id, extra: None }
    }

    pub fn with(id: &'a str, extra: i64) -> Row<'a> {
        Row {
            id,
            extra: Some(extra),
        }
    }
}

fn aad(col: Col, row: Row<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + row.id.len());
    out.extend_from_slice(b"toolledger/v1\0");
    out.extend_from_slice(col.tag());
    out.push(0);
    out.extend_from_slice(row.id.as_bytes());
    if let Some(extra) = row.extra {
        out.push(0);
        out.extend_from_slice(&extra.to_be_bytes());
    }
    out
}

/// The ledger's unwrapped keys.
pub(crate) struct Keys {
    data: XChaCha20Poly1305,
    data_id: [u8; KEY_ID_LEN],
    digest: Zeroizing<[u8; 32]>,
    /// The `meta.wrapped_keys` text they came from (a reconnect checks the
    /// ledger was not re-keyed meanwhile).
    pub(super) wrapped: String,
    /// The schema version (`PRAGMA schema_version`) at which `wrapped` was
    /// last found stored (`i64::MIN`: not yet): see `reseal::keys_current`.
    pub(super) checked_schema: std::sync::atomic::AtomicI64,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(<redacted>)")
    }
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    getrandom::getrandom(&mut out).map_err(|_| Error::InvalidKey)?;
    Ok(out)
}

fn wrap_aad(ledger_id: &str) -> Vec<u8> {
    let mut aad = b"toolledger wrapped keys/v1\0".to_vec();
    aad.extend_from_slice(ledger_id.as_bytes());
    aad
}

impl Keys {
    /// Wraps the data key (given as bytes), its id and the digest key under
    /// the app key: the text stored in `meta.wrapped_keys`.
    fn wrap_parts(
        app: &LedgerKey,
        ledger_id: &str,
        data: &[u8; 32],
        data_id: &[u8; KEY_ID_LEN],
        digest: &[u8; 32],
    ) -> Result<String> {
        let mut plain = Zeroizing::new(Vec::with_capacity(68));
        plain.extend_from_slice(data);
        plain.extend_from_slice(data_id);
        plain.extend_from_slice(digest);
        let nonce = random::<NONCE_LEN>()?;
        let cipher = XChaCha20Poly1305::new(app.as_bytes().into());
        let sealed = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: &wrap_aad(ledger_id),
                },
            )
            .map_err(|_| Error::InvalidKey)?;
        let mut blob = nonce.to_vec();
        blob.extend_from_slice(&sealed);
        Ok(hex(&blob))
    }

    /// Unwraps `meta.wrapped_keys` with the app key.
    ///
    /// # Errors
    /// [`Error::WrongKey`] when the key does not open them.
    pub fn unwrap(app: &LedgerKey, ledger_id: &str, wrapped: &str) -> Result<Keys> {
        let blob = unhex(wrapped).ok_or(Error::WrongKey)?;
        if blob.len() < NONCE_LEN {
            return Err(Error::WrongKey);
        }
        let (nonce, sealed) = blob.split_at(NONCE_LEN);
        let cipher = XChaCha20Poly1305::new(app.as_bytes().into());
        let plain = Zeroizing::new(
            cipher
                .decrypt(
                    XNonce::from_slice(nonce),
                    Payload {
                        msg: sealed,
                        aad: &wrap_aad(ledger_id),
                    },
                )
                .map_err(|_| Error::WrongKey)?,
        );
        if plain.len() != 32 + KEY_ID_LEN + 32 {
            return Err(Error::WrongKey);
        }
        let mut data_id = [0u8; KEY_ID_LEN];
        data_id.copy_from_slice(&plain[32..32 + KEY_ID_LEN]);
        let mut digest = Zeroizing::new([0u8; 32]);
        digest.copy_from_slice(&plain[32 + KEY_ID_LEN..]);
        Ok(Keys {
            data: XChaCha20Poly1305::new(plain[..32].into()),
            data_id,
            digest,
            wrapped: wrapped.to_owned(),
            checked_schema: std::sync::atomic::AtomicI64::new(i64::MIN),
        })
    }

    /// The keyed digest stored for a plain SHA-256 digest.
    pub fn keyed_digest(&self, plain: &ArgsDigest) -> ArgsDigest {
        keyed_digest(&self.digest, plain)
    }

    /// Seals one value bound to its column and row.
    pub fn seal(&self, col: Col, row: Row<'_>, value: &[u8]) -> Result<Vec<u8>> {
        let nonce = random::<NONCE_LEN>()?;
        let sealed = self
            .data
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: &aad(col, row),
                },
            )
            .map_err(|_| Error::Undecryptable)?;
        let mut out = Vec::with_capacity(HEADER_LEN + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&self.data_id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// Opens one sealed value.
    ///
    /// # Errors
    /// [`Error::Undecryptable`]: another format, another data key, another
    /// row or column (a moved ciphertext), or altered bytes.
    pub fn open(&self, col: Col, row: Row<'_>, sealed: &[u8]) -> Result<String> {
        if sealed.len() < HEADER_LEN
            || sealed[0] != VERSION
            || sealed[1..1 + KEY_ID_LEN] != self.data_id
        {
            return Err(Error::Undecryptable);
        }
        let plain = self
            .data
            .decrypt(
                XNonce::from_slice(&sealed[1 + KEY_ID_LEN..HEADER_LEN]),
                Payload {
                    msg: &sealed[HEADER_LEN..],
                    aad: &aad(col, row),
                },
            )
            .map_err(|_| Error::Undecryptable)?;
        String::from_utf8(plain).map_err(|_| Error::Undecryptable)
    }
}

/// A new set of keys, with the wrapped text to store (`keys.wrapped`).
pub(crate) struct NewKeys {
    pub keys: Keys,
}

impl NewKeys {
    /// Fresh keys (or, with `keep_digest_of`, a fresh data key under the
    /// same digest key) wrapped under `app` for ledger `ledger_id`.
    pub fn make(
        app: &LedgerKey,
        ledger_id: &str,
        keep_digest_of: Option<&Keys>,
    ) -> Result<NewKeys> {
        let data = Zeroizing::new(random::<32>()?);
        let data_id = random::<KEY_ID_LEN>()?;
        let digest = match keep_digest_of {
            Some(old) => old.digest.clone(),
            None => Zeroizing::new(random::<32>()?),
        };
        let wrapped = Keys::wrap_parts(app, ledger_id, &data, &data_id, &digest)?;
        Ok(NewKeys {
            keys: Keys {
                data: XChaCha20Poly1305::new(data.as_ref().into()),
                data_id,
                digest,
                wrapped,
                checked_schema: std::sync::atomic::AtomicI64::new(i64::MIN),
            },
        })
    }
}

fn keyed_digest(key: &[u8; 32], plain: &ArgsDigest) -> ArgsDigest {
    // Only fails for keys HMAC cannot take; any length works for HMAC.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => return plain.clone(),
    };
    mac.update(b"toolledger args digest/v1\0");
    mac.update(plain.as_str().as_bytes());
    ArgsDigest::from_stored(hex(&mac.finalize().into_bytes()))
}

/// Lower-case hex.
pub(super) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Parses lower- or upper-case hex.
pub(super) fn unhex(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    };
    bytes
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> (LedgerKey, NewKeys) {
        let app = LedgerKey::generate().unwrap();
        let made = NewKeys::make(&app, "ledger", None).unwrap();
        (app, made)
    }

    #[test]
    fn a_value_opens_only_in_its_own_row_and_column() {
        let (_, made) = keys();
        let k = &made.keys;
        let sealed = k.seal(Col::Args, Row::of("op:a"), b"secret").unwrap();
        assert_eq!(
            k.open(Col::Args, Row::of("op:a"), &sealed).unwrap(),
            "secret"
        );
        assert!(matches!(
            k.open(Col::Args, Row::of("op:b"), &sealed),
            Err(Error::Undecryptable)
        ));
        assert!(matches!(
            k.open(Col::Result, Row::of("op:a"), &sealed),
            Err(Error::Undecryptable)
        ));
        assert!(matches!(
            k.open(Col::Args, Row::with("op:a", 1), &sealed),
            Err(Error::Undecryptable)
        ));
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(k.open(Col::Args, Row::of("op:a"), &flipped).is_err());
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
    }

    #[test]
    fn the_wrapped_keys_open_with_the_app_key_only() {
        let (app, made) = keys();
        let again = Keys::unwrap(&app, "ledger", &made.keys.wrapped).unwrap();
        let sealed = made.keys.seal(Col::Result, Row::of("x"), b"v").unwrap();
        assert_eq!(again.open(Col::Result, Row::of("x"), &sealed).unwrap(), "v");
        let other = LedgerKey::generate().unwrap();
        assert!(matches!(
            Keys::unwrap(&other, "ledger", &made.keys.wrapped),
            Err(Error::WrongKey)
        ));
        assert!(matches!(
            Keys::unwrap(&app, "another ledger", &made.keys.wrapped),
            Err(Error::WrongKey)
        ));
        assert!(format!("{app:?}").contains("redacted"));
    }

    #[test]
    fn rotation_keeps_the_digest_key_and_changes_the_data_key() {
        let (app, made) = keys();
        let plain = ArgsDigest::parse("a".repeat(64)).unwrap();
        let rotated = NewKeys::make(&app, "ledger", Some(&made.keys)).unwrap();
        assert_eq!(
            made.keys.keyed_digest(&plain),
            rotated.keys.keyed_digest(&plain)
        );
        assert_ne!(made.keys.keyed_digest(&plain), plain);
        let sealed = made.keys.seal(Col::Args, Row::of("x"), b"v").unwrap();
        assert!(rotated.keys.open(Col::Args, Row::of("x"), &sealed).is_err());
        let fresh = keys().1;
        assert_ne!(
            fresh.keys.keyed_digest(&plain),
            made.keys.keyed_digest(&plain)
        );
    }

    #[test]
    fn keys_of_the_wrong_length_are_refused() {
        assert!(matches!(
            LedgerKey::from_bytes(&[0; 16]),
            Err(Error::InvalidKey)
        ));
        assert!(LedgerKey::from_bytes(&[7; 32]).is_ok());
        assert_eq!(
            unhex(&hex(&[0, 1, 254, 255])).unwrap(),
            vec![0, 1, 254, 255]
        );
    }
}
