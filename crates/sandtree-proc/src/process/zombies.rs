//! Zombies: children that exited and that their parent had not waited for
//! yet at the checkpoint (a shell's `$(id -u)` between its end and the
//! shell's `wait`, a job that finished while the shell was busy, a worker
//! its server reaps on its next loop). A fork copies no child, so a restore
//! makes each again, as a child of its restored parent that ends at once
//! the same way: the parent's `wait` then finds it, with its status, as it
//! would have.
//!
//! **Capture** (`stop.rs`, once every process is stopped, so that no child
//! can exit any more): each zombie child of a stopped process (of any of
//! its threads), as a [`ZombieImage`]: pid, group, session, name, wait
//! status (`stat` field 52), exit signal (field 38), ids. One killed by a
//! signal that dumped core is refused (a restore cannot end a process so
//! without writing a core).
//!
//! **Checks** ([`refusal`], at the checkpoint, on every image): the parent
//! is refused, naming the zombie, when a restore could not make it as it
//! was: other user or group ids than its parent's (it is made as a copy
//! of its parent); its parent ignores its exit signal now (`SIG_IGN` on
//! `SIGCHLD`: the kernel would reap the new one at once); another session
//! than its parent's, unless it leads its own with no process in it; a
//! group it could not join at the restore (see below: one led by a live
//! process, which takes its group only at its own turn), or a group it
//! leads with members that are not children of its parent (those are made
//! elsewhere, by a surrogate of the gone leader, `restore.rs`); a group
//! that is its terminal's foreground group (given back by a live leader
//! alone); a zombie of another pid namespace than the sandbox's.
//!
//! **Restore** ([`make`], in `restore.rs`: once the parent is fixed up,
//! still stopped). For each zombie:
//! 1. `clone3(CLONE_VM | CLONE_FILES | CLONE_FS, exit_signal, set_tid =
//!    [pid])` injected into the parent (or through `ns_last_pid`, as for
//!    any process that may not choose its pid): the child shares the
//!    parent's memory and descriptors until it ends (its end closes none);
//!    for a signal whose default action dumps core, a plain fork instead
//!    (its own copy of the memory, made not dumpable below);
//! 2. in the child: its name (`PR_SET_NAME`), then its group or session:
//!    `setsid` (it led its own), `setpgid(0, 0)` (it led its own group),
//!    `setpgid(0, pgid)` (another's, once its parent's other children are
//!    back: [`Phase::Last`]);
//! 3. its end: `exit_group(code)`; or, killed by a signal, that signal's
//!    default action set again and the signal sent to itself (`kill`), its
//!    mask cleared, delivered; a signal that dumps core by default, in a
//!    child made not dumpable first (`PR_SET_DUMPABLE`), so that no core is
//!    written and its status has no core flag, as the original's had not;
//! 4. the tracer collects the end (the child was traced: the kernel then
//!    hands it to its real parent, a zombie with its status), and checks
//!    that it is the parent's zombie now, with the status of the image;
//! 5. once all are made ([`take_back_signals`]), the exit signals they sent
//!    the parent are taken back (`rt_sigtimedwait` with no wait, injected
//!    into the stopped parent), and those the image had pending (restored
//!    with the others by then) are queued again with their `siginfo`: the
//!    parent sees no new `SIGCHLD`.
//!
//! Zombies leading their own group (`setpgid(0, 0)`) or in their parent's
//! are made before the parent's other children ([`Phase::First`]): a
//! pipeline's first command that exited while the others run leads their
//! group, which they join. Zombies in another group are made after those
//! children ([`Phase::Last`]): that group is one of theirs.
//!
//! Not kept: the CPU times `wait4` reports for it, its start time.

use sandtree_sys::ptrace;

use crate::inject::{SET_TID_OFFSET, Tracee, clone_args, write_clone_args};
use crate::model::{ProcessImage, QueuedSignal, ZombieImage};
use crate::{Error, HostPid, Result, SandboxPid};

/// Which zombies of a parent a call of [`make`] makes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Phase {
    /// Before the parent's children: those in its group, or leading their
    /// own group or session.
    First,
    /// After them: those in another group.
    Last,
}

impl Phase {
    fn of(z: &ZombieImage, parent_pgid: SandboxPid) -> Phase {
        if z.pgid == parent_pgid || z.pgid == z.pid { Phase::First } else { Phase::Last }
    }
}

/// Signals whose default action dumps core (`signal(7)`).
const DUMPS_CORE: [i32; 10] = [
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGSEGV,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSYS,
];

/// Where in the parent's scratch page (shared with a `CLONE_VM` child) the
/// calls' arguments go: a `struct kernel_sigaction`, the name, a signal set
/// and a `timespec` (24 bytes), a `siginfo_t`.
const SIGACTION_AT: u64 = 1024;
const NAME_AT: u64 = 1056;
const SET_AT: u64 = 1088;
const SIGINFO_AT: u64 = 1152;

/// The checkpoint's refusal of a parent whose zombie a restore could not
/// make as it was (see the module docs): the parent's index in `images`,
/// the resource and the reason.
pub(crate) fn refusal(images: &[(&ProcessImage, HostPid)]) -> Option<(usize, String, String)> {
    for (p, (parent, _)) in images.iter().enumerate() {
        for z in &parent.zombies {
            if let Some(why) = refusal_of(z, parent, images) {
                let resource = format!("child {} ({}), a zombie", z.pid, z.comm);
                let why = format!(
                    "it exited and its parent has not waited for it yet; a restore makes it again as a child of its parent that ends at once, but {why}"
                );
                return Some((p, resource, why));
            }
        }
    }
    None
}

fn refusal_of(z: &ZombieImage, parent: &ProcessImage, images: &[(&ProcessImage, HostPid)]) -> Option<String> {
    if z.uids != parent.uids || z.gids != parent.gids {
        return Some(format!(
            "it ran as other ids (uids {:?}, gids {:?}) than its parent ({:?}, {:?}), which such a child cannot take (not captured yet)",
            z.uids, z.gids, parent.uids, parent.gids
        ));
    }
    if z.exit_signal == libc::SIGCHLD && parent.signals.ignored & (1 << (libc::SIGCHLD - 1)) != 0 {
        return Some("its parent ignores SIGCHLD now, so the kernel would reap it at once".into());
    }
    let others = || images.iter().map(|(i, _)| *i);
    if z.sid != parent.sid {
        if z.sid != z.pid || z.pgid != z.pid {
            return Some(format!("it is in session {}, which such a child cannot join", z.sid));
        }
        if let Some(m) = others().find(|i| i.sid == z.pid) {
            return Some(format!("it led session {}, which pid {} is still in (not captured yet)", z.pid, m.pid));
        }
        return None;
    }
    if let Some(m) = others().find(|i| i.pgid == z.pid && (i.ppid != parent.pid || z.pgid != z.pid)) {
        return Some(format!(
            "process group {} (its pid) has member pid {}, which is not a child of its parent or which it no longer leads (not captured yet)",
            z.pid, m.pid
        ));
    }
    // (A terminal's foreground group is given back by its live leader
    // alone: `process::session`.)
    if let Some(m) = others().find(|i| i.tpgid == Some(z.pgid) && z.pgid != parent.pgid && z.pgid != z.pid) {
        return Some(format!(
            "its group {} is the foreground group of pid {}'s terminal (not captured yet)",
            z.pgid, m.pid
        ));
    }
    if let Some(m) = others().find(|i| i.tpgid == Some(z.pid) && z.pgid == z.pid) {
        return Some(format!(
            "the group it led is the foreground group of pid {}'s terminal (not captured yet)",
            m.pid
        ));
    }
    // Another group than its parent's or its own: one whose leader is gone
    // (a surrogate makes it again, before) or a zombie of its parent (made
    // before). A live leader takes its group at its own turn, after.
    let leader_gone = !others().any(|i| i.pid == z.pgid) && others().any(|i| i.ppid == parent.pid && i.pgid == z.pgid);
    let joinable = z.pgid == parent.pgid
        || z.pgid == z.pid
        || leader_gone
        || parent.zombies.iter().any(|o| o.pid == z.pgid && o.pgid == o.pid);
    if !joinable {
        return Some(format!(
            "it is in process group {}, which a restore does not make before it (a group led by a live process, or by no child of its parent)",
            z.pgid
        ));
    }
    None
}

/// The zombies of `parent` (the restored process `tracee`, fixed up and
/// stopped; its image's pid and group) of phase `phase`, made again (see
/// the module docs). `scratch` is its scratch page, `last_pid` the
/// sandbox's `ns_last_pid` for a parent that may not choose pids. Returns
/// the exit signals they sent it, for [`take_back_signals`].
pub(crate) fn make(
    tracee: &mut Tracee,
    (zombies, parent_pgid): (&[ZombieImage], SandboxPid),
    (scratch, may_choose_pid): (u64, bool),
    last_pid: &mut Option<crate::LastPid>,
    phase: Phase,
) -> Result<Vec<i32>> {
    let mut sent = Vec::new();
    for z in zombies.iter().filter(|z| Phase::of(z, parent_pgid) == phase) {
        make_one(tracee, z, (scratch, may_choose_pid), last_pid.as_mut())?;
        if z.exit_signal != 0 && !sent.contains(&z.exit_signal) {
            sent.push(z.exit_signal);
        }
    }
    Ok(sent)
}

fn make_one(
    parent: &mut Tracee,
    z: &ZombieImage,
    (scratch, may_choose_pid): (u64, bool),
    last_pid: Option<&mut crate::LastPid>,
) -> Result<()> {
    const CALL: &str = "clone3 (a zombie)";
    let signal = z.status & 0x7f;
    let forked = DUMPS_CORE.contains(&signal);
    let by_last_pid = crate::process::pid_source(may_choose_pid, last_pid, (parent.tid, CALL))?;
    // (Its parent's descriptors and working directory shared, not copied:
    // its end closes nothing.)
    let shared = (libc::CLONE_FILES | libc::CLONE_FS) as u64;
    let flags = if forked { shared } else { shared | libc::CLONE_VM as u64 };
    let mut args = clone_args(scratch + SET_TID_OFFSET, flags);
    // clone_args.exit_signal, the fifth field.
    args[32..40].copy_from_slice(&(z.exit_signal as u64).to_ne_bytes());
    write_clone_args(parent.tid, scratch, &args, z.pid)?;
    let mut busy = 0u32;
    let out = crate::process::clone3_as(parent, scratch, z.pid, by_last_pid, &mut busy, true)?;
    let call: (i64, &[u64]) = (libc::SYS_clone3, &[scratch, crate::inject::CLONE_ARGS_SIZE]);
    let (host, ns_pid, regs) = parent.cloned(out, call, CALL)?;
    let mut child = Tracee::new(host, regs, parent.insn);
    let ended = (|| {
        if ns_pid != z.pid {
            return Err(Error::Remote {
                pid: parent.tid,
                call: CALL,
                errno: std::io::Error::other(format!("got pid {ns_pid} instead of {}", z.pid)),
            });
        }
        set_up(&mut child, z, scratch, forked)?;
        end(&mut child, z)
    })();
    if let Err(e) = ended {
        crate::inject::kill_tracee(host);
        return Err(e);
    }
    // Handed to its parent: a zombie with the image's status.
    let state = crate::procfs::status(host).map(|s| s.state);
    match state.and_then(|state| match state {
        'Z' => crate::procfs::exit_status(host),
        other => Err(std::io::Error::other(format!("in state {other}"))),
    }) {
        Ok((status, _)) if status == z.status => {}
        Ok((status, _)) => {
            return Err(Error::Proc {
                pid: host,
                what: "a zombie made again",
                source: std::io::Error::other(format!("it ended with status {status:#x}, not {:#x}", z.status)),
            });
        }
        Err(e) => {
            return Err(Error::Proc {
                pid: host,
                what: "a zombie made again",
                source: std::io::Error::other(format!(
                    "it is not its parent's zombie ({e}): the parent reaped it at once (SA_NOCLDWAIT?)"
                )),
            });
        }
    }
    tracing::debug!(pid = z.pid.raw(), comm = z.comm, status = z.status, busy, "zombie made again");
    Ok(())
}

/// The child's name, group or session, and, for a signal that dumps core,
/// no dump.
fn set_up(child: &mut Tracee, z: &ZombieImage, scratch: u64, forked: bool) -> Result<()> {
    let tid = child.tid;
    let mut name = [0u8; 16];
    let bytes = z.comm.as_bytes();
    let n = bytes.len().min(15);
    name[..n].copy_from_slice(&bytes[..n]);
    ptrace::write_mem(tid.raw(), scratch + NAME_AT, &name).map_err(Error::ptrace(tid, "write name"))?;
    child.call("prctl (a zombie's name)", libc::SYS_prctl, &[libc::PR_SET_NAME as u64, scratch + NAME_AT])?;
    if z.sid == z.pid {
        child.call("setsid (a zombie's session)", libc::SYS_setsid, &[])?;
    } else if z.pgid == z.pid {
        child.call("setpgid (a zombie's own group)", libc::SYS_setpgid, &[0, 0])?;
    } else {
        child.call("setpgid (a zombie's group)", libc::SYS_setpgid, &[0, z.pgid.raw() as u64])?;
    }
    if forked {
        child.call("prctl (a zombie not dumpable)", libc::SYS_prctl, &[libc::PR_SET_DUMPABLE as u64, 0])?;
    }
    let signal = z.status & 0x7f;
    if signal != 0 && signal != libc::SIGKILL {
        // struct kernel_sigaction { handler = SIG_DFL, flags, restorer, mask }.
        ptrace::write_mem(tid.raw(), scratch + SIGACTION_AT, &[0u8; 32])
            .map_err(Error::ptrace(tid, "write sigaction"))?;
        let args = [signal as u64, scratch + SIGACTION_AT, 0, 8];
        child.call("rt_sigaction (a zombie's signal)", libc::SYS_rt_sigaction, &args)?;
    }
    Ok(())
}

/// The child ends as the zombie did: `exit_group(code)`, or the signal
/// sent to itself (`kill`) with every signal unblocked, delivered. Run
/// from the registers of the call, with a plain resume (not injected as
/// a call: it does not return). Collected by the tracer.
fn end(child: &mut Tracee, z: &ZombieImage) -> Result<()> {
    let tid = child.tid;
    let signal = z.status & 0x7f;
    let code = (z.status >> 8) & 0xff;
    let mut r = child.saved;
    r.orig_rax = u64::MAX;
    r.rip = child.insn;
    (r.rax, r.rdi, r.rsi) = match signal {
        0 => (libc::SYS_exit_group as u64, code as u64, 0),
        sig => (libc::SYS_kill as u64, z.pid.raw() as u64, sig as u64),
    };
    ptrace::set_regs(tid.raw(), &r).map_err(Error::ptrace(tid, "SETREGS"))?;
    ptrace::set_sigmask(tid.raw(), 0).map_err(Error::ptrace(tid, "SETSIGMASK"))?;
    let died = |how: String| Error::Remote { pid: tid, call: "the end of a zombie", errno: std::io::Error::other(how) };
    let mut resume = ptrace::resume(tid.raw(), 0);
    for _ in 0..64 {
        resume.map_err(Error::ptrace(tid, "cont"))?;
        resume = match ptrace::wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))? {
            ptrace::Stop::Exited(c) if signal == 0 && c == code => return Ok(()),
            ptrace::Stop::Killed(sig) if signal != 0 && sig == signal => return Ok(()),
            ptrace::Stop::Exited(c) => return Err(died(format!("exited with {c}"))),
            ptrace::Stop::Killed(sig) => return Err(died(format!("killed by signal {sig}"))),
            ptrace::Stop::Signal(sig) if sig == signal => ptrace::resume(tid.raw(), sig),
            ptrace::Stop::Signal(_) | ptrace::Stop::Syscall | ptrace::Stop::Event { .. } => {
                ptrace::resume(tid.raw(), 0)
            }
        };
    }
    Err(died("it did not end".into()))
}

/// Once the zombies of the restored `parent` (pid `pid` in the sandbox,
/// its pending signals at the checkpoint `queued`) are made: the exit
/// signals `sent` they sent it taken back, and those it had pending at
/// the checkpoint queued again with their `siginfo`.
pub(crate) fn take_back_signals(
    parent: &mut Tracee,
    (pid, queued): (SandboxPid, &[QueuedSignal]),
    scratch: u64,
    sent: &[i32],
) -> Result<()> {
    if sent.is_empty() {
        return Ok(());
    }
    let set = sent.iter().fold(0u64, |set, &s| set | 1 << (s - 1));
    super::signals::take_pending(parent, set, scratch + SET_AT)?;
    for q in queued.iter().filter(|q| sent.contains(&q.signo())) {
        super::signals::queue_again(parent, pid, q, scratch + SIGINFO_AT)?;
    }
    Ok(())
}
