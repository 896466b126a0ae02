//! ptrace for the process engine: seize, interrupt, wait for stops,
//! registers, tracee memory.
//!
//! Every call for one tracee must come from the OS thread that seized it
//! (ptrace is per thread): callers run them on a dedicated tracer thread.
//!
//! Stops are reported as [`Stop`]; a tracee that died is `Exited`/`Killed`
//! (never an `ESRCH` surprise later). Seized tracees get
//! `PTRACE_O_TRACESYSGOOD` (syscall stops are told apart from `SIGTRAP`),
//! `TRACECLONE`/`TRACEFORK`/`TRACEVFORK` (a child made by an injected
//! `clone` is attached at once and starts in a `PTRACE_EVENT_STOP`).
//! `EXITKILL` (if the tracer dies, the tracee dies instead of running) is
//! set with [`set_exit_kill`] only where running on would be wrong:
//! templates, and processes while syscalls are injected into them.

use std::io;

use nix::sys::ptrace::{self, Options};
use nix::sys::signal::Signal;
use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// The x86_64 general purpose registers as ptrace sees them.
pub type Regs = libc::user_regs_struct;

/// `PTRACE_EVENT_STOP`: group-stop-like stop after `PTRACE_INTERRUPT`, and
/// the first stop of an auto-attached child.
pub const EVENT_STOP: i32 = 128;
/// `PTRACE_EVENT_FORK`.
pub const EVENT_FORK: i32 = 1;
/// `PTRACE_EVENT_VFORK`.
pub const EVENT_VFORK: i32 = 2;
/// `PTRACE_EVENT_CLONE`.
pub const EVENT_CLONE: i32 = 3;

/// Why a tracee stopped (or that it is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A `PTRACE_EVENT_*` stop (`event`), with the stop signal.
    Event {
        /// `PTRACE_EVENT_*`.
        event: i32,
        /// Stop signal.
        signal: i32,
    },
    /// Syscall entry or exit stop.
    Syscall,
    /// Signal-delivery stop: `signal` will be delivered unless suppressed.
    Signal(i32),
    /// The tracee exited with this code.
    Exited(i32),
    /// The tracee was killed by this signal.
    Killed(i32),
}

fn pid(tid: i32) -> Pid {
    Pid::from_raw(tid)
}

fn err(e: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn signal(sig: i32) -> Option<Signal> {
    if sig == 0 { None } else { Signal::try_from(sig).ok() }
}

/// `PTRACE_SEIZE` with the options above (the tracee keeps running).
pub fn seize(tid: i32) -> io::Result<()> {
    let opts = Options::PTRACE_O_TRACESYSGOOD
        | Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK;
    ptrace::seize(pid(tid), opts).map_err(err)
}

/// `PTRACE_INTERRUPT`: the tracee enters a `PTRACE_EVENT_STOP` (in signal
/// context, so registers set there see the kernel's syscall-restart logic).
pub fn interrupt(tid: i32) -> io::Result<()> {
    ptrace::interrupt(pid(tid)).map_err(err)
}

/// Wait for the next stop of `tid` (`__WALL`: clone children too).
pub fn wait(tid: i32) -> io::Result<Stop> {
    loop {
        let st = match waitpid(pid(tid), Some(WaitPidFlag::__WALL)) {
            Ok(st) => st,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(err(e)),
        };
        return Ok(match st {
            WaitStatus::PtraceEvent(_, sig, event) => Stop::Event { event, signal: sig as i32 },
            WaitStatus::PtraceSyscall(_) => Stop::Syscall,
            WaitStatus::Stopped(_, sig) => Stop::Signal(sig as i32),
            WaitStatus::Exited(_, code) => Stop::Exited(code),
            WaitStatus::Signaled(_, sig, _) => Stop::Killed(sig as i32),
            WaitStatus::Continued(_) | WaitStatus::StillAlive => continue,
        });
    }
}

/// [`wait`] without blocking: `None` while `tid` has nothing to report.
pub fn try_wait(tid: i32) -> io::Result<Option<Stop>> {
    loop {
        let st = match waitpid(pid(tid), Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(st) => st,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(err(e)),
        };
        return Ok(Some(match st {
            WaitStatus::StillAlive => return Ok(None),
            WaitStatus::PtraceEvent(_, sig, event) => Stop::Event { event, signal: sig as i32 },
            WaitStatus::PtraceSyscall(_) => Stop::Syscall,
            WaitStatus::Stopped(_, sig) => Stop::Signal(sig as i32),
            WaitStatus::Exited(_, code) => Stop::Exited(code),
            WaitStatus::Signaled(_, sig, _) => Stop::Killed(sig as i32),
            WaitStatus::Continued(_) => continue,
        }));
    }
}

/// Read the registers of a stopped tracee.
pub fn regs(tid: i32) -> io::Result<Regs> {
    ptrace::getregs(pid(tid)).map_err(err)
}

/// Set the registers of a stopped tracee.
pub fn set_regs(tid: i32, regs: &Regs) -> io::Result<()> {
    ptrace::setregs(pid(tid), *regs).map_err(err)
}

/// Resume until the next syscall entry or exit (`PTRACE_SYSCALL`).
pub fn resume_syscall(tid: i32, sig: i32) -> io::Result<()> {
    ptrace::syscall(pid(tid), signal(sig)).map_err(err)
}

/// Resume for one instruction (`PTRACE_SINGLESTEP`), delivering `sig` if
/// not 0. Over a `syscall` instruction the call runs whole and the tracee
/// stops once, with `SIGTRAP`, after it returned (no entry or exit stop).
pub fn resume_step(tid: i32, sig: i32) -> io::Result<()> {
    ptrace::step(pid(tid), signal(sig)).map_err(err)
}

/// Resume (`PTRACE_CONT`), delivering `sig` if not 0.
pub fn resume(tid: i32, sig: i32) -> io::Result<()> {
    ptrace::cont(pid(tid), signal(sig)).map_err(err)
}

/// Detach, delivering `sig` if not 0.
pub fn detach(tid: i32, sig: i32) -> io::Result<()> {
    ptrace::detach(pid(tid), signal(sig)).map_err(err)
}

/// `PTRACE_GETEVENTMSG`: after a fork/clone event, the new child's pid.
pub fn event_msg(tid: i32) -> io::Result<u64> {
    ptrace::getevent(pid(tid)).map(|v| v as u64).map_err(err)
}

/// Read `buf.len()` bytes at `addr` of process `tid`.
pub fn read_mem(tid: i32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    let len = buf.len();
    let remote = [RemoteIoVec { base: addr as usize, len }];
    let n = process_vm_readv(pid(tid), &mut [io::IoSliceMut::new(buf)], &remote).map_err(err)?;
    if n != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("short read of tracee memory: {n} of {len}")));
    }
    Ok(())
}

/// Write `data` at `addr` of process `tid`.
pub fn write_mem(tid: i32, addr: u64, data: &[u8]) -> io::Result<()> {
    let remote = [RemoteIoVec { base: addr as usize, len: data.len() }];
    let n = process_vm_writev(pid(tid), &[io::IoSlice::new(data)], &remote).map_err(err)?;
    if n != data.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("short write of tracee memory: {n} of {}", data.len()),
        ));
    }
    Ok(())
}

/// `SIGKILL` to process `tid` (a template being dropped).
pub fn kill(tid: i32) -> io::Result<()> {
    nix::sys::signal::kill(pid(tid), Signal::SIGKILL).map_err(err)
}

/// `PTRACE_PEEKSIGINFO`.
const PTRACE_PEEKSIGINFO: libc::c_uint = 0x4209;
/// `PTRACE_PEEKSIGINFO_SHARED`: the process-wide queue instead of the thread's.
const PTRACE_PEEKSIGINFO_SHARED: u32 = 1;

/// `struct ptrace_peeksiginfo_args`.
#[repr(C)]
struct PeekSiginfoArgs {
    off: u64,
    flags: u32,
    nr: i32,
}

/// The queued (pending) signals of a stopped tracee, as raw 128-byte
/// `siginfo_t`s: the thread's own queue, or the process-wide one.
pub fn pending_siginfo(tid: i32, shared: bool) -> io::Result<Vec<[u8; 128]>> {
    const BATCH: usize = 32;
    let mut out = Vec::new();
    loop {
        let mut buf = [[0u8; 128]; BATCH];
        let args = PeekSiginfoArgs {
            off: out.len() as u64,
            flags: if shared { PTRACE_PEEKSIGINFO_SHARED } else { 0 },
            nr: BATCH as i32,
        };
        // SAFETY: PTRACE_PEEKSIGINFO reads `args` (a live, correctly laid out
        // ptrace_peeksiginfo_args) and writes at most `nr` siginfo_t records
        // (128 bytes each) into `buf`, which has room for exactly `nr`.
        let n = unsafe {
            libc::ptrace(
                PTRACE_PEEKSIGINFO,
                tid,
                &args as *const PeekSiginfoArgs,
                buf.as_mut_ptr() as *mut libc::c_void,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        out.extend_from_slice(&buf[..n as usize]);
        if (n as usize) < BATCH {
            return Ok(out);
        }
    }
}

/// `PTRACE_GETSIGMASK` / `PTRACE_SETSIGMASK`.
const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;

/// The blocked-signal mask of a stopped tracee (bit `n - 1` for signal `n`).
pub fn sigmask(tid: i32) -> io::Result<u64> {
    let mut mask: u64 = 0;
    // SAFETY: PTRACE_GETSIGMASK writes `data` = 8 bytes (the size passed in
    // `addr`) into `mask`, a live u64.
    let r = unsafe { libc::ptrace(PTRACE_GETSIGMASK, tid, 8usize as *mut libc::c_void, &mut mask as *mut u64) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(mask) }
}

/// Set the blocked-signal mask of a stopped tracee (SIGKILL and SIGSTOP
/// are never blocked, whatever `mask` says).
pub fn set_sigmask(tid: i32, mask: u64) -> io::Result<()> {
    // SAFETY: PTRACE_SETSIGMASK reads 8 bytes (the size passed in `addr`)
    // from `mask`, a live u64.
    let r = unsafe { libc::ptrace(PTRACE_SETSIGMASK, tid, 8usize as *mut libc::c_void, &mask as *const u64) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// `PTRACE_SETOPTIONS` with [`seize`]'s options plus `PTRACE_O_EXITKILL`:
/// for tracees that must not outlive the tracer (templates, and processes
/// while syscalls are injected into them).
pub fn set_exit_kill(tid: i32, on: bool) -> io::Result<()> {
    set_options(tid, on, false)
}

/// [`set_exit_kill`], and `PTRACE_O_SUSPEND_SECCOMP` with `suspend_seccomp`:
/// the tracee's seccomp filter does not apply while it is set (a call the
/// engine injects that the sandbox's filter denies to the sandbox's own
/// code; needs `CAP_SYS_ADMIN`).
pub fn set_options(tid: i32, exit_kill: bool, suspend_seccomp: bool) -> io::Result<()> {
    let mut opts = Options::PTRACE_O_TRACESYSGOOD
        | Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK;
    if exit_kill {
        opts |= Options::PTRACE_O_EXITKILL;
    }
    if suspend_seccomp {
        opts |= Options::from_bits_retain(1 << 21); // PTRACE_O_SUSPEND_SECCOMP
    }
    ptrace::setoptions(pid(tid), opts).map_err(err)
}

/// [`set_exit_kill`] on, plus `PTRACE_O_TRACEEXEC`: an `execve` of the
/// tracee stops it in a `PTRACE_EVENT_EXEC` stop instead of queueing a
/// `SIGTRAP` for it (which, held back by a blocked mask, would be delivered
/// once it runs). For a process the engine makes `execve` itself.
pub fn trace_exec(tid: i32) -> io::Result<()> {
    let opts = Options::PTRACE_O_TRACESYSGOOD
        | Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK
        | Options::PTRACE_O_EXITKILL
        | Options::PTRACE_O_TRACEEXEC;
    ptrace::setoptions(pid(tid), opts).map_err(err)
}

/// `PTRACE_GET_RSEQ_CONFIGURATION`.
const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;

/// A thread's rseq registration: (area address, area length, flags,
/// signature); `None` when it has none.
pub fn rseq_configuration(tid: i32) -> io::Result<Option<(u64, u32, u32, u32)>> {
    // struct ptrace_rseq_configuration { u64 rseq_abi_pointer; u32 rseq_abi_size; u32 signature; u32 flags; u32 pad; }
    let mut conf = [0u8; 24];
    // SAFETY: the kernel writes at most `addr` = 24 bytes (the size passed)
    // into `conf`, a live 24-byte buffer.
    let r =
        unsafe { libc::ptrace(PTRACE_GET_RSEQ_CONFIGURATION, tid, conf.len() as *mut libc::c_void, conf.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let ptr = u64::from_ne_bytes(conf[0..8].try_into().unwrap_or_default());
    let size = u32::from_ne_bytes(conf[8..12].try_into().unwrap_or_default());
    let sig = u32::from_ne_bytes(conf[12..16].try_into().unwrap_or_default());
    let flags = u32::from_ne_bytes(conf[16..20].try_into().unwrap_or_default());
    Ok((ptr != 0).then_some((ptr, size, flags, sig)))
}

/// Whether processes `a` and `b` share one address space (`kcmp`).
pub fn same_mm(a: i32, b: i32) -> bool {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp takes two pids and a type by value; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a as libc::c_long, b as libc::c_long, KCMP_VM, 0, 0) };
    r == 0
}

/// `NT_X86_XSTATE`: the XSAVE area (x87, SSE, AVX, ... registers).
const NT_X86_XSTATE: usize = 0x202;

/// The extended register state (XSAVE layout) of a stopped thread.
pub fn xstate(tid: i32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: PTRACE_GETREGSET writes at most `iov.iov_len` bytes into
    // `buf` (live for the call) and updates `iov.iov_len` to the size
    // written; `iov` is a live local.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETREGSET, tid, NT_X86_XSTATE as *mut libc::c_void, &mut iov) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = iov.iov_len;
    buf.truncate(len);
    Ok(buf)
}

/// Set the extended register state of a stopped thread (as [`xstate`]
/// read it).
pub fn set_xstate(tid: i32, state: &[u8]) -> io::Result<()> {
    let mut copy = state.to_vec();
    let mut iov = libc::iovec { iov_base: copy.as_mut_ptr().cast(), iov_len: copy.len() };
    // SAFETY: PTRACE_SETREGSET reads `iov.iov_len` bytes from `copy`, live
    // for the call.
    let r = unsafe { libc::ptrace(libc::PTRACE_SETREGSET, tid, NT_X86_XSTATE as *mut libc::c_void, &mut iov) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// A thread's robust futex list: (head address, length); `get_robust_list`
/// needs ptrace access to it, which the tracer has.
pub fn robust_list(tid: i32) -> io::Result<(u64, u64)> {
    let mut head: u64 = 0;
    let mut len: libc::size_t = 0;
    // SAFETY: get_robust_list writes a pointer-sized head and a size_t
    // length through the two pointers, both live locals of those sizes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            tid as libc::c_long,
            &mut head as *mut u64,
            &mut len as *mut libc::size_t,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok((head, len as u64)) }
}
