//! Interval timers (`setitimer`) and POSIX timers (`timer_create`), which
//! a fork does not copy: read in pass 1 by calls injected into the stopped
//! process (with its alternate signal stack and child-subreaper flag, in
//! the same dead space below its stack pointer), and armed again in the
//! restored process.
//!
//! A POSIX timer is listed by `/proc/<pid>/timers` (id, signal and value,
//! how it notifies and whom, clock) and read by an injected
//! `timer_gettime` (its interval and the time left, relative). The
//! restore makes each again with its id, after the threads (one may
//! signal a thread): `prctl(PR_TIMER_CREATE_RESTORE_IDS, ON)` (Linux
//! 6.17; a kernel without it refuses such a process at the checkpoint),
//! `timer_create` with the id asked for and its `sigevent`, then
//! `timer_settime` with the time that was left, and the prctl off again.
//! Not kept: overruns not delivered yet, and an absolute timer's
//! absoluteness (it is armed for the time that was left). A timer signal
//! that was pending comes back with the pending signals.

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

/// Pass 1: the POSIX timers `listed` of the original (`procfs::posix_timers`),
/// each read by an injected `timer_gettime` below its stack. The thread a
/// timer signals is named by its id in the sandbox (`threads`: host and
/// sandbox ids of the process's threads, the main one first).
pub(crate) fn capture_posix(
    s: &StoppedProcess,
    orig: &mut Tracee,
    listed: &[crate::procfs::ListedTimer],
    threads: &[(crate::HostPid, crate::SandboxPid)],
) -> Result<Vec<crate::model::PosixTimer>> {
    crate::inject::below_red_zone(orig, s.regs.rsp, 32, |orig, buf| {
        let mut out = Vec::new();
        for &(id, signo, value, notify, who, clock) in listed {
            orig.call("timer_gettime", libc::SYS_timer_gettime, &[id as u64, buf])?;
            let mut setting = vec![0u8; 32];
            ptrace::read_mem(orig.tid.raw(), buf, &mut setting).map_err(Error::ptrace(orig.tid, "read a timer"))?;
            let thread = match notify & libc::SIGEV_THREAD_ID != 0 {
                true => {
                    Some(threads.iter().find(|(host, _)| host.raw() == who).map(|&(_, ns)| ns).ok_or_else(|| {
                        Error::unsupported(
                            s.ns_pid,
                            "",
                            format!("POSIX timer {id}"),
                            format!("it signals thread {who}, which is not one of the process's"),
                        )
                    })?)
                }
                false => None,
            };
            out.push(crate::model::PosixTimer { id, clock, notify, signo, value, thread, setting });
        }
        Ok(out)
    })
}

/// At the restore, once its threads are back: the image's POSIX timers made
/// again with their ids, and armed (in `b`; see the module docs).
pub(crate) fn restore_posix(b: &mut Batch, image: &ProcessImage) {
    if image.posix_timers.is_empty() {
        return;
    }
    let prctl = |b: &mut Batch, on: u64| {
        let opt = sandtree_sys::process::PR_TIMER_CREATE_RESTORE_IDS as u64;
        let args = [Arg::Val(opt), Arg::Val(on), Arg::Val(0), Arg::Val(0), Arg::Val(0)];
        b.call("prctl(PR_TIMER_CREATE_RESTORE_IDS)", libc::SYS_prctl, &args);
    };
    prctl(b, 1);
    for t in &image.posix_timers {
        // struct sigevent: sigev_value, sigev_signo, sigev_notify, then
        // the thread id (SIGEV_THREAD_ID); 64 bytes.
        let mut sev = Vec::with_capacity(64);
        sev.extend_from_slice(&t.value.to_ne_bytes());
        sev.extend_from_slice(&t.signo.to_ne_bytes());
        sev.extend_from_slice(&t.notify.to_ne_bytes());
        sev.extend_from_slice(&t.thread.map_or(0, |p| p.raw()).to_ne_bytes());
        sev.resize(64, 0);
        let sev = b.data(&sev);
        let id = b.data(&t.id.to_ne_bytes());
        b.call("timer_create", libc::SYS_timer_create, &[Arg::Val(t.clock as u64), sev, id]);
        if t.setting.iter().any(|v| *v != 0) {
            // (A periodic timer that expired and waits to be re-armed reads
            // as no time left: armed for one interval.)
            let mut setting = t.setting.clone();
            if setting.len() == 32 && setting[16..].iter().all(|v| *v == 0) {
                let interval = setting[..16].to_vec();
                setting[16..].copy_from_slice(&interval);
            }
            let setting = b.data(&setting);
            b.call(
                "timer_settime",
                libc::SYS_timer_settime,
                &[Arg::Val(t.id as u64), Arg::Val(0), setting, Arg::Val(0)],
            );
        }
    }
    prctl(b, 0);
}
