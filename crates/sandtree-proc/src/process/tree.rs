//! A process whose parent is another captured process (a shell's job, a
//! build's compiler, a server's worker): its template, made a child of
//! init, and what its restore by its parent (`transplant.rs`) cannot give,
//! refused at the checkpoint.
//!
//! **Its template.** A template is a `clone(CLONE_PARENT)` of its process:
//! a child of the process's parent. For a child of init that is init's
//! child; for any other, the parent would see the template in its
//! children, and, once the template is dropped, keep it as a zombie it
//! never reaps (a template has no exit signal). So the template of such a
//! process is made in two steps: a first copy sharing its memory
//! (`clone(CLONE_VM)`, a child of the process, with `SIGCHLD` as its exit
//! signal), which forks the template (a copy of that memory), then exits:
//! the template, orphaned, becomes init's child, and leaves the process's
//! session and group at once (a shell's `kill %1` signals the job's group,
//! and would kill a template still in it). Meanwhile the process
//! ignores `SIGCHLD`, so that the kernel reaps the first copy itself and
//! the process never sees it; its handler is put back after, and a
//! `SIGCHLD` it had pending (which ignoring discards) is queued again with
//! its `siginfo`. The process is stopped throughout.

use sandtree_sys::ptrace;

use crate::inject::Tracee;
use crate::model::{ProcessImage, QueuedSignal};
use crate::{Error, HostPid, Result, SandboxPid};

/// Bytes below the process's stack pointer (past the red zone) used for
/// the calls' arguments: two `struct kernel_sigaction` and a `siginfo_t`,
/// put back after.
const ROOM: u64 = 256;

/// The template of `orig`, a stopped process of pid `pid` whose parent is
/// not init (see the module docs), with `queued` its pending signals:
/// the template's host pid and its pid in the sandbox. `between` runs
/// while the template's fork copies the memory.
pub(crate) fn template_of_child(
    orig: &mut Tracee,
    (pid, queued): (SandboxPid, &[QueuedSignal]),
    between: &mut dyn FnMut(),
) -> Result<(HostPid, SandboxPid)> {
    let flags = (libc::CLONE_VM | libc::SIGCHLD) as u64;
    let (first, _, regs) = orig.clone_stopped(flags, "clone (a first copy)")?;
    let mut first = Tracee::new(first, regs, orig.insn);
    // No exit signal: its parent's plain `wait` never sees the template
    // (init reaps with __WALL). (Forked before the process ignores
    // `SIGCHLD`: the first copy's handlers, which the template copies,
    // are the process's.)
    let forked = first.start_clone(0).and_then(|()| {
        between();
        first.finish_clone(0, "clone (template)")
    });
    let ended = reaped_unseen(orig, first, (pid, queued));
    let (tpl, ns_pid, regs) = match (forked, ended) {
        (Ok(t), Ok(())) => t,
        (Ok((tpl, ..)), Err(e)) => {
            crate::inject::kill_tracee(tpl);
            return Err(e);
        }
        (Err(e), _) => return Err(e),
    };
    // It leaves the process's session and group at once (a template of a
    // child of init leaves them at its set-up, `Template::prepare`): a
    // shell's `kill %1` right after the checkpoint signals the job's group.
    let left = Tracee::new(tpl, regs, orig.insn).call("setsid (template)", libc::SYS_setsid, &[]);
    let parent = left.and_then(|_| {
        let status = crate::procfs::status(tpl).map_err(|e| Error::Proc { pid: tpl, what: "status", source: e })?;
        crate::procfs::status(status.host_ppid).map_err(|e| Error::Proc { pid: tpl, what: "parent", source: e })
    });
    match parent {
        Ok(p) if p.ns_pid == SandboxPid::INIT => Ok((tpl, ns_pid)),
        Ok(p) => {
            crate::inject::kill_tracee(tpl);
            Err(Error::unsupported_by_host(
                orig.tid,
                "",
                "parent",
                format!(
                    "its template, orphaned, went to pid {} rather than init: a process above it is a child subreaper (not captured yet)",
                    p.ns_pid
                ),
            ))
        }
        Err(e) => {
            crate::inject::kill_tracee(tpl);
            Err(e)
        }
    }
}

/// The first copy `first` of `orig` exits while `orig` ignores `SIGCHLD`:
/// the kernel reaps it, and `orig` sees nothing. Its handler is put back
/// after, and a `SIGCHLD` it had pending (in `queued`), which ignoring
/// discards, queued again.
fn reaped_unseen(orig: &mut Tracee, first: Tracee, (pid, queued): (SandboxPid, &[QueuedSignal])) -> Result<()> {
    let rsp = orig.saved.rsp;
    let mut first = Some(first);
    let res = crate::inject::below_red_zone(orig, rsp, ROOM as usize, |orig, buf| {
        let Some(mut first) = first.take() else { return Ok(()) };
        // struct kernel_sigaction { handler = SIG_IGN, flags, restorer, mask }.
        let mut ignore = [0u8; 32];
        ignore[..8].copy_from_slice(&(libc::SIG_IGN as u64).to_ne_bytes());
        let ignored = ptrace::write_mem(orig.tid.raw(), buf, &ignore)
            .map_err(Error::ptrace(orig.tid, "write sigaction"))
            .and_then(|()| {
                orig.call("rt_sigaction (SIGCHLD ignored)", libc::SYS_rt_sigaction, &[SIGCHLD, buf, buf + 32, 8])
            });
        if let Err(e) = ignored {
            crate::inject::kill_tracee(first.tid);
            return Err(e);
        }
        let ended = end(&mut first);
        let back = orig
            .call("rt_sigaction (SIGCHLD back)", libc::SYS_rt_sigaction, &[SIGCHLD, buf + 32, 0, 8])
            .and_then(|_| requeue_sigchld(orig, (pid, queued), buf + 64));
        ended.and(back)
    });
    // (No room below the stack: the first copy was never let go.)
    if let Some(first) = first {
        crate::inject::kill_tracee(first.tid);
    }
    res
}

/// `SIGCHLD`, as a syscall argument.
const SIGCHLD: u64 = libc::SIGCHLD as u64;

/// The first copy exits (the kernel reaps it: its parent ignores
/// `SIGCHLD`); collected by the tracer.
fn end(first: &mut Tracee) -> Result<()> {
    let tid = first.tid;
    first.start_syscall(libc::SYS_exit, &[0])?;
    loop {
        match ptrace::wait(tid.raw()).map_err(Error::ptrace(tid, "wait"))? {
            ptrace::Stop::Exited(_) | ptrace::Stop::Killed(_) => return Ok(()),
            _ => ptrace::resume_syscall(tid.raw(), 0).map_err(Error::ptrace(tid, "syscall"))?,
        }
    }
}

/// Queue again the `SIGCHLD` that ignoring it discarded, if `queued` has
/// one (`at`: room for its `siginfo_t` below the stack).
fn requeue_sigchld(orig: &mut Tracee, (pid, queued): (SandboxPid, &[QueuedSignal]), at: u64) -> Result<()> {
    for q in queued.iter().filter(|q| q.signo() == libc::SIGCHLD) {
        super::signals::queue_again(orig, pid, q, at)?;
    }
    Ok(())
}

/// Pass 2: the first of `images` (with each template's host pid) whose
/// restore by its parent (or its session's maker) could not be exact, as
/// (index, resource, reason). Children whose parent is not captured are not this check's
/// (best effort restores them as children of init, `check::reparent_note`).
pub(crate) fn refusal(images: &[(&ProcessImage, HostPid)]) -> Option<(usize, String, String)> {
    let at = |pid: SandboxPid| images.iter().position(|(i, _)| i.pid == pid);
    for (c, (image, host)) in images.iter().enumerate() {
        // A group whose leader (captured) moved to another group: the
        // restored leader makes its own, and no process this one.
        if image.pgid != image.pid
            && let Some(l) = at(image.pgid)
            && images[l].0.pgid != images[l].0.pid
        {
            let why = format!(
                "member of process group {}, whose leader moved to another group since (a restore could not make that group again)",
                image.pgid
            );
            return Some((c, "process group".into(), why));
        }
        // Made again by its parent, or by its session's maker (the
        // restored leader, or a surrogate cloned from the template of the
        // session's first process: `super::session::made_by_session`).
        let maker = match image.ppid {
            SandboxPid::INIT if super::session::made_by_session(image) => match at(image.sid) {
                Some(l) if images[l].0.ppid != SandboxPid::INIT => {
                    let why = format!(
                        "a child of init in the session of pid {}, which is not a child of init: a restore makes such a process again through its session's leader, by a clone that gives it the leader's parent",
                        image.sid
                    );
                    return Some((c, "session".into(), why));
                }
                Some(l) => l,
                None => match session_source(images, image.sid) {
                    Some(first) => first,
                    None => continue,
                },
            },
            SandboxPid::INIT => continue,
            ppid => match at(ppid) {
                Some(p) => p,
                None => continue,
            },
        };
        let (parent, parent_host) = images[maker];
        if let Some(m) = image.maps.iter().find(|m| !transplantable(m)) {
            let what = m.path.as_deref().unwrap_or("anonymous memory");
            let why = format!(
                "mapping {:x}-{:x} ({what}, {}): its parent makes it again at a restore and gives it a copy of its memory, which such a mapping cannot be (not captured yet)",
                m.start, m.end, m.perms
            );
            return Some((c, "memory".into(), why));
        }
        if let Some(why) = super::credentials::refusal((image, *host), (parent, parent_host)) {
            return Some((c, "credentials".into(), why));
        }
        // (A session's maker makes a surrogate for a group whose leader is
        // gone: `restore.rs`.)
        if !super::session::made_by_session(image)
            && let Some(why) = session_refusal(image, parent, &at)
        {
            return Some((c, "session".into(), why));
        }
    }
    None
}

/// The process of session `sid` (made again by its maker, the leader
/// gone: `super::session::made_by_session`) whose template the surrogate of
/// the session's leader is cloned from at a restore: the lowest pid.
pub(crate) fn session_source(images: &[(&ProcessImage, HostPid)], sid: SandboxPid) -> Option<usize> {
    (0..images.len())
        .filter(|&i| super::session::made_by_session(images[i].0) && images[i].0.sid == sid)
        .min_by_key(|&i| images[i].0.pid)
}

/// Whether a transplant makes mapping `m` again (`transplant.rs`).
/// (A shared mapping of a file is made again on the file: the same
/// pages; of shared memory of no file, on the object the template holds.)
fn transplantable(m: &crate::model::MapImage) -> bool {
    if super::shared_memory::object_of(m).is_some() {
        return true;
    }
    match m.path.as_deref() {
        Some(p) if p.starts_with('/') => !p.ends_with(" (deleted)"),
        _ if m.shared() => false,
        None => true,
        Some(p) => {
            ["[heap]", "[stack]", "[vdso]", "[vvar]", "[vvar_vclock]", "[vsyscall]"].contains(&p)
                || (p.starts_with("[anon:") && p.ends_with(']'))
        }
    }
}

/// Why `image`, made again by `parent` (whose session and group it starts
/// in), could not take its own session and group back, if it could not.
fn session_refusal(
    image: &ProcessImage,
    parent: &ProcessImage,
    at: &dyn Fn(SandboxPid) -> Option<usize>,
) -> Option<String> {
    if image.sid == image.pid {
        return None;
    }
    if image.sid != parent.sid {
        return Some(format!(
            "it is in session {}, neither its own nor its parent's ({}): made again by its parent, it could not join it",
            image.sid, parent.sid
        ));
    }
    // (A group whose leader is gone, a pipeline's whose first command
    // exited: made again by a surrogate its parent makes, a child of the
    // parent's parent, `restore.rs`: of init's only.)
    if image.pgid == image.pid
        || image.pgid == parent.pgid
        || at(image.pgid).is_some()
        || parent.ppid == SandboxPid::INIT
    {
        return None;
    }
    Some(format!(
        "it is in process group {}, whose leader is not captured: made again by its parent (pid {}, not a child of init), it could not join that group",
        image.pgid, parent.pid
    ))
}
