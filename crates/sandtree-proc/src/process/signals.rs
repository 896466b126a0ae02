//! Signals: the mask and handlers a fork copies; what it does not — the
//! signals pending (captured in pass 1 with their `siginfo_t`, queued again
//! in the restored process, to the thread or the process as they were) and,
//! for a process restored from a standby, the alternate signal stack.

use sandtree_sys::ptrace;

use crate::batch::{Arg, Batch};
use crate::inject::Tracee;
use crate::model::{ProcessImage, QueuedSignal};
use crate::pid::HostPid;
use crate::{Error, Result};

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
            let sig = u32::from_ne_bytes(q.siginfo[..4].try_into().unwrap_or_default()) as u64;
            ptrace::write_mem(p.tid.raw(), scratch + 1024, &q.siginfo)
                .map_err(Error::ptrace(p.tid, "write siginfo"))?;
            let (me, thread) = (image.pid.raw() as u64, t.tid.raw() as u64);
            let args = [me, thread, sig, scratch + 1024];
            tracee.call("rt_tgsigqueueinfo (a thread's)", libc::SYS_rt_tgsigqueueinfo, &args)?;
        }
    }
    for q in &image.queued_signals {
        let sig = u32::from_ne_bytes(q.siginfo[..4].try_into().unwrap_or_default()) as u64;
        ptrace::write_mem(p.tid.raw(), scratch + 1024, &q.siginfo).map_err(Error::ptrace(p.tid, "write siginfo"))?;
        let me = image.pid.raw() as u64;
        if q.shared {
            p.call("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo, &[me, sig, scratch + 1024])?;
        } else {
            p.call("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo, &[me, me, sig, scratch + 1024])?;
        }
    }
    Ok(())
}
