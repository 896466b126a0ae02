//! Process creation and process-wide state that needs raw syscalls.
//!
//! * [`fork_single_threaded`] / [`clone_namespaces`]: `fork(2)` and a
//!   fork-like raw `clone(2)` with namespace flags. Both refuse to run in a
//!   multi-threaded process (forking a threaded process leaves locks held by
//!   other threads locked forever in the child), which is why Sandtree forks
//!   everything from a dedicated single-threaded zygote.
//! * signal dispositions (`sigaction` is `unsafe` in nix because handlers run
//!   asynchronously; we only ever install `SIG_IGN` / `SIG_DFL`).
//! * [`set_policy`]: `sched_setscheduler`, which rustix does not wrap.
//! * [`act_as_file_owner`]: a thread's filesystem ids (`setfsuid`), which
//!   rustix does not wrap.
//! * [`on_thread_in_namespace`]: work done in another process's namespace
//!   by a short-lived thread that enters it (`setns`).
//! * [`close_fds_except`]: `close_range(2)` around a keep list.
//! * [`copy_limits`]: `prlimit64` of another process, read and set.
//! * [`install_seccomp_filter`]: `seccomp(SECCOMP_SET_MODE_FILTER)` *without*
//!   `PR_SET_NO_NEW_PRIVS`: a task that is root in its own user namespace
//!   holds `CAP_SYS_ADMIN` there, which the kernel accepts instead of NNP.
//!   Not setting NNP keeps setuid binaries (sudo, ping) working inside.
//! * [`replace_command_line`]: `prctl(PR_SET_MM, PR_SET_MM_MAP)` pointing
//!   `/proc/<pid>/cmdline` at a name of our own and `/proc/<pid>/environ`
//!   at nothing, after zeroing the strings the process was started with.

use std::io;
use std::os::fd::RawFd;

/// Run `f` on a thread of its own that first enters namespace `ns` (the
/// file name under `/proc/<pid>/ns/`, of kind `kind`) of process `pid`,
/// and ends after it; the daemon's other threads stay where they are. The
/// outer error: the namespace could not be entered (or the thread
/// panicked).
pub fn on_thread_in_namespace<T: Send, E: Send>(
    pid: i32,
    (ns, kind): (&str, rustix::thread::LinkNameSpaceType),
    f: impl FnOnce() -> std::result::Result<T, E> + Send,
) -> io::Result<std::result::Result<T, E>> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/{ns}"))?;
    on_thread_in(std::os::fd::AsFd::as_fd(&ns), kind, f)
}

/// Like [`on_thread_in_namespace`], for the namespace of kind `kind` that
/// descriptor `ns` names (one no process is in, such as a sandbox's
/// router kept by a descriptor or a mount).
pub fn on_thread_in<T: Send, E: Send>(
    ns: std::os::fd::BorrowedFd<'_>,
    kind: rustix::thread::LinkNameSpaceType,
    f: impl FnOnce() -> std::result::Result<T, E> + Send,
) -> io::Result<std::result::Result<T, E>> {
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(ns, Some(kind))?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the thread in the namespace panicked")))
    })
}
/// Makes the calling thread create files as `uid:gid` (its filesystem
/// ids, `setfsuid`/`setfsgid`) and keep its file capabilities, which a
/// change of the filesystem uid from 0 clears from the effective set
/// (`CAP_CHOWN`, `CAP_FOWNER`, `CAP_DAC_OVERRIDE`, ...): they are raised
/// again from the permitted set. Thread-local, like both calls: for a
/// thread of its own that ends after its work. Used to create files in a
/// file system mounted in a sandbox's user namespace, where a creator
/// whose ids it does not map gets `EOVERFLOW`.
pub fn act_as_file_owner(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: `setfsgid`/`setfsuid` take integers and touch no memory;
    // they return the previous id and never fail (an id refused leaves it
    // as it was, which the read-back below catches).
    let (now_gid, now_uid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        // (-1 is never a valid id: these only read.)
        (libc::syscall(libc::SYS_setfsgid, u32::MAX), libc::syscall(libc::SYS_setfsuid, u32::MAX))
    };
    if (now_uid as u32, now_gid as u32) != (uid, gid) {
        return Err(io::Error::other(format!("filesystem ids stayed {now_uid}:{now_gid}, not {uid}:{gid}")));
    }
    let mut caps = rustix::thread::capabilities(None)?;
    caps.effective = caps.permitted;
    rustix::thread::set_capabilities(None, caps)?;
    Ok(())
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The calling process has more than one thread.
    #[error("refusing to fork: process has {threads} threads")]
    MultiThreaded {
        /// Number of entries in `/proc/self/task`.
        threads: usize,
    },
    /// A syscall failed.
    #[error("{call} failed: {source}")]
    Sys {
        /// The failing call.
        call: &'static str,
        /// The errno.
        source: io::Error,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

fn sys(call: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Sys { call, source }
}

/// Outcome of a fork: which side of it we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// We are the new process.
    Child,
    /// We are the parent; the child has this pid (in the parent's pid namespace).
    Parent(i32),
}

/// Number of threads of the calling process (entries of `/proc/self/task`).
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

fn check_single_threaded() -> Result<()> {
    let threads = thread_count().map_err(sys("read /proc/self/task"))?;
    if threads != 1 {
        return Err(Error::MultiThreaded { threads });
    }
    Ok(())
}

/// `fork(2)`, refused unless the caller is single-threaded.
pub fn fork_single_threaded() -> Result<Forked> {
    check_single_threaded()?;
    // SAFETY: the process has exactly one thread (checked above), so no lock
    // of libc or of Rust's runtime can be held by another thread at the time
    // of the fork; the child continues with a consistent copy of memory.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(sys("fork")(io::Error::last_os_error())),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// Fork-like `clone(2)` (no new stack: the child continues on a copy of the
/// caller's stack, exactly like `fork`) with extra `CLONE_NEW*` flags. The
/// child's exit signal is `SIGCHLD`. Refused unless the caller is
/// single-threaded.
pub fn clone_namespaces(flags: i32) -> Result<Forked> {
    check_single_threaded()?;
    let flags = (flags as libc::c_ulong) | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: raw clone without CLONE_VM and with a null stack pointer behaves
    // like fork(2): the child gets a private copy of the address space and
    // resumes here. The process is single-threaded (checked above), so no
    // other thread holds locks. glibc's pid cache no longer exists (>= 2.25).
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match pid {
        -1 => Err(sys("clone")(io::Error::last_os_error())),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid as i32)),
    }
}

fn set_disposition(signal: i32, handler: libc::sighandler_t) -> Result<()> {
    // SAFETY: an all-zero sigaction is a valid value (empty mask, no flags);
    // we set only the handler to SIG_IGN or SIG_DFL, never a function pointer,
    // so no code runs asynchronously as a result of this call.
    let rc = unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler;
        libc::sigaction(signal, &act, std::ptr::null_mut())
    };
    if rc == -1 {
        return Err(sys("sigaction")(io::Error::last_os_error()));
    }
    Ok(())
}

/// Set `signal` to `SIG_IGN`.
pub fn ignore_signal(signal: i32) -> Result<()> {
    set_disposition(signal, libc::SIG_IGN)
}

/// Set `signal` back to `SIG_DFL`.
pub fn default_signal(signal: i32) -> Result<()> {
    set_disposition(signal, libc::SIG_DFL)
}

/// Reset every catchable signal to `SIG_DFL` (before `execve` in a child:
/// ignored dispositions survive exec, handled ones do not need resetting).
pub fn reset_all_signals() {
    for sig in 1..libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // Errors (invalid signal numbers reserved by libc) are irrelevant.
        let _ = set_disposition(sig, libc::SIG_DFL);
    }
}

/// Close every file descriptor `>= 3` except those in `keep`.
pub fn close_fds_except(keep: &[RawFd]) -> Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd >= 3).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut start: u32 = 3;
    for fd in keep {
        let fd = fd as u32;
        if fd > start {
            close_range(start, fd - 1)?;
        }
        start = fd + 1;
    }
    close_range(start, u32::MAX)
}

fn close_range(first: u32, last: u32) -> Result<()> {
    // SAFETY: close_range only closes descriptors; callers own every
    // descriptor in the range (this runs in freshly forked children where
    // nothing else refers to them).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) };
    if rc == -1 {
        return Err(sys("close_range")(io::Error::last_os_error()));
    }
    Ok(())
}

/// One classic BPF instruction `(code, jt, jf, k)`.
pub type BpfInsn = (u16, u8, u8, u32);

/// Install a seccomp filter on the calling thread without setting
/// `PR_SET_NO_NEW_PRIVS` (requires `CAP_SYS_ADMIN` in the current user
/// namespace).
pub fn install_seccomp_filter(prog: &[BpfInsn]) -> Result<()> {
    let filter: Vec<libc::sock_filter> =
        prog.iter().map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k }).collect();
    let fprog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points at `filter`, which lives until after the call;
    // the kernel copies the program and validates it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc == -1 {
        return Err(sys("seccomp")(io::Error::last_os_error()));
    }
    Ok(())
}

/// Give process `to` the resource limits of process `from`
/// (`prlimit64`, each resource read from one and set in the other).
pub fn copy_limits(from: i32, to: i32) -> io::Result<()> {
    set_limits(to, &limits(from)?)
}

/// Give process `pid` resource limits `limits` (soft, hard), by resource
/// number, as [`limits`] reads them.
pub fn set_limits(pid: i32, limits: &[(u64, u64)]) -> io::Result<()> {
    let to = pid;
    for (resource, &(cur, max)) in limits.iter().enumerate() {
        let limit = libc::rlimit64 { rlim_cur: cur, rlim_max: max };
        // SAFETY: prlimit64 reads the new limit from `limit` (live) and
        // writes no old one (null).
        let r = unsafe { libc::prlimit64(to, resource as _, &limit, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The resource limits of process `pid` (soft, hard), by resource number
/// (x86-64's 16, `RLIMIT_CPU` to `RLIMIT_RTTIME`).
pub fn limits(pid: i32) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity(16);
    for resource in 0..16 {
        let mut limit = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: prlimit64 with a null new limit only writes the current
        // one into `limit`, a live local of the right type.
        let r = unsafe { libc::prlimit64(pid, resource as _, std::ptr::null(), &mut limit) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        out.push((limit.rlim_cur, limit.rlim_max));
    }
    Ok(out)
}

/// Whether descriptor `fd1` of process `pid1` and `fd2` of `pid2` are one
/// open file description (`kcmp(KCMP_FILE)`: a `dup`, or inherited).
pub fn same_open_file(pid1: i32, fd1: i32, pid2: i32, fd2: i32) -> io::Result<bool> {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: kcmp takes only integers and reads no memory of ours.
    let rc =
        unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1 as libc::c_ulong, fd2 as libc::c_ulong) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc == 0) }
}

/// Whether tasks `tid1` and `tid2` share one descriptor table
/// (`kcmp(KCMP_FILES)`) and one filesystem context — root, cwd, umask
/// (`kcmp(KCMP_FS)`).
pub fn same_files_and_fs(tid1: i32, tid2: i32) -> io::Result<bool> {
    Ok(kcmp_same(tid1, tid2, KCMP_FILES)? && kcmp_same(tid1, tid2, KCMP_FS)?)
}

/// Whether tasks `tid1` and `tid2` share a descriptor table or a
/// filesystem context (either of [`same_files_and_fs`]'s two).
pub fn shares_files_or_fs(tid1: i32, tid2: i32) -> io::Result<bool> {
    Ok(kcmp_same(tid1, tid2, KCMP_FILES)? || kcmp_same(tid1, tid2, KCMP_FS)?)
}

const KCMP_FILES: libc::c_int = 2;
const KCMP_FS: libc::c_int = 3;

/// `kcmp(tid1, tid2, kind) == 0`: the two tasks share that object.
fn kcmp_same(tid1: i32, tid2: i32, kind: libc::c_int) -> io::Result<bool> {
    // SAFETY: kcmp takes only integers and reads no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_kcmp, tid1, tid2, kind, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc == 0)
}

/// Make the calling process show `name` alone as its command line
/// (`/proc/<pid>/cmdline`, `ps`) and an empty environment
/// (`/proc/<pid>/environ`), and wipe the argument and environment strings
/// it inherited: a forked process (a sandbox's init is a fork of the
/// zygote, a fork of the daemon) would otherwise show the daemon's.
///
/// How: the kernel serves those files from the ranges `arg_start..arg_end`
/// and `env_start..env_end` of the process's memory descriptor (at exec
/// they hold the strings copied onto the initial stack). The strings there
/// are zeroed (so they cannot be read from memory either), and
/// `PR_SET_MM_MAP` points the argument range at a leaked copy of `name`
/// and the environment range at an empty one. `PR_SET_MM_MAP` needs no
/// capability as long as it changes no executable (`exe_fd` = -1; the
/// CRIU path); every other field is passed back as it is (read from
/// `/proc/self/stat`, and the current break from `brk(0)`).
///
/// Call it in a single-threaded process (another thread could move the
/// break in between). `std::env::args()` and the `environ` variables read
/// as empty strings afterwards.
pub fn replace_command_line(name: &std::ffi::CStr) -> Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(sys("read /proc/self/stat"))?;
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect())
        .unwrap_or_default();
    // `fields[0]` is field 3 of proc(5).
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    let (arg_start, arg_end, env_start, env_end) = (field(48), field(49), field(50), field(51));
    if arg_start == 0 || arg_start > arg_end || env_start > env_end || field(26) == 0 {
        return Err(sys("read the memory layout from /proc/self/stat")(io::Error::from(io::ErrorKind::InvalidData)));
    }
    // SAFETY: brk(0) never moves the break (0 is below the start of the
    // heap): it only returns the current one.
    let brk = unsafe { libc::syscall(libc::SYS_brk, 0 as libc::c_ulong) } as u64;
    for (start, end) in [(arg_start, arg_end), (env_start, env_end)] {
        // SAFETY: `start..end` is a range the kernel recorded for this
        // process's argument or environment strings: at exec it copied
        // them there, on the initial stack, which stays mapped writable for
        // the life of the process. No Rust reference points into it (the
        // standard library and libc keep raw `argv` / `environ` pointers,
        // read on demand); zeroed, every string stays a valid, empty,
        // NUL-terminated one.
        unsafe { std::ptr::write_bytes(start as *mut u8, 0, (end - start) as usize) };
    }
    let area: &'static [u8] = Box::leak(name.to_bytes_with_nul().to_vec().into_boxed_slice());
    let (new_start, new_end) = (area.as_ptr() as u64, area.as_ptr() as u64 + area.len() as u64);
    let map = rustix::process::PrctlMmMap {
        start_code: field(26),
        end_code: field(27),
        start_data: field(45),
        end_data: field(46),
        start_brk: field(47),
        brk,
        start_stack: field(28),
        arg_start: new_start,
        arg_end: new_end,
        // An empty environment, at the end of the new command line.
        env_start: new_end,
        env_end: new_end,
        auxv: std::ptr::null_mut(),
        auxv_size: 0,
        exe_fd: -1,
    };
    // SAFETY: every field but the argument and environment ranges is the
    // process's own current value, so the memory layout the kernel keeps
    // does not change; those two point into `area`, leaked, so valid for
    // the life of the process. No auxv is passed (size 0) and no
    // executable (`exe_fd` -1).
    unsafe { rustix::process::configure_virtual_memory_map(&map) }.map_err(|e| sys("prctl(PR_SET_MM_MAP)")(e.into()))
}

/// Terminate the calling process immediately (no atexit handlers, no stdio
/// flush): the only correct way to leave a forked child that did not exec.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no user-space state.
    unsafe { libc::_exit(code) }
}

/// A scheduling policy for [`set_policy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_OTHER`: the default (its nice value applies).
    Normal,
    /// `SCHED_IDLE`: runs only on CPU time no other task of its group
    /// wants, and its wake-ups never preempt the task running on its CPU
    /// (the kernel's `check_preempt_wakeup_fair` returns early for a waking
    /// task whose policy is not `SCHED_NORMAL`). For a task killed and
    /// left to tear its address space down in the background.
    Idle,
    /// `SCHED_FIFO` at the lowest real-time priority: its wake-up preempts
    /// any task of the fair classes on its CPU, whatever their cgroup.
    /// For short work on a critical path only.
    Fifo,
}

/// Give task `tid` (0: the calling thread) scheduling policy `policy`.
/// (A real-time policy fails with `EPERM` in a cpu cgroup given no
/// real-time runtime.)
pub fn set_policy(tid: i32, policy: Policy) -> io::Result<()> {
    let (policy, priority) = match policy {
        Policy::Normal => (libc::SCHED_OTHER, 0),
        Policy::Idle => (libc::SCHED_IDLE, 0),
        Policy::Fifo => (libc::SCHED_FIFO, 1),
    };
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: `param` is a valid, initialised `sched_param` that outlives
    // the call, which only reads it; a bad tid is an error, not UB.
    let rc = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Start time of process `pid` (`/proc/<pid>/stat` field 22, clock ticks
/// after boot), if it exists: with the pid, it names one process (a pid
/// can be reused, the pair cannot).
pub fn start_time(pid: i32) -> Option<u64> {
    use std::io::Read;
    // One read (`read_to_string` takes a `statx` and four reads: a
    // rollback's kill asks it of each process it restores).
    let mut buf = [0u8; 2048];
    let n = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?.read(&mut buf).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let rest = text.rsplit_once(')')?.1;
    // rest starts at field 3 (state): field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// `struct procmap_query` (`linux/fs.h`, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong =
    (3 << 30) | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16) | ((b'f' as libc::c_ulong) << 8) | 17;
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;
const PROCMAP_QUERY_FILE_BACKED_VMA: u64 = 0x20;

/// One mapping as `PROCMAP_QUERY` gives it, without its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapRange {
    pub start: u64,
    pub end: u64,
    /// Readable, writable, executable, shared.
    pub perms: [bool; 4],
    /// File offset (0 for an anonymous mapping).
    pub offset: u64,
    /// The backing file's device (`makedev`) and inode number (0, 0: none).
    pub dev: u64,
    pub inode: u64,
}

/// Walk the mappings of `pid` that `flags` selects, one `PROCMAP_QUERY`
/// each, calling `each` with the answer and the mapping's name (when
/// `named`). `Ok(false)`: the kernel has no `PROCMAP_QUERY` (before 6.11).
fn query_maps(pid: i32, flags: u64, named: bool, mut each: impl FnMut(&ProcmapQuery, &str)) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let maps = std::fs::File::open(format!("/proc/{pid}/maps"))?;
    let mut name = vec![0u8; if named { 4096 } else { 0 }];
    let mut addr = 0u64;
    loop {
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA | flags,
            query_addr: addr,
            vma_name_addr: if named { name.as_mut_ptr() as u64 } else { 0 },
            vma_name_size: name.len() as u32,
            ..Default::default()
        };
        // SAFETY: `q` is a valid `procmap_query` of the size it states; the
        // kernel writes `q` and at most `vma_name_size` bytes to `name`
        // (none when it is empty), which outlives the call.
        let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY, &mut q as *mut ProcmapQuery) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // No mapping at or after `addr`.
                Some(libc::ENOENT) => Ok(true),
                Some(libc::ENOTTY | libc::EINVAL) if addr == 0 => Ok(false),
                _ => Err(e),
            };
        }
        // (`vma_name_size` counts the terminating NUL.)
        let len = (q.vma_name_size as usize).saturating_sub(1).min(name.len());
        each(&q, &String::from_utf8_lossy(&name[..len]));
        addr = q.vma_end;
    }
}

/// Every mapping of `pid`, without names, asked of the kernel one at a
/// time with `PROCMAP_QUERY` (~50 µs for a Python process's 130, against
/// ~150 µs to read and parse its `maps`, where each path is formatted).
/// The `[vsyscall]` page is not a mapping of the process: not listed.
/// `Ok(None)`: the kernel has no `PROCMAP_QUERY` (before 6.11).
pub fn map_ranges(pid: i32) -> io::Result<Option<Vec<MapRange>>> {
    let mut out = Vec::with_capacity(160);
    let known = query_maps(pid, 0, false, |q, _| {
        let flag = |bit: u64| q.vma_flags & bit != 0;
        out.push(MapRange {
            start: q.vma_start,
            end: q.vma_end,
            perms: [flag(0x01), flag(0x02), flag(0x04), flag(PROCMAP_QUERY_VMA_SHARED)],
            offset: q.vma_offset,
            dev: libc::makedev(q.dev_major, q.dev_minor),
            inode: q.inode,
        });
    })?;
    Ok(known.then_some(out))
}

/// The paths of the shared file mappings of `pid` (as its
/// `/proc/<pid>/maps` shows them), asked of the kernel one mapping at a time
/// with `PROCMAP_QUERY`, which skips every other kind (~2 µs for a process
/// with none, against ~150 µs to read and parse a Python process's 130
/// lines of `maps`). `Ok(None)`: the kernel has no `PROCMAP_QUERY` (before
/// 6.11): read `maps`.
pub fn shared_file_maps(pid: i32) -> io::Result<Option<Vec<String>>> {
    let mut out = Vec::new();
    let flags = PROCMAP_QUERY_FILE_BACKED_VMA | PROCMAP_QUERY_VMA_SHARED;
    let known = query_maps(pid, flags, true, |_, name| out.push(name.to_string()))?;
    Ok(known.then_some(out))
}

/// `PR_TIMER_CREATE_RESTORE_IDS` (Linux 6.17): with it on, `timer_create`
/// takes the timer id the caller asks for.
pub const PR_TIMER_CREATE_RESTORE_IDS: i32 = 77;

/// Whether this kernel lets a process choose its POSIX timers' ids
/// ([`PR_TIMER_CREATE_RESTORE_IDS`], asked with its `GET` operation).
pub fn timer_ids_restorable() -> bool {
    // SAFETY: `prctl` with an integer option and integer arguments reads
    // and writes no memory of ours (`GET` returns the mode).
    unsafe { libc::prctl(PR_TIMER_CREATE_RESTORE_IDS, 2, 0, 0, 0) >= 0 }
}
