//! SysV IPC objects of the calling thread's IPC namespace: semaphore sets,
//! message queues and shared memory segments, listed, read and made again
//! with the ids they had.
//!
//! Every call acts in the IPC namespace of the calling *thread* (a thread
//! that entered a sandbox's with `setns(CLONE_NEWIPC)` sees the sandbox's
//! objects). The raw syscalls are used with the kernel's 64-bit structures
//! of x86-64 (`struct ipc64_perm`, `semid64_ds`, `msqid64_ds`,
//! `shmid64_ds`; the `IPC_64` flag is implied there), not the C library's:
//!
//! ```text
//! ipc64_perm  (48 bytes): i32 key, u32 uid, gid, cuid, cgid, u32 mode, u16 seq, pad, u64 unused[2]
//! semid64_ds (104): perm, i64 otime, u64 _, i64 ctime, u64 _, u64 nsems (at 80), u64 _[2]
//! msqid64_ds (120): perm, i64 stime, rtime, ctime, u64 cbytes (72), qnum (80), qbytes (88), i32 lspid, lrpid, u64 _[2]
//! shmid64_ds (112): perm, u64 segsz (48), i64 atime, dtime, ctime, i32 cpid, lpid, u64 nattch (88), u64 _[2]
//! ```
//!
//! A set's values are read and written one semaphore at a time
//! (`GETVAL`, `SETVAL`): `GETALL`/`SETALL` use a buffer as long as the set,
//! which a set made again on the same id meanwhile could make too short.
//!
//! Listing: `*_INFO` returns the highest slot in use, and `*_STAT_ANY`
//! (Linux 4.17) on a slot returns the id of the object there (whatever its
//! permissions) and fills its structure; a free slot answers `EINVAL`.
//! A message is read without taking it by `msgrcv(MSG_COPY | IPC_NOWAIT)`,
//! whose type argument is then the message's position in the queue
//! (`CONFIG_CHECKPOINT_RESTORE`). An object gets a chosen id when
//! `kernel/{sem,msg,shm}_next_id` (a sysctl of the namespace) holds it at
//! its creation; the kernel sets it back to -1.
//!
//! Ids (uid, gid, cuid, cgid) are as the calling thread's user namespace
//! sees them.

use std::io;
use std::os::fd::OwnedFd;

const IPC_CREAT: i32 = 0o1000;
const IPC_EXCL: i32 = 0o2000;
const IPC_NOWAIT: i32 = 0o4000;
const IPC_RMID: i32 = 0;
const IPC_SET: i32 = 1;
const IPC_STAT: i32 = 2;
const MSG_NOERROR: i32 = 0o10000;
const GETVAL: i32 = 12;
const SETVAL: i32 = 16;
const SEM_INFO: i32 = 19;
const SEM_STAT_ANY: i32 = 20;
const MSG_INFO: i32 = 12;
const MSG_STAT_ANY: i32 = 13;
const MSG_COPY: i32 = 0o40000;
const SHM_LOCK: i32 = 11;
const SHM_INFO: i32 = 14;
const SHM_STAT_ANY: i32 = 15;
const SHM_RDONLY: i32 = 0o10000;

/// `mode` bit of a segment marked for removal (`IPC_RMID` while attached:
/// it goes with its last detach, its key is private).
pub const SHM_DEST: u32 = 0o1000;
/// `mode` bit of a segment locked in memory (`SHM_LOCK`).
pub const SHM_LOCKED: u32 = 0o2000;

/// Owner and permissions of an object (`ipc64_perm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perm {
    /// Its id.
    pub id: i32,
    /// Its key (0: `IPC_PRIVATE`).
    pub key: i32,
    pub uid: u32,
    pub gid: u32,
    /// Its creator.
    pub cuid: u32,
    pub cgid: u32,
    /// Permission bits and, for a segment, [`SHM_DEST`] and [`SHM_LOCKED`].
    pub mode: u32,
}

/// A semaphore set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreSet {
    pub perm: Perm,
    /// Its semaphores' values.
    pub values: Vec<u16>,
}

/// A message queue (its messages are read with [`messages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queue {
    pub perm: Perm,
    /// Bytes queued.
    pub cbytes: u64,
    /// Messages queued.
    pub qnum: u64,
    /// The most bytes it may hold.
    pub qbytes: u64,
}

/// A shared memory segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub perm: Perm,
    /// Its size (bytes).
    pub size: u64,
    /// Attachments.
    pub nattch: u64,
}

/// A raw syscall's answer: the value, or the error `errno` gives.
fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn perm_of(id: i32, buf: &[u8]) -> Perm {
    let i32_at = |o: usize| i32::from_ne_bytes(buf[o..o + 4].try_into().unwrap_or_default());
    let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap_or_default());
    Perm { id, key: i32_at(0), uid: u32_at(4), gid: u32_at(8), cuid: u32_at(12), cgid: u32_at(16), mode: u32_at(20) }
}

fn u64_at(buf: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(buf[o..o + 8].try_into().unwrap_or_default())
}

/// A `*_ds` buffer, zeroed (large enough for every structure used here).
type Ds = [u8; 128];

/// An `*ctl` call with a structure: `which` is `SYS_semctl` (four
/// arguments, the structure's address in the fourth), `SYS_msgctl` or
/// `SYS_shmctl` (three).
fn ctl(which: libc::c_long, id: i32, cmd: i32, buf: &mut Ds) -> io::Result<libc::c_long> {
    let p = buf.as_mut_ptr();
    // SAFETY: `p` points at a live, writable 128-byte buffer, larger than
    // every structure these commands read or write (at most 120 bytes, and
    // the `*_info` ones 80); the kernel reads or writes within it only for
    // the duration of the call.
    let r = unsafe {
        if which == libc::SYS_semctl { libc::syscall(which, id, 0, cmd, p) } else { libc::syscall(which, id, cmd, p) }
    };
    check(r)
}

/// Which kind of object a call names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Semaphores,
    Queue,
    Segment,
}

impl Kind {
    fn ctl(self) -> libc::c_long {
        match self {
            Kind::Semaphores => libc::SYS_semctl,
            Kind::Queue => libc::SYS_msgctl,
            Kind::Segment => libc::SYS_shmctl,
        }
    }

    /// Its `*_INFO` and `*_STAT_ANY` commands.
    fn listing(self) -> (i32, i32) {
        match self {
            Kind::Semaphores => (SEM_INFO, SEM_STAT_ANY),
            Kind::Queue => (MSG_INFO, MSG_STAT_ANY),
            Kind::Segment => (SHM_INFO, SHM_STAT_ANY),
        }
    }

    /// Its name in the namespace's sysctls (`kernel/<name>_next_id`).
    fn sysctl(self) -> &'static str {
        match self {
            Kind::Semaphores => "sem",
            Kind::Queue => "msg",
            Kind::Segment => "shm",
        }
    }
}

/// Every object of `kind` in the namespace: each slot up to the highest in
/// use (`*_INFO`) is asked (`*_STAT_ANY`), and `read` makes the object of
/// its id and structure (free slots are skipped).
fn list<T>(kind: Kind, mut read: impl FnMut(i32, &Ds) -> io::Result<T>) -> io::Result<Vec<T>> {
    let (info, stat) = kind.listing();
    let mut buf: Ds = [0; 128];
    let highest = ctl(kind.ctl(), 0, info, &mut buf)? as i32;
    let mut out = Vec::new();
    for slot in 0..=highest {
        let mut ds: Ds = [0; 128];
        match ctl(kind.ctl(), slot, stat, &mut ds).and_then(|id| read(id as i32, &ds)) {
            Ok(t) => out.push(t),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EIDRM)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The semaphore sets of the namespace, with their values.
pub fn semaphore_sets() -> io::Result<Vec<SemaphoreSet>> {
    list(Kind::Semaphores, |id, ds| {
        Ok(SemaphoreSet { perm: perm_of(id, ds), values: semaphore_values(id, u64_at(ds, 80) as usize)? })
    })
}

/// The values of the `n` semaphores of set `id`, one call each (`GETVAL`:
/// no buffer sized from an earlier answer, which a set made again on the
/// same id with more semaphores would overrun with `GETALL`).
fn semaphore_values(id: i32, n: usize) -> io::Result<Vec<u16>> {
    (0..n)
        .map(|i| {
            // SAFETY: GETVAL takes no pointer (the fourth argument is unused).
            check(unsafe { libc::syscall(libc::SYS_semctl, id, i as i32, GETVAL, 0) }).map(|v| v as u16)
        })
        .collect()
}

/// The message queues of the namespace.
pub fn queues() -> io::Result<Vec<Queue>> {
    list(Kind::Queue, |id, ds| {
        Ok(Queue { perm: perm_of(id, ds), cbytes: u64_at(ds, 72), qnum: u64_at(ds, 80), qbytes: u64_at(ds, 88) })
    })
}

/// The messages of queue `q` as (type, bytes), in order, read without
/// taking them.
pub fn messages(q: &Queue) -> io::Result<Vec<(i64, Vec<u8>)>> {
    // (No message is larger than the bytes queued.)
    let size = q.cbytes as usize;
    let mut buf = vec![0u8; 8 + size];
    let mut out = Vec::new();
    for n in 0..q.qnum {
        // SAFETY: the buffer holds a `long` type and `size` bytes of text,
        // what msgrcv may write with this size; it lives for the call.
        let got = check(unsafe {
            libc::syscall(libc::SYS_msgrcv, q.perm.id, buf.as_mut_ptr(), size, n as libc::c_long, MSG_COPY | IPC_NOWAIT)
        })? as usize;
        let mtype = i64::from_ne_bytes(buf[0..8].try_into().unwrap_or_default());
        out.push((mtype, buf[8..8 + got.min(size)].to_vec()));
    }
    Ok(out)
}

/// The shared memory segments of the namespace.
pub fn segments() -> io::Result<Vec<Segment>> {
    list(Kind::Segment, |id, ds| Ok(Segment { perm: perm_of(id, ds), size: u64_at(ds, 48), nattch: u64_at(ds, 88) }))
}

/// The file (shmem inode) of segment `id`, opened read-only or read-write:
/// attached for a moment (`shmat`, at an address the kernel picks), its
/// mapping opened through `/proc/self/map_files` (which needs
/// `CAP_SYS_ADMIN`), detached. The descriptor does not count as an
/// attachment. (The attach sets the segment's last attach time and pid.)
pub fn segment_file(id: i32, write: bool) -> io::Result<OwnedFd> {
    let flags = if write { 0 } else { SHM_RDONLY };
    // SAFETY: with a null address the kernel picks a free range for the
    // segment: no memory of this process is replaced. The mapping is only
    // named (its range, in a path), never read or written through, and
    // detached below.
    let at = unsafe { libc::shmat(id, std::ptr::null(), flags) };
    if at as isize == -1 {
        return Err(io::Error::last_os_error());
    }
    let start = at as usize;
    let opened = (|| -> io::Result<OwnedFd> {
        let mut ds: Ds = [0; 128];
        ctl(libc::SYS_shmctl, id, IPC_STAT, &mut ds)?;
        let page = rustix::param::page_size();
        let end = start + (u64_at(&ds, 48) as usize).div_ceil(page).max(1) * page;
        let access = if write { rustix::fs::OFlags::RDWR } else { rustix::fs::OFlags::RDONLY };
        Ok(rustix::fs::open(
            format!("/proc/self/map_files/{start:x}-{end:x}"),
            access | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?)
    })();
    // SAFETY: `at` is the address shmat returned just above, attached by
    // this call and used by nothing else.
    unsafe { libc::shmdt(at) };
    opened
}

/// Make the next object of `kind` get id `id` (-1: the kernel's choice),
/// through the namespace's `kernel/<kind>_next_id`.
pub fn set_next_id(kind: Kind, id: i32) -> io::Result<()> {
    std::fs::write(format!("/proc/sys/kernel/{}_next_id", kind.sysctl()), format!("{id}\n"))
}

/// Make a semaphore set of `n` semaphores with key `key` and permission
/// bits `mode` (a new one: `IPC_EXCL`); its id.
pub fn make_semaphore_set(key: i32, n: usize, mode: u32) -> io::Result<i32> {
    // SAFETY: semget takes no pointer.
    Ok(check(unsafe { libc::syscall(libc::SYS_semget, key, n as i32, IPC_CREAT | IPC_EXCL | (mode & 0o777) as i32) })?
        as i32)
}

/// Set every semaphore of set `id`, one call each (`SETVAL`, the value by
/// value: no buffer the kernel reads as many values from as the set has;
/// a process waiting on it is woken to try again).
pub fn set_semaphore_values(id: i32, values: &[u16]) -> io::Result<()> {
    for (i, &v) in values.iter().enumerate() {
        // SAFETY: SETVAL takes its value in the fourth argument, no pointer.
        check(unsafe { libc::syscall(libc::SYS_semctl, id, i as i32, SETVAL, libc::c_ulong::from(v)) })?;
    }
    Ok(())
}

/// Make a message queue with key `key` and permission bits `mode` (a new
/// one); its id.
pub fn make_queue(key: i32, mode: u32) -> io::Result<i32> {
    // SAFETY: msgget takes no pointer.
    Ok(check(unsafe { libc::syscall(libc::SYS_msgget, key, IPC_CREAT | IPC_EXCL | (mode & 0o777) as i32) })? as i32)
}

/// Queue a message of type `mtype` on queue `id`, without waiting.
pub fn send(id: i32, mtype: i64, text: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(8 + text.len());
    buf.extend_from_slice(&mtype.to_ne_bytes());
    buf.extend_from_slice(text);
    // SAFETY: msgsnd reads a `long` type and `text.len()` bytes through the
    // pointer: `buf` holds exactly that and lives for the call.
    check(unsafe { libc::syscall(libc::SYS_msgsnd, id, buf.as_ptr(), text.len(), IPC_NOWAIT) })?;
    Ok(())
}

/// Take every message off queue `id`.
pub fn drain(id: i32, cbytes: u64) -> io::Result<()> {
    let size = cbytes as usize;
    let mut buf = vec![0u8; 8 + size];
    loop {
        // SAFETY: the buffer holds a `long` and `size` bytes, what msgrcv
        // may write with this size (`MSG_NOERROR` cuts a longer text).
        let r = unsafe { libc::syscall(libc::SYS_msgrcv, id, buf.as_mut_ptr(), size, 0, IPC_NOWAIT | MSG_NOERROR) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::ENOMSG) { Ok(()) } else { Err(e) };
        }
    }
}

/// Make a shared memory segment of `size` bytes with key `key` and
/// permission bits `mode` (a new one); its id.
pub fn make_segment(key: i32, size: u64, mode: u32) -> io::Result<i32> {
    // SAFETY: shmget takes no pointer.
    Ok(check(unsafe { libc::syscall(libc::SYS_shmget, key, size, IPC_CREAT | IPC_EXCL | (mode & 0o777) as i32) })?
        as i32)
}

/// Lock segment `id` in memory (`SHM_LOCK`).
pub fn lock_segment(id: i32) -> io::Result<()> {
    let mut ds: Ds = [0; 128];
    ctl(libc::SYS_shmctl, id, SHM_LOCK, &mut ds).map(drop)
}

/// Set object `id`'s owner and permission bits (`IPC_SET`; for a queue,
/// also the most bytes it holds, `qbytes`: above `kernel.msgmnb` it needs
/// `CAP_SYS_RESOURCE`).
pub fn set_owner(kind: Kind, id: i32, uid: u32, gid: u32, mode: u32, qbytes: Option<u64>) -> io::Result<()> {
    let mut ds: Ds = [0; 128];
    ctl(kind.ctl(), id, IPC_STAT, &mut ds)?;
    ds[4..8].copy_from_slice(&uid.to_ne_bytes());
    ds[8..12].copy_from_slice(&gid.to_ne_bytes());
    ds[20..24].copy_from_slice(&(mode & 0o777).to_ne_bytes());
    if let (Kind::Queue, Some(q)) = (kind, qbytes) {
        ds[88..96].copy_from_slice(&q.to_ne_bytes());
    }
    ctl(kind.ctl(), id, IPC_SET, &mut ds).map(drop)
}

/// Remove object `id` (a segment still attached goes with its last
/// detach).
pub fn remove(kind: Kind, id: i32) -> io::Result<()> {
    let mut ds: Ds = [0; 128];
    ctl(kind.ctl(), id, IPC_RMID, &mut ds).map(drop)
}
