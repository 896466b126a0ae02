//! Signals: the mask and handlers a fork copies; what it does not — the
//! signals pending (captured in pass 1 with their `siginfo_t`, queued again
//! in the restored process, to the thread or the process as they were) and,
//! for a process restored from a standby, the alternate signal stack.

use sandtree_sys::ptrace;

use crate::batch::{Arg, Batch};
use crate::inject::Tracee;
use crate::model::{ProcessImage, QueuedSignal};
use crate::pid::HostPid;
use crate::{Error, Result, SandboxPid};

/// `rt_sigtimedwait`'s answer when nothing of its set is pending.
const EAGAIN: i64 = -(libc::EAGAIN as i64);

/// Pass 1: the signals pending for stopped process `host` (`pending`: the
/// mask of them), with their `siginfo_t`, thread-directed ones first.
pub(crate) fn capture_pending(host: HostPid, pending: u64) -> Result<Vec<QueuedSignal>> {
    let mut queued = Vec::new();
    if pending != 0 {
        for shared in [false, true] {
            for info in ptrace::pending_siginfo(host.raw(), shared).map_err(Error::ptrace(host, "PEEKSIGINFO"))? {
                queued.push(QueuedSignal { shared, siginfo: info.to_vec() });
            }
        }
    }
    Ok(queued)
}

/// At the restore (in `b`): the alternate signal stack, which a `CLONE_VM`
/// child does not keep (a plain fork keeps it; but a template made from a
/// standby has the previous checkpoint's stack, `incremental.rs`).
pub(crate) fn restore_altstack(b: &mut Batch, image: &ProcessImage, (via_standby, incremental): (bool, bool)) {
    if !(via_standby || incremental) {
        return;
    }
    match &image.altstack {
        Some(ss) => {
            let ss = b.data(ss);
            b.call("sigaltstack", libc::SYS_sigaltstack, &[ss, Arg::Val(0)]);
        }
        None if incremental => {
            // stack_t { ss_sp, ss_flags = SS_DISABLE, ss_size }.
            let mut off = [0u8; 24];
            off[8..12].copy_from_slice(&libc::SS_DISABLE.to_ne_bytes());
            let ss = b.data(&off);
            b.call("sigaltstack", libc::SYS_sigaltstack, &[ss, Arg::Val(0)]);
        }
        None => {}
    }
}

/// At the restore, last (after the batches: a batch ends with a SIGSTOP,
/// which would discard a pending SIGCONT): the signals pending at the
/// checkpoint, queued again with their siginfo, to the thread or the
/// process as they were (a process may queue any siginfo to itself), one
/// call at a time.
pub(crate) fn requeue(
    p: &mut Tracee,
    image: &ProcessImage,
    scratch: u64,
    threads: &mut [(Tracee, ptrace::Regs)],
) -> Result<()> {
    // Each other thread's own, queued by that thread itself (made again by
    // now, in the image's order): the kernel lets only the target thread
    // queue a siginfo that says `tgkill` (`SI_TKILL`) or the kernel sent it.
    for (t, (tracee, _)) in image.other_threads.iter().zip(threads.iter_mut()) {
        for q in &t.queued {
            let sig = q.signo() as u64;
            ptrace::write_mem(p.tid.raw(), scratch + 1024, &q.siginfo)
                .map_err(Error::ptrace(p.tid, "write siginfo"))?;
            let (me, thread) = (image.pid.raw() as u64, t.tid.raw() as u64);
            let args = [me, thread, sig, scratch + 1024];
            tracee.call("rt_tgsigqueueinfo (a thread's)", libc::SYS_rt_tgsigqueueinfo, &args)?;
        }
    }
    for q in &image.queued_signals {
        queue_again(p, image.pid, q, scratch + 1024)?;
    }
    Ok(())
}

/// Queue `q` again in the stopped process `p` (its main thread; `pid` in
/// the sandbox): to the process or to that thread, as it was, with its
/// `siginfo` written at `at` in its memory (a process may queue any
/// siginfo to itself).
pub(crate) fn queue_again(p: &mut Tracee, pid: SandboxPid, q: &QueuedSignal, at: u64) -> Result<()> {
    ptrace::write_mem(p.tid.raw(), at, &q.siginfo).map_err(Error::ptrace(p.tid, "write siginfo"))?;
    let (me, sig) = (pid.raw() as u64, q.signo() as u64);
    match q.shared {
        true => p.call("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo, &[me, sig, at])?,
        false => p.call("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo, &[me, me, sig, at])?,
    };
    Ok(())
}

/// Take every pending signal of `set` (a mask: bit `n - 1` for signal
/// `n`) out of the stopped process `p` (its thread's queue and the
/// process's), by injected `rt_sigtimedwait`s that do not wait; `at`: 24
/// bytes of its memory for the set and the (zero) timeout.
pub(crate) fn take_pending(p: &mut Tracee, set: u64, at: u64) -> Result<()> {
    let mut set_and_timeout = set.to_ne_bytes().to_vec();
    set_and_timeout.extend_from_slice(&[0u8; 16]);
    ptrace::write_mem(p.tid.raw(), at, &set_and_timeout).map_err(Error::ptrace(p.tid, "write sigset"))?;
    // (At most one of each standard signal per queue; real-time ones queue.)
    for _ in 0..64 {
        match p.syscall(libc::SYS_rt_sigtimedwait, &[at, 0, at + 8, 8])?.ret {
            EAGAIN => break,
            ret if ret < 0 => {
                let errno = std::io::Error::from_raw_os_error(-ret as i32);
                return Err(Error::Remote { pid: p.tid, call: "rt_sigtimedwait", errno });
            }
            _ => {}
        }
    }
    Ok(())
}
