//! File modes: everything the ledger (and the CLI) creates is readable by
//! its owner only — the database, its `-wal` and `-shm` 0600, directories
//! 0700 — whatever the process umask.
//!
//! SQLite creates the `-wal` and `-shm` with the mode of the database file
//! (and sets it again when the umask took bits away), so the database is
//! created 0600 before SQLite opens it; an existing file of an older build
//! is tightened at open.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Creates `path` empty and 0600 when it does not exist (SQLite then
/// starts a new database in it). Best effort: SQLite reports what fails.
pub(super) fn prepare_private_db(path: &Path) {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let _ = options.open(path);
}

fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Sets the database, `-wal` and `-shm` to 0600 (files left by older builds
/// or created under a permissive umask). Best effort: a file owned by
/// someone else keeps its mode.
pub(super) fn tighten_db_files(db: &Path) {
    for path in [db.to_path_buf(), sibling(db, "-wal"), sibling(db, "-shm")] {
        let _ = restrict(&path, 0o600);
    }
}

#[cfg(unix)]
fn restrict(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = fs::metadata(path)?;
    if meta.permissions().mode() & 0o777 != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn restrict(_path: &Path, _mode: u32) -> io::Result<()> {
    Ok(())
}

/// Creates (or truncates) a file readable by its owner only (0600, also
/// when it existed with a wider mode): for every file a tool writes
/// beside a ledger (exports, copies).
///
/// # Errors
/// I/O errors.
pub fn private_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let file = options.open(path)?;
    restrict(path, 0o600)?;
    Ok(file)
}

/// Creates a directory (and its parents) accessible by its owner only
/// (0700, set again after the umask).
///
/// # Errors
/// I/O errors.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)?;
    restrict(dir, 0o700)
}
