//! A SQLite VFS for power-cut simulations: every file lives in memory, and
//! every write since a file's last sync is kept apart, so a test can cut the
//! power and decide which of those writes reached the disk.
//!
//! A [`Machine`] is one simulated computer with one disk. Register it
//! ([`Machine::new`]) and open ledgers with `LedgerConfig::sqlite_vfs` set to
//! [`Machine::vfs_name`]. Each file has the bytes that are durable (what its
//! last `xSync` made durable) and the bytes the OS shows (durable plus the
//! writes since). [`Machine::cut_at`] arms a power cut before the n-th
//! mutating operation (write, truncate or sync) from now; from then on every
//! file operation fails, as a dead machine's would. [`Machine::restart`]
//! then builds what the disk holds after the cut from the durable bytes and
//! the writes since the last sync, by a [`Loss`] model: all lost, a prefix
//! kept (a disk that writes in order), any subset kept (one that reorders),
//! or a subset with torn writes (512-byte sectors of one write each old or
//! new, one possibly garbage), as SQLite's own crash tests model a disk.
//! Shared memory (the WAL index) and locks do not survive a restart.
//!
//! What it does not model, and why that is fair to the ledger: creating and
//! deleting a file are durable at once (SQLite syncs the directory after
//! creating a journal, and deletes a WAL only after a checkpoint made its
//! frames durable in the database file); the device is power-safe for
//! overwrites (SQLite's default `SQLITE_POWERSAFE_OVERWRITE`, also the unix
//! VFS's), so a torn write damages only bytes it wrote.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::ffi;

/// How the writes since each file's last sync survive a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// None reaches the disk.
    All,
    /// The first k of them (k drawn per file) reach it, in order.
    Prefix,
    /// Each one reaches it or not, independently (a reordering disk).
    Subset,
    /// Each one reaches it whole, not at all, or torn: each 512-byte
    /// sector of it old or new, one of them possibly garbage.
    Torn,
}

impl Loss {
    /// Every model, for drawing one.
    pub const ALL: [Loss; 4] = [Loss::All, Loss::Prefix, Loss::Subset, Loss::Torn];
}

const SECTOR: usize = 512;

#[derive(Debug, Clone)]
enum Op {
    Write { offset: usize, data: Vec<u8> },
    Truncate(usize),
}

impl Op {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            Op::Write { offset, data } => write_at(bytes, *offset, data),
            Op::Truncate(size) => bytes.truncate(*size),
        }
    }
}

fn write_at(bytes: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if bytes.len() < offset {
        bytes.resize(offset, 0);
    }
    // Copies, never element by element (this runs for every WAL frame, in
    // unoptimised test builds too).
    let overlap = (bytes.len() - offset).min(data.len());
    bytes[offset..offset + overlap].copy_from_slice(&data[..overlap]);
    bytes.extend_from_slice(&data[overlap..]);
}

#[derive(Debug, Default, Clone)]
struct FileData {
    /// What the disk holds for sure.
    durable: Vec<u8>,
    /// What the OS shows: `durable` with `pending` applied.
    current: Vec<u8>,
    /// Writes and truncations since the last sync, in order.
    pending: Vec<Op>,
}

#[derive(Debug, Default)]
struct Shm {
    /// Fixed-size regions (8-byte aligned, as SQLite needs); their
    /// addresses never change once handed out.
    regions: Vec<Box<[u64]>>,
    /// Handles that have it mapped.
    mappers: BTreeSet<u64>,
    /// Per lock slot: the handles holding it shared, and the one holding it
    /// exclusive.
    shared: [BTreeSet<u64>; 8],
    exclusive: [Option<u64>; 8],
}

#[derive(Debug, Default)]
struct Disk {
    files: BTreeMap<String, FileData>,
    shm: BTreeMap<String, Shm>,
    /// Per file: the lock level each open handle holds.
    locks: BTreeMap<String, BTreeMap<u64, c_int>>,
    /// Mutating operations so far.
    ops: u64,
    /// Cut the power before this operation.
    cut_at: Option<u64>,
    /// The power is off: every file operation fails.
    dead: bool,
    syncs: u64,
    /// Syncs per file name.
    file_syncs: BTreeMap<String, u64>,
    /// Syncs per file name and the name of the thread that made them
    /// (`""` for an unnamed thread).
    thread_syncs: BTreeMap<(String, String), u64>,
    next_handle: u64,
    /// Fail the next syncs of the files whose name ends with this suffix
    /// (the count left), the way Linux fails an fsync after a writeback
    /// error: the writes since the file's last sync are dropped (the OS
    /// still shows them, the disk will never get them) and the error is
    /// reported once, so the next sync succeeds.
    fail_syncs: Option<(String, u32)>,
}

impl Disk {
    /// Counts one mutating operation; false when the power goes off first.
    fn mutate(&mut self) -> bool {
        if self.dead {
            return false;
        }
        self.ops += 1;
        if self.cut_at.is_some_and(|at| self.ops >= at) {
            self.dead = true;
            return false;
        }
        true
    }
}

type Shared = Mutex<Disk>;

fn lock(disk: &Shared) -> MutexGuard<'_, Disk> {
    disk.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One simulated machine: a disk behind a registered SQLite VFS.
#[derive(Clone)]
pub struct Machine {
    disk: Arc<Shared>,
    name: String,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine").field("vfs", &self.name).finish()
    }
}

static NEXT_MACHINE: AtomicU64 = AtomicU64::new(0);

impl Machine {
    /// A machine with an empty disk, registered as a VFS of its own name.
    pub fn new() -> Machine {
        let disk = Arc::new(Mutex::new(Disk::default()));
        let name = format!(
            "powerloss-{}-{}",
            std::process::id(),
            NEXT_MACHINE.fetch_add(1, Ordering::Relaxed)
        );
        let c_name = CString::new(name.clone()).expect("no NUL in the name");
        let vfs = Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: c_int::try_from(std::mem::size_of::<VfsFile>()).expect("small"),
            mxPathname: 1024,
            pNext: std::ptr::null_mut(),
            // Both leak on purpose: SQLite keeps a registered VFS for ever.
            zName: c_name.into_raw(),
            pAppData: Arc::into_raw(disk.clone()) as *mut c_void,
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: None,
            xDlError: None,
            xDlSym: None,
            xDlClose: None,
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        });
        // SAFETY: the VFS struct is leaked ('static), as SQLite requires.
        let rc = unsafe { ffi::sqlite3_vfs_register(Box::into_raw(vfs), 0) };
        assert_eq!(rc, ffi::SQLITE_OK, "registering the VFS");
        Machine { disk, name }
    }

    /// The name to open files with (`LedgerConfig::sqlite_vfs`).
    pub fn vfs_name(&self) -> &str {
        &self.name
    }

    /// Mutating operations (writes, truncations, syncs) so far.
    pub fn ops(&self) -> u64 {
        lock(&self.disk).ops
    }

    /// Syncs so far.
    pub fn syncs(&self) -> u64 {
        lock(&self.disk).syncs
    }

    /// Syncs so far of the files whose name ends with `suffix` (`".db"`:
    /// the database file itself, synced by checkpoints).
    pub fn syncs_of(&self, suffix: &str) -> u64 {
        let d = lock(&self.disk);
        d.file_syncs
            .iter()
            .filter(|(name, _)| name.ends_with(suffix))
            .map(|(_, n)| n)
            .sum()
    }

    /// Syncs so far of the files whose name ends with `suffix`, made by the
    /// thread named `thread` (the ledger's background thread is
    /// `toolledger-sync`; a test's own thread is named after the test).
    pub fn syncs_of_by(&self, suffix: &str, thread: &str) -> u64 {
        let d = lock(&self.disk);
        d.thread_syncs
            .iter()
            .filter(|((name, by), _)| name.ends_with(suffix) && by == thread)
            .map(|(_, n)| n)
            .sum()
    }

    /// Bytes written since the last sync, over all files.
    pub fn unsynced_writes(&self) -> usize {
        lock(&self.disk)
            .files
            .values()
            .flat_map(|f| &f.pending)
            .filter(|op| matches!(op, Op::Write { .. }))
            .count()
    }

    /// The durable bytes of the file `name`, if it exists (a template to
    /// start other machines from).
    pub fn durable_file(&self, name: &str) -> Option<Vec<u8>> {
        lock(&self.disk).files.get(name).map(|f| f.durable.clone())
    }

    /// Puts a durable file on the disk (replacing one of that name).
    pub fn put_file(&self, name: &str, bytes: Vec<u8>) {
        lock(&self.disk).files.insert(
            name.to_owned(),
            FileData {
                current: bytes.clone(),
                durable: bytes,
                pending: Vec::new(),
            },
        );
    }

    /// Cuts the power before the `n`-th mutating operation from now (1: the
    /// next one).
    pub fn cut_at(&self, n: u64) {
        let mut d = lock(&self.disk);
        d.cut_at = Some(d.ops + n.max(1));
    }

    /// Makes the next `n` syncs of a file whose name ends with `suffix`
    /// fail (`SQLITE_IOERR_FSYNC`) as a Linux fsync does after a writeback
    /// error: the writes since that file's last sync stay visible but never
    /// reach the disk, and the error is not reported again.
    pub fn fail_syncs_of(&self, suffix: &str, n: u32) {
        lock(&self.disk).fail_syncs = Some((suffix.to_owned(), n));
    }

    /// Failing syncs armed by [`Machine::fail_syncs_of`] not used yet.
    pub fn failing_syncs_left(&self) -> u32 {
        lock(&self.disk).fail_syncs.as_ref().map_or(0, |(_, n)| *n)
    }

    /// Cuts the power now.
    pub fn cut_now(&self) {
        lock(&self.disk).dead = true;
    }

    /// True once the power is off.
    pub fn is_dead(&self) -> bool {
        lock(&self.disk).dead
    }

    /// Powers the machine up again after a cut (or a clean stop, if the power
    /// was on): the disk keeps what `loss` lets survive of the writes since
    /// each file's last sync (`draw(n)` picks a number below `n`), shared
    /// memory and locks are gone. Every connection must be closed first.
    pub fn restart(&self, loss: Loss, draw: &mut dyn FnMut(u64) -> u64) {
        let mut d = lock(&self.disk);
        for file in d.files.values_mut() {
            let mut disk = std::mem::take(&mut file.durable);
            let pending = std::mem::take(&mut file.pending);
            let keep = match loss {
                Loss::Prefix => draw(pending.len() as u64 + 1) as usize,
                _ => 0,
            };
            for (i, op) in pending.iter().enumerate() {
                match loss {
                    Loss::All => {}
                    Loss::Prefix => {
                        if i < keep {
                            op.apply(&mut disk);
                        }
                    }
                    Loss::Subset => {
                        if draw(2) == 0 {
                            op.apply(&mut disk);
                        }
                    }
                    Loss::Torn => match draw(3) {
                        0 => {}
                        1 => op.apply(&mut disk),
                        _ => tear(op, &mut disk, draw),
                    },
                }
            }
            file.current = disk.clone();
            file.durable = disk;
        }
        for shm in d.shm.values_mut() {
            for region in &mut shm.regions {
                region.fill(0);
            }
            shm.mappers.clear();
            shm.shared = Default::default();
            shm.exclusive = [None; 8];
        }
        d.locks.clear();
        d.dead = false;
        d.cut_at = None;
    }
}

impl Default for Machine {
    fn default() -> Self {
        Machine::new()
    }
}

/// A write that reached the disk in part: each of its sectors old or new,
/// and (one time in two) one of them garbage.
fn tear(op: &Op, disk: &mut Vec<u8>, draw: &mut dyn FnMut(u64) -> u64) {
    let Op::Write { offset, data } = op else {
        op.apply(disk);
        return;
    };
    let sectors = data.len().div_ceil(SECTOR).max(1);
    let garbage = (draw(2) == 0).then(|| draw(sectors as u64) as usize);
    for s in 0..sectors {
        let from = s * SECTOR;
        let to = (from + SECTOR).min(data.len());
        if Some(s) == garbage {
            let junk: Vec<u8> = (from..to).map(|_| draw(256) as u8).collect();
            write_at(disk, offset + from, &junk);
        } else if draw(2) == 0 {
            write_at(disk, offset + from, &data[from..to]);
        } else if disk.len() < offset + to {
            // Never written: the file still reaches that far, with zeros.
            disk.resize(offset + to, 0);
        }
    }
}

// ---------------------------------------------------------------------------
// The VFS
// ---------------------------------------------------------------------------

#[repr(C)]
struct VfsFile {
    base: ffi::sqlite3_file,
    disk: *const Shared,
    name: String,
    handle: u64,
    delete_on_close: bool,
}

/// # Safety
/// `vfs` is one registered by [`Machine::new`].
unsafe fn disk_of<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a Shared {
    &*((*vfs).pAppData as *const Shared)
}

/// # Safety
/// `file` was opened by [`x_open`] and not closed.
unsafe fn file_of<'a>(file: *mut ffi::sqlite3_file) -> &'a mut VfsFile {
    &mut *(file as *mut VfsFile)
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let shared = disk_of(vfs);
    let mut d = lock(shared);
    (*file).pMethods = std::ptr::null();
    if d.dead {
        return ffi::SQLITE_CANTOPEN;
    }
    d.next_handle += 1;
    let handle = d.next_handle;
    let name = if z_name.is_null() {
        format!("temp-{handle}")
    } else {
        CStr::from_ptr(z_name).to_string_lossy().into_owned()
    };
    let exists = d.files.contains_key(&name);
    if !exists {
        if flags & ffi::SQLITE_OPEN_CREATE == 0 {
            return ffi::SQLITE_CANTOPEN;
        }
        d.files.insert(name.clone(), FileData::default());
    } else if flags & ffi::SQLITE_OPEN_EXCLUSIVE != 0 {
        return ffi::SQLITE_CANTOPEN;
    }
    d.locks.entry(name.clone()).or_default().insert(handle, 0);
    std::ptr::write(
        file as *mut VfsFile,
        VfsFile {
            base: ffi::sqlite3_file {
                pMethods: &IO_METHODS,
            },
            disk: shared,
            name,
            handle,
            delete_on_close: flags & ffi::SQLITE_OPEN_DELETEONCLOSE != 0,
        },
    );
    if !out_flags.is_null() {
        *out_flags = flags;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    _sync_dir: c_int,
) -> c_int {
    let mut d = lock(disk_of(vfs));
    if d.dead {
        return ffi::SQLITE_IOERR_DELETE;
    }
    let name = CStr::from_ptr(z_name).to_string_lossy();
    d.files.remove(name.as_ref());
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    _flags: c_int,
    res_out: *mut c_int,
) -> c_int {
    let d = lock(disk_of(vfs));
    if d.dead {
        return ffi::SQLITE_IOERR_ACCESS;
    }
    let name = CStr::from_ptr(z_name).to_string_lossy();
    *res_out = c_int::from(d.files.contains_key(name.as_ref()));
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    n_out: c_int,
    z_out: *mut c_char,
) -> c_int {
    let name = CStr::from_ptr(z_name).to_bytes();
    let room = usize::try_from(n_out).unwrap_or(0);
    if name.len() + 1 > room {
        return ffi::SQLITE_CANTOPEN;
    }
    std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), z_out, name.len());
    *z_out.add(name.len()) = 0;
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_randomness(
    _vfs: *mut ffi::sqlite3_vfs,
    n_byte: c_int,
    z_out: *mut c_char,
) -> c_int {
    // Deterministic: nothing in a simulation may depend on the entropy.
    for i in 0..usize::try_from(n_byte).unwrap_or(0) {
        *z_out.add(i) = (i as u8).wrapping_mul(151).wrapping_add(7) as c_char;
    }
    n_byte
}

unsafe extern "C" fn x_sleep(_vfs: *mut ffi::sqlite3_vfs, microseconds: c_int) -> c_int {
    std::thread::sleep(std::time::Duration::from_micros(
        u64::try_from(microseconds).unwrap_or(0),
    ));
    microseconds
}

unsafe extern "C" fn x_current_time(_vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    let mut ms: ffi::sqlite3_int64 = 0;
    x_current_time_int64(std::ptr::null_mut(), &mut ms);
    *out = ms as f64 / 86_400_000.0;
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_current_time_int64(
    _vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    // Julian day number in milliseconds.
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    *out = 210_866_760_000_000 + unix_ms;
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_get_last_error(
    _vfs: *mut ffi::sqlite3_vfs,
    _n: c_int,
    _out: *mut c_char,
) -> c_int {
    0
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file_of(file);
    {
        let mut d = lock(&*f.disk);
        if let Some(locks) = d.locks.get_mut(&f.name) {
            locks.remove(&f.handle);
        }
        if let Some(shm) = d.shm.get_mut(&f.name) {
            release_shm(shm, f.handle);
        }
        if f.delete_on_close {
            d.files.remove(&f.name);
        }
    }
    std::ptr::drop_in_place(&mut f.name);
    (*file).pMethods = std::ptr::null();
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let f = file_of(file);
    let d = lock(&*f.disk);
    if d.dead {
        return ffi::SQLITE_IOERR_READ;
    }
    let amount = usize::try_from(amount).unwrap_or(0);
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let out = std::slice::from_raw_parts_mut(buf.cast::<u8>(), amount);
    let bytes = d.files.get(&f.name).map_or(&[][..], |fd| &fd.current[..]);
    let available = bytes.len().saturating_sub(offset).min(amount);
    if available > 0 {
        out[..available].copy_from_slice(&bytes[offset..offset + available]);
    }
    if available < amount {
        out[available..].fill(0);
        return ffi::SQLITE_IOERR_SHORT_READ;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    if !d.mutate() {
        return ffi::SQLITE_IOERR_WRITE;
    }
    let data = std::slice::from_raw_parts(buf.cast::<u8>(), usize::try_from(amount).unwrap_or(0));
    let offset = usize::try_from(offset).unwrap_or(0);
    let Some(fd) = d.files.get_mut(&f.name) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    write_at(&mut fd.current, offset, data);
    fd.pending.push(Op::Write {
        offset,
        data: data.to_vec(),
    });
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    if !d.mutate() {
        return ffi::SQLITE_IOERR_TRUNCATE;
    }
    let size = usize::try_from(size).unwrap_or(0);
    let Some(fd) = d.files.get_mut(&f.name) else {
        return ffi::SQLITE_IOERR_TRUNCATE;
    };
    fd.current.truncate(size);
    fd.pending.push(Op::Truncate(size));
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    if !d.mutate() {
        return ffi::SQLITE_IOERR_FSYNC;
    }
    d.syncs += 1;
    *d.file_syncs.entry(f.name.clone()).or_default() += 1;
    let by = std::thread::current().name().unwrap_or_default().to_owned();
    *d.thread_syncs.entry((f.name.clone(), by)).or_default() += 1;
    let fail = match &mut d.fail_syncs {
        Some((suffix, n)) if *n > 0 && f.name.ends_with(suffix.as_str()) => {
            *n -= 1;
            true
        }
        _ => false,
    };
    let Some(fd) = d.files.get_mut(&f.name) else {
        return ffi::SQLITE_IOERR_FSYNC;
    };
    if fail {
        // The writeback failed: those pages are clean now, never written.
        fd.pending.clear();
        return ffi::SQLITE_IOERR_FSYNC;
    }
    let pending = std::mem::take(&mut fd.pending);
    for op in &pending {
        op.apply(&mut fd.durable);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    let f = file_of(file);
    let d = lock(&*f.disk);
    if d.dead {
        return ffi::SQLITE_IOERR_FSTAT;
    }
    *size = d
        .files
        .get(&f.name)
        .map_or(0, |fd| fd.current.len() as ffi::sqlite3_int64);
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    if d.dead {
        return ffi::SQLITE_IOERR_LOCK;
    }
    let locks = d.locks.entry(f.name.clone()).or_default();
    let others = locks
        .iter()
        .filter(|(h, _)| **h != f.handle)
        .map(|(_, l)| *l)
        .max()
        .unwrap_or(ffi::SQLITE_LOCK_NONE);
    let mine = locks
        .get(&f.handle)
        .copied()
        .unwrap_or(ffi::SQLITE_LOCK_NONE);
    let granted = match level {
        ffi::SQLITE_LOCK_SHARED => others < ffi::SQLITE_LOCK_PENDING,
        ffi::SQLITE_LOCK_RESERVED => others < ffi::SQLITE_LOCK_RESERVED,
        ffi::SQLITE_LOCK_EXCLUSIVE => others < ffi::SQLITE_LOCK_SHARED,
        _ => true,
    };
    if !granted {
        if level == ffi::SQLITE_LOCK_EXCLUSIVE && mine >= ffi::SQLITE_LOCK_SHARED {
            // Keeps new readers out while the others finish.
            locks.insert(f.handle, mine.max(ffi::SQLITE_LOCK_PENDING));
        }
        return ffi::SQLITE_BUSY;
    }
    locks.insert(f.handle, mine.max(level));
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    let locks = d.locks.entry(f.name.clone()).or_default();
    let mine = locks
        .get(&f.handle)
        .copied()
        .unwrap_or(ffi::SQLITE_LOCK_NONE);
    locks.insert(f.handle, mine.min(level));
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    res_out: *mut c_int,
) -> c_int {
    let f = file_of(file);
    let d = lock(&*f.disk);
    if d.dead {
        return ffi::SQLITE_IOERR_CHECKRESERVEDLOCK;
    }
    *res_out = c_int::from(
        d.locks
            .get(&f.name)
            .is_some_and(|l| l.values().any(|v| *v >= ffi::SQLITE_LOCK_RESERVED)),
    );
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_file_control(
    _file: *mut ffi::sqlite3_file,
    _op: c_int,
    _arg: *mut c_void,
) -> c_int {
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn x_sector_size(_file: *mut ffi::sqlite3_file) -> c_int {
    SECTOR as c_int
}

unsafe extern "C" fn x_device_characteristics(_file: *mut ffi::sqlite3_file) -> c_int {
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    page_size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    *out = std::ptr::null_mut();
    if d.dead {
        return ffi::SQLITE_IOERR_SHMMAP;
    }
    let shm = d.shm.entry(f.name.clone()).or_default();
    if !shm.mappers.contains(&f.handle) {
        if shm.mappers.is_empty() {
            // The first connection to map it starts from a blank index, as
            // the unix VFS truncates the -shm file of a first opener.
            for region in &mut shm.regions {
                region.fill(0);
            }
        }
        shm.mappers.insert(f.handle);
    }
    let page = usize::try_from(page).unwrap_or(0);
    let size = usize::try_from(page_size).unwrap_or(0);
    while shm.regions.len() <= page {
        if extend == 0 {
            return ffi::SQLITE_OK;
        }
        shm.regions
            .push(vec![0u64; size.div_ceil(8)].into_boxed_slice());
    }
    *out = shm.regions[page].as_mut_ptr().cast();
    ffi::SQLITE_OK
}

fn release_shm(shm: &mut Shm, handle: u64) {
    for slot in 0..8 {
        shm.shared[slot].remove(&handle);
        if shm.exclusive[slot] == Some(handle) {
            shm.exclusive[slot] = None;
        }
    }
    shm.mappers.remove(&handle);
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    let dead = d.dead;
    let shm = d.shm.entry(f.name.clone()).or_default();
    let from = usize::try_from(offset).unwrap_or(0).min(8);
    let to = (from + usize::try_from(n).unwrap_or(0)).min(8);
    let me = f.handle;
    if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
        for slot in from..to {
            shm.shared[slot].remove(&me);
            if shm.exclusive[slot] == Some(me) {
                shm.exclusive[slot] = None;
            }
        }
        return ffi::SQLITE_OK;
    }
    if dead {
        return ffi::SQLITE_IOERR_SHMLOCK;
    }
    let exclusive = flags & ffi::SQLITE_SHM_EXCLUSIVE != 0;
    for slot in from..to {
        let other_exclusive = shm.exclusive[slot].is_some_and(|h| h != me);
        let other_shared = shm.shared[slot].iter().any(|h| *h != me);
        if other_exclusive || (exclusive && other_shared) {
            return ffi::SQLITE_BUSY;
        }
    }
    for slot in from..to {
        if exclusive {
            shm.exclusive[slot] = Some(me);
        } else {
            shm.shared[slot].insert(me);
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shm_barrier(_file: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(Ordering::SeqCst);
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    let f = file_of(file);
    let mut d = lock(&*f.disk);
    if let Some(shm) = d.shm.get_mut(&f.name) {
        release_shm(shm, f.handle);
        if delete != 0 && shm.mappers.is_empty() {
            for region in &mut shm.regions {
                region.fill(0);
            }
        }
    }
    ffi::SQLITE_OK
}
