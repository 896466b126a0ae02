//! Running syscalls inside a stopped tracee.
//!
//! Protocol for one injected syscall (the tracee sits in a ptrace stop):
//! 1. registers := the call (`rax` = number, `rdi rsi rdx r10 r8 r9` =
//!    arguments), `rip` := a `syscall` instruction of the tracee's own vDSO
//!    (found per process: the vDSO moves with ASLR), `orig_rax` := -1 so
//!    that the kernel's restart logic leaves an interrupted syscall of the
//!    tracee alone;
//! 2. `PTRACE_SYSCALL` to the entry stop, `PTRACE_SYSCALL` to the exit
//!    stop, read `rax`. A fork/clone event in between names the new child
//!    (auto-attached, it starts in a `PTRACE_EVENT_STOP`). Every signal is
//!    blocked (`PTRACE_SETSIGMASK`) from the first injected call until the
//!    release, so none is dequeued by our calls: what arrives stays pending
//!    and is delivered after the release, in the restored context.
//!
//! Letting go ([`Tracee::release`]): the saved registers must be set while
//! the tracee is in *signal context*, so that the kernel applies its own
//! restart logic to an interrupted syscall (`-ERESTARTSYS` becomes a restart
//! or `EINTR` exactly as without us). The exit stop of an injected call is
//! not such a stop, so the tracee is first interrupted again (`PTRACE_INTERRUPT`,
//! then `PTRACE_CONT`), which puts it in a `PTRACE_EVENT_STOP` before it
//! returns to user space; there the registers are restored and it is detached.

use std::io;

use sandtree_sys::ptrace::{self, EVENT_CLONE, EVENT_FORK, EVENT_STOP, EVENT_VFORK, Regs, Stop};

use crate::{Error, HostPid, Result, SandboxPid};

/// A tracee in a ptrace stop, with the registers to give back.
#[derive(Debug)]
pub struct Tracee {
    /// Host tid.
    pub tid: HostPid,
    /// Registers at the checkpoint (restored on release).
    pub saved: Regs,
    /// Address of a `syscall` instruction in its vDSO.
    pub insn: u64,
    /// Signals held back while we ran syscalls in it.
    held: Vec<i32>,
    /// The signal mask to give back on release (set when the first
    /// injection blocks every signal).
    mask: Option<u64>,
    /// CPUs to let it run on from its release (until then it stays on the
    /// tracer's, where handing control back and forth is cheapest).
    affinity: Option<Vec<u32>>,
}

fn died(tid: HostPid, how: &str) -> Error {
    Error::Died { pid: tid, how: how.to_string() }
}

/// The child that a fork event of `tid` names (`PTRACE_GETEVENTMSG`: its
/// host pid).
fn fork_child(tid: HostPid) -> Result<HostPid> {
    Ok(HostPid(ptrace::event_msg(tid.raw()).map_err(Error::ptrace(tid, "GETEVENTMSG"))? as i32))
}

/// Wait for `tid`'s `PTRACE_EVENT_STOP` (after `PTRACE_INTERRUPT`, or the
/// first stop of an auto-attached child). Signals that stop it first are
/// delivered (they would have been delivered before the stop anyway);
/// fork events of a task that was forking name children that must be
/// stopped too (returned).
pub fn wait_event_stop(tid: HostPid) -> Result<Vec<HostPid>> {
    let mut children = Vec::new();
    loop {
        let stop = ptrace::wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))?;
        if step_to_event_stop(tid, stop, &mut children)? {
            return Ok(children);
        }
    }
}

/// [`wait_event_stop`] bounded by `deadline`: `Ok(None)` when the task did
/// not stop in time (it sits in an uninterruptible wait; the interrupt
/// stays pending and takes effect when the wait ends).
pub fn wait_event_stop_until(tid: HostPid, deadline: std::time::Instant) -> Result<Option<Vec<HostPid>>> {
    let mut children = Vec::new();
    let mut nap = std::time::Duration::from_micros(5);
    loop {
        let Some(stop) = ptrace::try_wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))? else {
            if std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(std::time::Duration::from_millis(1));
            continue;
        };
        if step_to_event_stop(tid, stop, &mut children)? {
            return Ok(Some(children));
        }
    }
}

/// One stop on the way to `PTRACE_EVENT_STOP`: `true` once there; other
/// stops are let go (signals delivered, fork events' children recorded).
fn step_to_event_stop(tid: HostPid, stop: Stop, children: &mut Vec<HostPid>) -> Result<bool> {
    match stop {
        Stop::Event { event: EVENT_STOP, .. } => return Ok(true),
        Stop::Event { event: EVENT_FORK | EVENT_VFORK | EVENT_CLONE, .. } => {
            children.push(fork_child(tid)?);
            ptrace::resume(tid.raw(), 0).map_err(Error::ptrace(tid, "cont"))?;
        }
        Stop::Event { .. } | Stop::Syscall => ptrace::resume(tid.raw(), 0).map_err(Error::ptrace(tid, "cont"))?,
        Stop::Signal(sig) => ptrace::resume(tid.raw(), sig).map_err(Error::ptrace(tid, "cont"))?,
        Stop::Exited(code) => return Err(died(tid, &format!("exited with {code}"))),
        Stop::Killed(sig) => return Err(died(tid, &format!("killed by signal {sig}"))),
    }
    Ok(false)
}

/// Offset of a `syscall` instruction in the vDSO: one kernel, one vDSO
/// image, mapped at a different address in every process.
static SYSCALL_OFFSET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Address of a `syscall` instruction (`0f 05`) in the vDSO of `pid`.
pub fn find_syscall_insn(pid: HostPid) -> Result<u64> {
    let base = crate::procfs::vdso_base(pid).map_err(|e| Error::Proc { pid, what: "auxv", source: e })?;
    if let Some(off) = SYSCALL_OFFSET.get() {
        return Ok(base + off);
    }
    let maps = crate::procfs::maps(pid).map_err(|e| Error::Proc { pid, what: "maps", source: e })?;
    let vdso = maps.iter().find(|m| m.start == base).ok_or_else(|| {
        Error::unsupported_by_host(pid, "", "vdso", "the process has no vDSO to borrow a syscall instruction from")
    })?;
    let mut buf = vec![0u8; (vdso.end - vdso.start) as usize];
    ptrace::read_mem(pid.raw(), vdso.start, &mut buf).map_err(Error::ptrace(pid, "read vdso"))?;
    let off = buf
        .windows(2)
        .position(|w| w == [0x0f, 0x05])
        .ok_or_else(|| Error::unsupported_by_host(pid, "", "vdso", "no syscall instruction in the vDSO"))?;
    Ok(base + *SYSCALL_OFFSET.get_or_init(|| off as u64))
}

/// `-ERESTARTNOINTR`: `fork` found a signal pending and asks to be retried.
pub(crate) const ERESTARTNOINTR: i64 = -513;

/// The result of an injected syscall.
#[derive(Debug)]
pub struct Outcome {
    /// Raw return value (`-errno` on failure).
    pub ret: i64,
    /// Child created by it (fork / clone), auto-attached (host pid).
    pub child: Option<HostPid>,
}

impl Tracee {
    /// A tracee in a stop whose registers are `saved`.
    pub fn new(tid: HostPid, saved: Regs, insn: u64) -> Tracee {
        Tracee { tid, saved, insn, held: Vec::new(), mask: None, affinity: None }
    }

    /// Release with this signal mask (a restored process: its own mask is
    /// the template's, all blocked).
    pub fn with_mask(mut self, mask: u64) -> Tracee {
        self.mask = Some(mask);
        self
    }

    /// Run on `cpus` once released ([`Tracee::release`]).
    pub fn affinity_on_release(&mut self, cpus: &[u32]) {
        self.affinity = Some(cpus.to_vec());
    }

    /// Block every signal while we work in the tracee (remembering the
    /// mask for [`Tracee::release`]): a signal that arrives meanwhile, or
    /// was pending, stays pending and is delivered after the release, in
    /// the right context, instead of being dequeued by an injected call.
    fn block_signals(&mut self) -> Result<()> {
        if self.mask.is_none() {
            let tid = self.tid;
            self.mask = Some(ptrace::sigmask(tid.raw()).map_err(Error::ptrace(tid, "GETSIGMASK"))?);
        }
        ptrace::set_sigmask(self.tid.raw(), u64::MAX).map_err(Error::ptrace(self.tid, "SETSIGMASK"))
    }

    /// Run syscall `nr` with `args`; returns the raw result.
    pub fn syscall(&mut self, nr: i64, args: &[u64]) -> Result<Outcome> {
        self.start_syscall(nr, args)?;
        self.finish_syscall()
    }

    /// The first half of [`Tracee::syscall`]: the tracee enters the call
    /// and runs it, on its own CPU, while the tracer goes on with other
    /// work; [`Tracee::finish_syscall`] collects the result. (Between the
    /// two, no other request may be made of this tracee.)
    pub fn start_syscall(&mut self, nr: i64, args: &[u64]) -> Result<()> {
        let tid = self.tid;
        self.start_syscall_unwaited(nr, args)?;
        // Past the entry stop, so that the call itself runs from here on.
        loop {
            match ptrace::wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))? {
                Stop::Syscall => break,
                Stop::Signal(sig) => self.held.push(sig),
                Stop::Exited(code) => return Err(died(tid, &format!("exited with {code}"))),
                Stop::Killed(sig) => return Err(died(tid, &format!("killed by signal {sig}"))),
                Stop::Event { .. } => {}
            }
            ptrace::resume_syscall(tid.raw(), 0).map_err(Error::ptrace(tid, "syscall"))?;
        }
        ptrace::resume_syscall(tid.raw(), 0).map_err(Error::ptrace(tid, "syscall"))
    }

    /// Start syscall `nr` with `args` single-stepping over the `syscall`
    /// instruction: the tracee runs the call whole on its own CPU, with
    /// one stop after it ([`Tracee::poll_stepped`]), and the tracer waits
    /// for no entry stop (which a tracee on another CPU reaches only once
    /// that CPU takes it: up to the rest of another thread's time slice).
    /// Not for calls that fork or restart (a restart would run the
    /// instruction again before the stop).
    pub(crate) fn start_stepped(&mut self, nr: i64, args: &[u64]) -> Result<()> {
        let tid = self.set_call(nr, args)?;
        ptrace::resume_step(tid.raw(), 0).map_err(Error::ptrace(tid, "singlestep"))
    }

    /// The result of a call started by [`Tracee::start_stepped`], without
    /// waiting: `None` while it runs. The call is over once the tracee
    /// stops past the `syscall` instruction (the step's `SIGTRAP`, or
    /// another stop that came after the call returned); a stop before it
    /// (a `SIGSTOP`, held for the release) steps on. The step's `SIGTRAP`
    /// is forced: blocked (every signal is, while we inject), it is
    /// unblocked and its handler reset to the default in the tracee's own
    /// handler table; so only for tracees that never run their own code
    /// again, such as holders (whose table is their own).
    pub(crate) fn poll_stepped(&mut self) -> Result<Option<i64>> {
        let tid = self.tid;
        while let Some(stop) = ptrace::try_wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))? {
            let sig = match stop {
                Stop::Signal(sig) => sig,
                Stop::Event { .. } | Stop::Syscall => 0,
                Stop::Exited(code) => return Err(died(tid, &format!("exited with {code}"))),
                Stop::Killed(sig) => return Err(died(tid, &format!("killed by signal {sig}"))),
            };
            // (The step's `SIGTRAP` is not held; one before the call is a
            // step's of an earlier call whose stop came second, behind
            // another signal's.)
            if sig != 0 && sig != libc::SIGTRAP {
                self.held.push(sig);
            }
            let r = ptrace::regs(tid.raw()).map_err(Error::ptrace(tid, "GETREGS"))?;
            if r.rip == self.insn + 2 {
                return Ok(Some(r.rax as i64));
            }
            ptrace::resume_step(tid.raw(), 0).map_err(Error::ptrace(tid, "singlestep"))?;
        }
        Ok(None)
    }

    /// [`Tracee::start_syscall`] that does not wait for the tracee to reach
    /// the call: it may wait milliseconds for a CPU behind the sandbox's
    /// running processes, and the tracer meanwhile for it (measured: a
    /// standby's fork started between operations held the next
    /// checkpoint's first call to the tracer 0.7-3 ms in 8-16 of 30
    /// checkpoints of the bench). [`Tracee::poll_syscall`] and
    /// [`Tracee::finish_syscall_entering`], with `entering` true, pass its
    /// entry stop.
    pub(crate) fn start_syscall_unwaited(&mut self, nr: i64, args: &[u64]) -> Result<()> {
        let tid = self.set_call(nr, args)?;
        ptrace::resume_syscall(tid.raw(), 0).map_err(Error::ptrace(tid, "syscall"))
    }

    /// Every signal blocked, and the registers of syscall `nr` with `args`
    /// on the vDSO's `syscall` instruction set, for the resume that runs
    /// it; the tid.
    fn set_call(&mut self, nr: i64, args: &[u64]) -> Result<HostPid> {
        let tid = self.tid;
        self.block_signals()?;
        let mut r = self.saved;
        r.rax = nr as u64;
        r.orig_rax = u64::MAX;
        r.rip = self.insn;
        let regs = [&mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.r10, &mut r.r8, &mut r.r9];
        for (slot, v) in regs.into_iter().zip(args.iter().copied().chain(std::iter::repeat(0))) {
            *slot = v;
        }
        ptrace::set_regs(tid.raw(), &r).map_err(Error::ptrace(tid, "SETREGS"))?;
        Ok(tid)
    }

    /// The second half of [`Tracee::syscall`]: wait until the call started
    /// by [`Tracee::start_syscall`] returns.
    pub fn finish_syscall(&mut self) -> Result<Outcome> {
        self.finish_syscall_entering(&mut false)
    }

    /// [`Tracee::finish_syscall`] of a call whose entry stop may be still
    /// to come (`entering`: [`Tracee::start_syscall_unwaited`]).
    pub(crate) fn finish_syscall_entering(&mut self, entering: &mut bool) -> Result<Outcome> {
        let mut child = None;
        loop {
            let stop = ptrace::wait(self.tid.raw()).map_err(Error::ptrace(self.tid, "wait"))?;
            if let Some(out) = self.on_syscall_stop(stop, &mut child, entering)? {
                return Ok(out);
            }
        }
    }

    /// [`Tracee::finish_syscall_entering`] without waiting: `None` while
    /// the call runs. `child` keeps what the stops seen so far told (a
    /// fork's child pid) from one poll to the next, `entering` whether the
    /// entry stop is still to come.
    pub(crate) fn poll_syscall(&mut self, child: &mut Option<HostPid>, entering: &mut bool) -> Result<Option<Outcome>> {
        while let Some(stop) = ptrace::try_wait(self.tid.raw()).map_err(Error::ptrace(self.tid, "wait"))? {
            if let Some(out) = self.on_syscall_stop(stop, child, entering)? {
                return Ok(Some(out));
            }
        }
        Ok(None)
    }

    /// One stop of a tracee running an injected call: the outcome at the
    /// syscall-exit stop; otherwise it is resumed.
    fn on_syscall_stop(
        &mut self,
        stop: Stop,
        child: &mut Option<HostPid>,
        entering: &mut bool,
    ) -> Result<Option<Outcome>> {
        let tid = self.tid;
        match stop {
            Stop::Syscall if *entering => *entering = false,
            Stop::Syscall => {
                let out = ptrace::regs(tid.raw()).map_err(Error::ptrace(tid, "GETREGS"))?;
                return Ok(Some(Outcome { ret: out.rax as i64, child: *child }));
            }
            Stop::Event { event: EVENT_FORK | EVENT_VFORK | EVENT_CLONE, .. } => {
                *child = Some(fork_child(tid)?);
            }
            Stop::Event { .. } => {}
            Stop::Signal(sig) => self.held.push(sig),
            Stop::Exited(code) => return Err(died(tid, &format!("exited with {code}"))),
            Stop::Killed(sig) => return Err(died(tid, &format!("killed by signal {sig}"))),
        }
        ptrace::resume_syscall(tid.raw(), 0).map_err(Error::ptrace(tid, "syscall"))?;
        Ok(None)
    }

    /// Run the code at `entry` (a batch program, `batch.rs`) until it stops
    /// itself with `SIGSTOP` with `rip` at `stop_at`; that `SIGSTOP` is
    /// dropped (another one, e.g. a queued signal put back, is held and
    /// sent again at the release). Every signal is blocked meanwhile, as
    /// for [`Tracee::syscall`].
    pub(crate) fn run_code(&mut self, entry: u64, stop_at: u64) -> Result<()> {
        let tid = self.tid;
        self.block_signals()?;
        let mut r = self.saved;
        r.rip = entry;
        r.orig_rax = u64::MAX;
        ptrace::set_regs(tid.raw(), &r).map_err(Error::ptrace(tid, "SETREGS"))?;
        ptrace::resume(tid.raw(), 0).map_err(Error::ptrace(tid, "cont"))?;
        loop {
            match ptrace::wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))? {
                Stop::Signal(sig) if sig == libc::SIGSTOP => {
                    if ptrace::regs(tid.raw()).map_err(Error::ptrace(tid, "GETREGS"))?.rip == stop_at {
                        return Ok(());
                    }
                    self.held.push(sig);
                }
                // Every other signal is blocked: one that comes is a fault
                // of the code itself, which would repeat forever.
                Stop::Signal(sig)
                    if [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS]
                        .contains(&sig) =>
                {
                    let rip = ptrace::regs(tid.raw()).map(|r| r.rip).unwrap_or(0);
                    return Err(died(tid, &format!("signal {sig} in injected code at {rip:#x}")));
                }
                Stop::Signal(sig) => self.held.push(sig),
                Stop::Exited(code) => return Err(died(tid, &format!("exited with {code}"))),
                Stop::Killed(sig) => return Err(died(tid, &format!("killed by signal {sig}"))),
                Stop::Event { .. } | Stop::Syscall => {}
            }
            ptrace::resume(tid.raw(), 0).map_err(Error::ptrace(tid, "cont"))?;
        }
    }

    /// [`Tracee::syscall`] that turns `-errno` into an error naming `what`.
    pub fn call(&mut self, what: &'static str, nr: i64, args: &[u64]) -> Result<u64> {
        let out = self.syscall(nr, args)?;
        if (-4095..0).contains(&out.ret) {
            return Err(Error::Remote {
                pid: self.tid,
                call: what,
                errno: io::Error::from_raw_os_error(-out.ret as i32),
            });
        }
        Ok(out.ret as u64)
    }

    /// Inject `clone(flags)` (no exit signal, no new stack) and return the
    /// child once it sits in its first stop with `PTRACE_O_EXITKILL`: its
    /// host pid, its pid in the sandbox and its registers. `what` names the
    /// call in errors; a child that cannot be readied is killed.
    pub(crate) fn clone_stopped(&mut self, flags: u64, what: &'static str) -> Result<(HostPid, SandboxPid, Regs)> {
        self.start_clone(flags)?;
        self.finish_clone(flags, what)
    }

    /// [`Tracee::clone_stopped`] in two halves, as [`Tracee::start_syscall`]
    /// and [`Tracee::finish_syscall`]: the copy runs meanwhile.
    pub(crate) fn start_clone(&mut self, flags: u64) -> Result<()> {
        self.start_syscall(libc::SYS_clone, &[flags, 0, 0, 0, 0])
    }

    /// See [`Tracee::start_clone`].
    pub(crate) fn finish_clone(&mut self, flags: u64, what: &'static str) -> Result<(HostPid, SandboxPid, Regs)> {
        let out = self.finish_syscall()?;
        self.cloned(out, (libc::SYS_clone, &[flags, 0, 0, 0, 0]), what)
    }

    /// [`Tracee::finish_clone`] once the call returned `out` (seen by
    /// [`Tracee::poll_syscall`]); `call` (number, arguments) is injected
    /// again while it asks to be restarted.
    pub(crate) fn cloned(
        &mut self,
        mut out: Outcome,
        (nr, args): (i64, &[u64]),
        what: &'static str,
    ) -> Result<(HostPid, SandboxPid, Regs)> {
        for _ in 0..5 {
            if out.ret != ERESTARTNOINTR {
                break;
            }
            out = self.syscall(nr, args)?;
        }
        let (Some(child), true) = (out.child, out.ret > 0) else {
            return Err(Error::Remote {
                pid: self.tid,
                call: what,
                errno: io::Error::from_raw_os_error((-out.ret) as i32),
            });
        };
        let ready = wait_event_stop(child)
            .and_then(|_| ptrace::set_exit_kill(child.raw(), true).map_err(Error::ptrace(child, "SETOPTIONS")))
            .and_then(|_| ptrace::regs(child.raw()).map_err(Error::ptrace(child, "GETREGS")));
        match ready {
            Ok(regs) => Ok((child, SandboxPid(out.ret as i32), regs)),
            Err(e) => {
                crate::inject::kill_tracee(child);
                Err(e)
            }
        }
    }

    /// Put the tracee into a `PTRACE_EVENT_STOP` (signal context) from
    /// whatever stop it is in.
    pub fn park(&mut self) -> Result<()> {
        let tid = self.tid;
        ptrace::interrupt(tid.raw()).map_err(Error::ptrace(tid, "interrupt"))?;
        ptrace::resume(tid.raw(), 0).map_err(Error::ptrace(tid, "cont"))?;
        loop {
            match ptrace::wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))? {
                Stop::Event { event: EVENT_STOP, .. } => return Ok(()),
                Stop::Signal(sig) => self.held.push(sig),
                Stop::Exited(code) => return Err(died(tid, &format!("exited with {code}"))),
                Stop::Killed(sig) => return Err(died(tid, &format!("killed by signal {sig}"))),
                Stop::Event { .. } | Stop::Syscall => {}
            }
            ptrace::resume(tid.raw(), 0).map_err(Error::ptrace(tid, "cont"))?;
        }
    }

    /// Send it `sig` once it is let go ([`Tracee::release`]), as a signal
    /// held back (a process restored stopped: `SIGSTOP`).
    pub(crate) fn hold(&mut self, sig: i32) {
        self.held.push(sig);
    }

    /// Signals held back so far (and forget them).
    pub fn take_held(&mut self) -> Vec<i32> {
        std::mem::take(&mut self.held)
    }

    /// Give the tracee back its registers `regs` and its signal mask in
    /// signal context and detach. Signals that became pending meanwhile are
    /// delivered then, by the kernel, in the restored context. (Held ones,
    /// only possible for signals that cannot be blocked, are sent again with
    /// `kill`: a signal passed to `PTRACE_DETACH` from this kind of stop is
    /// ignored.)
    pub fn release(mut self, regs: &Regs) -> Result<()> {
        self.park()?;
        self.release_parked(regs)
    }

    /// [`Tracee::release`] of a tracee already parked ([`Tracee::park`]):
    /// nothing here waits for the tracee to run, so a batch of them goes
    /// at once.
    pub fn release_parked(self, regs: &Regs) -> Result<()> {
        let tid = self.tid;
        ptrace::set_regs(tid.raw(), regs).map_err(Error::ptrace(tid, "SETREGS"))?;
        if let Some(mask) = self.mask {
            ptrace::set_sigmask(tid.raw(), mask).map_err(Error::ptrace(tid, "SETSIGMASK"))?;
        }
        if let Some(cpus) = &self.affinity {
            set_affinity(tid, cpus);
        }
        ptrace::detach(tid.raw(), 0).map_err(Error::ptrace(tid, "detach"))?;
        for &again in &self.held {
            if let Some(pid) = rustix::process::Pid::from_raw(tid.raw())
                && let Some(s) = rustix::process::Signal::from_named_raw(again)
            {
                let _ = rustix::process::kill_process(pid, s);
            }
        }
        Ok(())
    }
}

/// CPU affinity, as a list of CPUs.
pub fn affinity(tid: HostPid) -> Vec<u32> {
    let Some(pid) = rustix::process::Pid::from_raw(tid.raw()) else { return Vec::new() };
    match rustix::thread::sched_getaffinity(Some(pid)) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU).filter(|c| set.is_set(*c)).map(|c| c as u32).collect(),
        Err(_) => Vec::new(),
    }
}

/// Pin the calling thread to `cpus` (no-op for an empty list): a thread
/// that works beside the tracer, off its CPU.
pub fn pin_self(cpus: &[u32]) {
    set_affinity(HostPid(rustix::thread::gettid().as_raw_nonzero().get()), cpus);
}

/// Set the CPU affinity of `tid` to `cpus` (no-op for an empty list).
pub fn set_affinity(tid: HostPid, cpus: &[u32]) {
    let Some(pid) = rustix::process::Pid::from_raw(tid.raw()) else { return };
    if cpus.is_empty() {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    for c in cpus {
        set.set(*c as usize);
    }
    let _ = rustix::thread::sched_setaffinity(Some(pid), &set);
}

thread_local! {
    /// The CPU this tracer thread is pinned to.
    static TRACER_CPU: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Pin the calling (tracer) thread to the CPU it runs on. A tracee woken
/// on the tracer's CPU hands control back and forth without cross-CPU
/// wake-ups: an injected syscall costs ~10 µs instead of ~50 µs.
pub fn pin_tracer_thread() {
    let cpu = rustix::thread::sched_getcpu() as u32;
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu as usize);
    if rustix::thread::sched_setaffinity(None, &set).is_ok() {
        TRACER_CPU.with(|c| c.set(Some(cpu)));
    }
}

thread_local! {
    /// Whether the tracer thread stepped off its CPU ([`step_aside`]).
    static ASIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Move the calling (tracer) thread off its CPU until [`step_back`] (a
/// no-op when it is not pinned, or there is no other CPU): processes about
/// to be let go were pinned to the tracer's CPU, and the kernel wakes a
/// task where it last ran (or where its waker runs), even with another
/// CPU idle; woken there, each preempted the tracer until it slept. With
/// the tracer elsewhere (a migration, ~50 µs), they run on its CPU while
/// it lets the next one go.
pub fn step_aside() {
    if TRACER_CPU.with(|c| c.get()).is_some() {
        pin_self(&off_tracer_cpus());
        ASIDE.with(|a| a.set(true));
    }
}

/// Back on the tracer's CPU after [`step_aside`].
pub fn step_back() {
    if ASIDE.with(|a| a.replace(false))
        && let Some(cpu) = TRACER_CPU.with(|c| c.get())
    {
        pin_self(&[cpu]);
    }
}

/// Move `tid` off the tracer's CPU before it is killed: a pool process
/// (template, standby, holder) is pinned there, and its death tears its
/// memory down in its own context, which would hold the tracer's CPU for
/// milliseconds (a 100 MB address space: 2-4 ms).
pub fn move_off_tracer(tid: HostPid) {
    if TRACER_CPU.with(|c| c.get()).is_some() {
        set_affinity(tid, &off_tracer_cpus());
    }
}

/// The CPUs other than the tracer's (all of them when it is not pinned,
/// or is the only one).
pub fn off_tracer_cpus() -> Vec<u32> {
    let all = affinity(HostPid(std::process::id() as i32));
    let Some(cpu) = TRACER_CPU.with(|c| c.get()) else { return all };
    let others: Vec<u32> = all.iter().copied().filter(|c| *c != cpu).collect();
    if others.is_empty() { all } else { others }
}

/// Run `tid` on the tracer's CPU while we inject into it (the caller puts
/// its own affinity back before letting it go).
pub fn pin_to_tracer(tid: HostPid) {
    if let Some(cpu) = TRACER_CPU.with(|c| c.get()) {
        set_affinity(tid, &[cpu]);
    }
}

/// Run `work` on stopped tracee `t` with `len` bytes of the dead space
/// below its stack's red zone at its disposal (`rsp` its stack pointer;
/// nothing lives there while it is stopped at a syscall or signal
/// boundary): `work` gets their address. What was there is put back after,
/// whatever `work` returned.
pub(crate) fn below_red_zone<T>(
    t: &mut Tracee,
    rsp: u64,
    len: usize,
    work: impl FnOnce(&mut Tracee, u64) -> Result<T>,
) -> Result<T> {
    let tid = t.tid;
    let at = (rsp - 128 - len as u64) & !15;
    let mut saved = vec![0u8; len];
    ptrace::read_mem(tid.raw(), at, &mut saved).map_err(Error::ptrace(tid, "read below the stack"))?;
    let done = work(t, at);
    let back = ptrace::write_mem(tid.raw(), at, &saved).map_err(Error::ptrace(tid, "write below the stack"));
    let out = done?;
    back.map(|()| out)
}

/// SIGKILL a tracee and collect its exit notification (the tracer's part;
/// init, its real parent, reaps it).
pub(crate) fn kill_tracee(host: HostPid) {
    crate::inject::move_off_tracer(host);
    let _ = sandtree_sys::ptrace::kill(host.raw());
    loop {
        match sandtree_sys::ptrace::wait(host.raw()) {
            Ok(sandtree_sys::ptrace::Stop::Exited(_) | sandtree_sys::ptrace::Stop::Killed(_)) | Err(_) => return,
            Ok(_) => {
                let _ = sandtree_sys::ptrace::resume(host.raw(), 0);
            }
        }
    }
}

/// `sizeof(struct clone_args)` up to and including `cgroup` (v2 layout).
pub(crate) const CLONE_ARGS_SIZE: u64 = 88;

/// Where in the scratch page the `set_tid` array goes.
pub(crate) const SET_TID_OFFSET: u64 = 128;

pub(crate) fn clone_args(set_tid: u64, flags: u64) -> Vec<u8> {
    let fields: [u64; 11] = [
        flags,   // CLONE_PARENT (| CLONE_VM from a standby)
        0,       // pidfd
        0,       // child_tid
        0,       // parent_tid
        0,       // exit_signal: CLONE_PARENT requires 0
        0,       // stack
        0,       // stack_size
        0,       // tls
        set_tid, // set_tid (pid_t array)
        1,       // set_tid_size: the sandbox's namespace only
        0,       // cgroup
    ];
    fields.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// Write `args` ([`clone_args`]) at `scratch` of stopped process `pid`, and
/// `tid` as its one-entry `set_tid` array, for an injected `clone3`.
pub(crate) fn write_clone_args(pid: HostPid, scratch: u64, args: &[u8], tid: SandboxPid) -> Result<()> {
    ptrace::write_mem(pid.raw(), scratch, args)
        .and_then(|_| ptrace::write_mem(pid.raw(), scratch + SET_TID_OFFSET, &tid.raw().to_ne_bytes()))
        .map_err(Error::ptrace(pid, "write clone_args"))
}

/// The nice value a restore's copy and fix-up run at (see
/// `restore::restore_one`), and a standby fork that a job waits for (`memory_holder.rs`).
pub(crate) const RESTORE_NICE: i32 = -10;

pub(crate) fn nice_of(tid: HostPid) -> Option<i32> {
    rustix::process::getpriority_process(rustix::process::Pid::from_raw(tid.raw())).ok()
}

pub(crate) fn set_nice(tid: HostPid, nice: i32) {
    let _ = rustix::process::setpriority_process(rustix::process::Pid::from_raw(tid.raw()), nice);
}

/// The nice value of a standby fork under way while a rollback runs (until
/// it ends: `Pool::forks_to_foreground`), and of a killed holder's teardown:
/// background work. Nice orders the tasks of one CPU group: these run in
/// the sandbox's, beside init and the restore's calls (at `RESTORE_NICE`),
/// which a fork at nice 0 took CPU share from. (Against the daemon's
/// threads, another group, nice does little: docs/architecture/process-pool.md.)
pub(crate) const BACKGROUND_NICE: i32 = 19;
