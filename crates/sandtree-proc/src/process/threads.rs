//! Threads other than the main one, which a fork does not copy: each is
//! captured in pass 1 (registers from its stop, its XSAVE area, mask,
//! rseq, robust list, name, and, by calls injected into it, its
//! `clear_child_tid` and alternate signal stack) and made again in the
//! restored process (`clone3` with `CLONE_THREAD` and its old tid), given
//! all of that back. Also the per-thread registrations of the main thread
//! that a `CLONE_VM` child does not keep (rseq, robust list), and the rseq
//! abort of a thread stopped inside a critical section.

use sandtree_sys::ptrace;

use crate::batch::{Arg, Batch};
use crate::inject::{self, SET_TID_OFFSET, Tracee, clone_args, write_clone_args};
use crate::model::{ProcessImage, Registers};
use crate::pid::{HostPid, SandboxPid};
use crate::stop::StoppedProcess;
use crate::{Error, Result};

/// What a fork does not copy of a thread other than the main one: its
/// registers (general ones from the stop, the XSAVE area), mask, rseq,
/// robust list, name, and — read by calls injected into it, into the dead
/// space below its stack's red zone — its `clear_child_tid` and alternate
/// signal stack. Its tracee joins `tracees` as soon as a call is injected.
/// `main_status`: the process's `status` (its main thread's), read in the
/// pass already.
pub(crate) fn capture(
    s: &StoppedProcess,
    main_status: &str,
    (tid, ns_tid, regs): (HostPid, SandboxPid, ptrace::Regs),
    insn: u64,
    tracees: &mut Vec<(Tracee, ptrace::Regs)>,
) -> Result<crate::model::ThreadImage> {
    let comm = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", s.host)).unwrap_or_default();
    let comm = comm.trim_end().to_string();
    // A thread made at the restore takes the main thread's credentials.
    if let Some(what) = own_credentials(main_status, s.host, tid) {
        return Err(Error::unsupported(
            s.ns_pid,
            &comm,
            "threads",
            format!(
                "thread {ns_tid} runs with other {what} than the main thread (set for that thread alone): a thread made again at the restore takes the main thread's (not captured yet)"
            ),
        ));
    }
    // Signals pending for it alone (a fork's thread has none: queued again
    // at the restore, `signals::requeue`).
    let queued = ptrace::pending_siginfo(tid.raw(), false)
        .map_err(Error::ptrace(tid, "PEEKSIGINFO"))?
        .into_iter()
        .map(|info| crate::model::QueuedSignal { shared: false, siginfo: info.to_vec() })
        .collect();
    let mut image_regs = regs;
    restart_block_lost(&mut image_regs);
    let xstate = ptrace::xstate(tid.raw()).map_err(Error::ptrace(tid, "GETREGSET (xstate)"))?;
    let blocked = ptrace::sigmask(tid.raw()).map_err(Error::ptrace(tid, "GETSIGMASK"))?;
    let rseq = ptrace::rseq_configuration(tid.raw()).ok().flatten();
    rseq_abort(tid, rseq, &mut image_regs);
    let affinity = inject::affinity(tid);
    let robust_list = ptrace::robust_list(tid.raw()).map_err(Error::ptrace(tid, "get_robust_list"))?;
    ptrace::set_exit_kill(tid.raw(), true).map_err(Error::ptrace(tid, "SETOPTIONS"))?;
    tracees.push((Tracee::new(tid, regs, insn), regs));
    let t = &mut tracees.last_mut().expect("just pushed").0;
    let buf = (regs.rsp - 128 - 64) & !15;
    let mut saved = [0u8; 32];
    ptrace::read_mem(tid.raw(), buf, &mut saved).map_err(|e| {
        Error::unsupported(s.ns_pid, &comm, "stack", format!("no room below thread {ns_tid}'s stack pointer ({e})"))
    })?;
    const PR_GET_TID_ADDRESS: u64 = 40;
    t.call("prctl(PR_GET_TID_ADDRESS)", libc::SYS_prctl, &[PR_GET_TID_ADDRESS, buf])?;
    let mut addr = [0u8; 8];
    ptrace::read_mem(tid.raw(), buf, &mut addr).map_err(Error::ptrace(tid, "read result"))?;
    t.call("sigaltstack", libc::SYS_sigaltstack, &[0, buf])?;
    let mut ss = vec![0u8; 24];
    ptrace::read_mem(tid.raw(), buf, &mut ss).map_err(Error::ptrace(tid, "read result"))?;
    ptrace::write_mem(tid.raw(), buf, &saved).map_err(Error::ptrace(tid, "restore stack"))?;
    let flags = i32::from_ne_bytes(ss[8..12].try_into().unwrap_or_default());
    Ok(crate::model::ThreadImage {
        tid: ns_tid,
        regs: Registers::from(&image_regs),
        affinity,
        xstate,
        blocked,
        rseq,
        robust_list,
        clear_child_tid: u64::from_ne_bytes(addr),
        altstack: (flags & libc::SS_DISABLE == 0).then_some(ss),
        comm,
        queued,
    })
}

/// A thread stopped inside an rseq critical section resumes at its abort
/// handler when restored (the kernel would have sent it there had it been
/// preempted; our injected calls, made outside the section, clear the
/// kernel's view of it). `struct rseq` holds the current `rseq_cs`
/// pointer at offset 8; `struct rseq_cs { u32 version, flags; u64
/// start_ip, post_commit_offset, abort_ip }`.
pub(crate) fn rseq_abort(tid: HostPid, rseq: Option<(u64, u32, u32, u32)>, regs: &mut ptrace::Regs) {
    let Some((area, ..)) = rseq else { return };
    let mut ptr = [0u8; 8];
    if ptrace::read_mem(tid.raw(), area + 8, &mut ptr).is_err() {
        return;
    }
    let cs = u64::from_ne_bytes(ptr);
    let mut desc = [0u8; 32];
    if cs == 0 || ptrace::read_mem(tid.raw(), cs, &mut desc).is_err() {
        return;
    }
    let word = |i: usize| u64::from_ne_bytes(desc[i..i + 8].try_into().unwrap_or_default());
    let (start, len, abort) = (word(8), word(16), word(24));
    if regs.rip >= start && regs.rip < start.saturating_add(len) {
        regs.rip = abort;
    }
}

/// What of thread `tid`'s credentials (of process `host`) differs from
/// the main thread's, whose `status` is `main`: user ids, group ids,
/// supplementary groups or capabilities (raw `setresuid` and the like
/// change one thread's alone; glibc's change every thread's). `None` when
/// they are the same, or cannot be read.
fn own_credentials(main: &str, host: HostPid, tid: HostPid) -> Option<&'static str> {
    if main.is_empty() {
        return None;
    }
    let thread = std::fs::read_to_string(format!("/proc/{host}/task/{tid}/status")).ok()?;
    let line = |text: &str, key: &str| text.lines().find(|l| l.starts_with(key)).map(str::to_string);
    [
        ("Uid:", "user ids"),
        ("Gid:", "group ids"),
        ("Groups:", "groups"),
        ("CapEff:", "capabilities"),
        ("CapPrm:", "capabilities"),
        ("CapInh:", "capabilities"),
    ]
    .into_iter()
    .find(|(key, _)| line(main, key) != line(&thread, key))
    .map(|(_, what)| what)
}

/// The process's other threads again, each with its tid (`clone3` with
/// `set_tid`, `CLONE_THREAD`, its TLS), injected into the main thread; in
/// each new thread (stopped at birth): its XSAVE area, robust list,
/// `clear_child_tid`, rseq, alternate stack and name. Their tracees go to
/// `out`, to be let go with their registers and masks after the main one.
pub(crate) fn restore(
    p: &mut Tracee,
    image: &ProcessImage,
    scratch: u64,
    out: &mut Vec<(Tracee, ptrace::Regs)>,
    mut last_pid: Option<&mut crate::LastPid>,
) -> Result<()> {
    const FLAGS: u64 = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS) as u64;
    let pid = p.tid;
    for th in &image.other_threads {
        let regs = th.regs.to_sys();
        let mut args = clone_args(scratch + SET_TID_OFFSET, FLAGS);
        // struct clone_args: tls is the 8th field.
        args[56..64].copy_from_slice(&regs.fs_base.to_ne_bytes());
        write_clone_args(pid, scratch, &args, th.tid)?;
        // A killed thread's tid is free once it is gone. (A process that
        // may not choose a tid: through `ns_last_pid`.)
        let by_last_pid = last_pid.as_deref_mut().filter(|_| !crate::check::may_choose_pid(image));
        let made = super::clone3_as(p, scratch, th.tid, by_last_pid, &mut 0, true)?;
        let (Some(tid), true) = (made.child, made.ret > 0) else {
            return Err(Error::Remote {
                pid,
                call: "clone3 (thread)",
                errno: std::io::Error::from_raw_os_error((-made.ret) as i32),
            });
        };
        inject::wait_event_stop(tid)?;
        out.push((Tracee::new(tid, regs, p.insn).with_mask(th.blocked), regs));
        let t = &mut out.last_mut().expect("just pushed").0;
        ptrace::set_xstate(tid.raw(), &th.xstate).map_err(Error::ptrace(tid, "SETREGSET (xstate)"))?;
        if th.robust_list.0 != 0 {
            t.call("set_robust_list", libc::SYS_set_robust_list, &[th.robust_list.0, th.robust_list.1])?;
        }
        t.call("set_tid_address", libc::SYS_set_tid_address, &[th.clear_child_tid])?;
        if let Some((area, len, _, sig)) = th.rseq {
            t.call("rseq", libc::SYS_rseq, &[area, len as u64, 0, sig as u64])?;
        }
        if let Some(ss) = &th.altstack {
            ptrace::write_mem(tid.raw(), scratch + 1024, ss).map_err(Error::ptrace(tid, "write stack_t"))?;
            t.call("sigaltstack", libc::SYS_sigaltstack, &[scratch + 1024, 0])?;
        }
        // Its name: only a thread of the group may write its comm.
        let mut name = th.comm.as_bytes().to_vec();
        name.truncate(15);
        name.push(0);
        ptrace::write_mem(tid.raw(), scratch + 1024, &name).map_err(Error::ptrace(tid, "write name"))?;
        const PR_SET_NAME: u64 = 15;
        t.call("prctl(PR_SET_NAME)", libc::SYS_prctl, &[PR_SET_NAME, scratch + 1024])?;
        crate::inject::set_affinity(tid, &th.affinity);
    }
    Ok(())
}

/// At the restore, the main thread's registrations a `CLONE_VM` child does
/// not keep (in `b`): rseq (`via_standby`: a plain fork keeps it; a
/// template made from a standby had it checked equal), and the robust
/// futex list (neither keeps it).
pub(crate) fn restore_registrations(b: &mut Batch, image: &ProcessImage, via_standby: bool) {
    if via_standby && let Some((area, len, _, sig)) = image.rseq {
        let args = [Arg::Val(area), Arg::Val(len as u64), Arg::Val(0), Arg::Val(sig as u64)];
        b.call("rseq", libc::SYS_rseq, &args);
    }
    if let Some((head, len)) = image.robust_list
        && head != 0
    {
        b.call("set_robust_list", libc::SYS_set_robust_list, &[Arg::Val(head), Arg::Val(len)]);
    }
}

/// Registers `regs` of a thread made again other than by a fork of its
/// own (a process's other threads; a child made by its parent,
/// `transplant.rs`): its `restart_block` (an interrupted nanosleep's or
/// futex wait's deadline) is not copied to it, so a call interrupted with
/// `-ERESTART_RESTARTBLOCK` returns `EINTR` instead of a restart, which
/// callers of those calls handle.
pub(crate) fn restart_block_lost(regs: &mut ptrace::Regs) {
    const ERESTART_RESTARTBLOCK: u64 = (-516i64) as u64;
    if regs.rax == ERESTART_RESTARTBLOCK && (regs.orig_rax as i64) >= 0 {
        regs.rax = (-(libc::EINTR as i64)) as u64;
    }
}
