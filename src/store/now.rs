//! Reads that never wait: for a caller that must not block (an app's main
//! thread) and has somewhere else to go when the store is busy.
//!
//! [`Store::read`] waits for the store's one connection, which another call
//! holds across its commit's fsync, the deadline flush of deferred commits
//! across its own, and a write across SQLite's busy handler (up to the busy
//! timeout) when another connection holds the write lock. The functions
//! here take the connection (and the ledger's keys) only if they are free at
//! this moment and run the read with no busy handler: where [`Store::read`]
//! would wait on anything, they answer `None` at once and the caller takes
//! the path that waits (on a thread that may).

use std::sync::TryLockError;
use std::time::Duration;

use super::{crypt, run_in_transaction, set_busy_timeout, Dao, Error, Result, Store};

impl Store {
    /// [`Store::read`] if it can run at once: `Ok(None)` when another call
    /// holds the store's connection or the ledger's keys (re-keying), or
    /// when SQLite would make the read wait for another connection (it
    /// answers busy at the read's first statement: WAL recovery, a
    /// connection in exclusive locking mode). `f` returns its storage errors
    /// apart (the outer `Result`: a busy one is the `None`) from its own.
    ///
    /// # Errors
    /// [`Error::Suspended`] (the connection is free and closed),
    /// [`Error::Forked`] in a child made by `fork()` (never read through
    /// the parent's connection), [`Error::LockPoisoned`], storage errors
    /// other than busy, and `f`'s.
    pub fn read_now<T, E: From<Error>>(
        &self,
        f: impl FnOnce(&Dao<'_>) -> Result<std::result::Result<T, E>>,
    ) -> std::result::Result<Option<T>, E> {
        self.refuse_forked()?;
        let Some(keys) = self.keys_now()? else {
            return Ok(None);
        };
        let guard = match self.conn.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Poisoned(_)) => return Err(Error::LockPoisoned.into()),
        };
        let open = guard.as_ref().ok_or(Error::Suspended)?;
        open.conn
            .busy_timeout(Duration::ZERO)
            .map_err(Error::from)?;
        let out = run_in_transaction(&open.conn, "BEGIN DEFERRED", keys.as_deref(), false, f);
        // The transaction has ended (committed or rolled back) either way.
        set_busy_timeout(&open.conn, &self.options)?;
        match out {
            Ok((Ok(value), _)) => Ok(Some(value)),
            Ok((Err(e), _)) => Err(e),
            Err(Error::Busy) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The ledger's keys (`Some(None)`: a plain ledger), or `None` while
    /// [`Store::reseal`] holds them.
    fn keys_now(&self) -> Result<Option<Option<std::sync::Arc<crypt::Keys>>>> {
        match self.keys.try_read() {
            Ok(keys) => Ok(Some(keys.clone())),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Poisoned(_)) => Err(Error::LockPoisoned),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::store::StoreOptions;

    /// Runs `f` on a thread of its own and waits for it at most 10 s, so a
    /// read that wrongly waits fails the test instead of hanging it.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the read waited (or panicked)")
    }

    fn count(store: &Store) -> Result<Option<i64>> {
        store.read_now(|dao| {
            let n = dao
                .tx
                .query_row("SELECT count(*) FROM executions", [], |r| r.get(0))?;
            Ok(Ok(n))
        })
    }

    fn file_store(dir: &tempfile::TempDir, busy: Duration) -> Arc<Store> {
        let options = StoreOptions {
            busy_timeout: busy,
            ..StoreOptions::default()
        };
        Arc::new(Store::open(&dir.path().join("l.db"), options, None).unwrap())
    }

    #[test]
    fn a_held_connection_or_held_keys_answer_none_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = file_store(&dir, Duration::from_secs(30));
        assert_eq!(count(&store).unwrap(), Some(0));

        let held = store.conn.lock().unwrap();
        let other = store.clone();
        assert_eq!(bounded(move || count(&other).unwrap()), None);
        drop(held);
        assert_eq!(count(&store).unwrap(), Some(0));

        let keys = store.keys.write().unwrap();
        let other = store.clone();
        assert_eq!(bounded(move || count(&other).unwrap()), None);
        drop(keys);
        assert_eq!(count(&store).unwrap(), Some(0));
    }

    #[test]
    fn sqlite_never_waits_inside_and_a_busy_read_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = file_store(&dir, Duration::from_secs(30));
        let timeout = |dao: &Dao<'_>| -> Result<i64> {
            Ok(dao.tx.query_row("PRAGMA busy_timeout", [], |r| r.get(0))?)
        };
        // No busy handler while the read runs: where SQLite would make a
        // reader wait (WAL recovery, an exclusive-mode connection) it
        // answers busy at once ...
        assert_eq!(
            store
                .read_now(|dao| Ok(Ok::<_, Error>(timeout(dao)?)))
                .unwrap(),
            Some(0)
        );
        // ... and a busy answer is `None`, not an error.
        assert_eq!(
            store
                .read_now(|_| Err::<Result<()>, _>(Error::Busy))
                .unwrap(),
            None
        );
        // The normal timeout is back for every other transaction.
        assert_eq!(store.read(timeout).unwrap(), 30_000);
    }

    #[test]
    fn a_suspended_store_is_suspended_and_errors_of_f_are_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = file_store(&dir, Duration::from_secs(5));
        let mine = store.read_now(|_| Ok(Err::<(), _>(Error::InvalidData("mine".into()))));
        assert!(matches!(mine, Err(Error::InvalidData(m)) if m == "mine"));
        store.suspend().unwrap();
        assert!(matches!(count(&store), Err(Error::Suspended)));
    }
}
