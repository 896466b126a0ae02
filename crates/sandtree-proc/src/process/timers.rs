//! Interval timers (`setitimer`), which a fork does not copy: read in
//! pass 1 by calls injected into the stopped process (with its alternate
//! signal stack and child-subreaper flag, in the same dead space below its
//! stack pointer), and armed again in the restored process. POSIX timers
//! (`timer_create`) are refused (see `checkpoint::clone_of`).

use sandtree_sys::ptrace;

use crate::batch::{Arg, Batch};
use crate::inject::Tracee;
use crate::model::ProcessImage;
use crate::stop::StoppedProcess;
use crate::{Error, Result};

/// Armed interval timers: (which, raw `struct itimerval`).
pub(crate) type Itimers = Vec<(i32, Vec<u8>)>;

/// Pass 1: the original's interval timers (all three, armed or not), alternate
/// signal stack and child-subreaper flag, by injected calls. Interval
/// timers and the flag are not inherited by fork: they are read into the
/// dead space below the stack's red zone (nothing lives there while the
/// process is stopped at a syscall or signal boundary).
pub(crate) fn capture(s: &StoppedProcess, orig: &mut Tracee) -> Result<(Itimers, Option<Vec<u8>>, bool)> {
    let host = s.host;
    let buf = (s.regs.rsp - 128 - 64) & !15;
    let mut saved = [0u8; 32];
    ptrace::read_mem(host.raw(), buf, &mut saved).map_err(|e| {
        let comm = std::fs::read_to_string(format!("/proc/{host}/comm")).unwrap_or_default();
        Error::unsupported(
            s.ns_pid,
            comm.trim_end(),
            "stack",
            format!("no room below its stack pointer to read timers into ({e})"),
        )
    })?;
    let mut read = |nr: i64, args: &[u64], len: usize| -> Result<Vec<u8>> {
        orig.call("timers / sigaltstack", nr, args)?;
        let mut val = vec![0u8; len];
        ptrace::read_mem(host.raw(), buf, &mut val).map_err(Error::ptrace(host, "read result"))?;
        Ok(val)
    };
    let mut itimers = Vec::new();
    for which in [libc::ITIMER_REAL, libc::ITIMER_VIRTUAL, libc::ITIMER_PROF] {
        // struct itimerval { it_interval, it_value }.
        itimers.push((which, read(libc::SYS_getitimer, &[which as u64, buf], 32)?));
    }
    // stack_t { ss_sp, ss_flags, ss_size }: a fork keeps it, but a
    // restore that shares a standby's memory (CLONE_VM) does not.
    let ss = read(libc::SYS_sigaltstack, &[0, buf], 24)?;
    let flags = i32::from_ne_bytes(ss[8..12].try_into().unwrap_or_default());
    let altstack = (flags & libc::SS_DISABLE == 0).then_some(ss);
    let subreaper = read(libc::SYS_prctl, &[libc::PR_GET_CHILD_SUBREAPER as u64, buf], 4)?;
    let child_subreaper = i32::from_ne_bytes(subreaper[..4].try_into().unwrap_or_default()) != 0;
    ptrace::write_mem(host.raw(), buf, &saved).map_err(Error::ptrace(host, "restore stack"))?;
    Ok((itimers, altstack, child_subreaper))
}

/// A periodic real timer that expired while its SIGALRM waits to be
/// dequeued reads as value 0 (the kernel re-arms it at the dequeue; a
/// disarmed one has no interval either): setting that would disarm it, so
/// it is armed for one interval. Its SIGALRM is among the queued signals if
/// it expired before they were read; if it expired since (the timer fires
/// while the process is stopped), that one tick is lost, not the timer.
/// Disarmed timers are dropped.
pub(crate) fn normalize(itimers: &mut Itimers) {
    for (which, val) in itimers.iter_mut() {
        let interval: [u8; 16] = val[..16].try_into().unwrap_or_default();
        if *which == libc::ITIMER_REAL && val[16..].iter().all(|b| *b == 0) && interval.iter().any(|b| *b != 0) {
            val[16..].copy_from_slice(&interval);
        }
    }
    itimers.retain(|(_, val)| val[16..].iter().any(|b| *b != 0));
}

/// At the restore: arm the image's interval timers again (in `b`).
pub(crate) fn restore(b: &mut Batch, image: &ProcessImage) {
    for (which, val) in &image.itimers {
        let val = b.data(val);
        b.call("setitimer", libc::SYS_setitimer, &[Arg::Val(*which as u64), val, Arg::Val(0)]);
    }
}
