//! Memory holders: keeping a killed process's memory teardown out of a
//! rollback's way.
//!
//! A rollback must kill the running copy of a process before it can give
//! its pid to the restored one, and the pid is free only once the dying
//! process has torn its address space down: for a 100 MB Python whose huge
//! pages were split by copy-on-write writes, 2-4 ms, on the rollback's
//! path. A *holder* is a second process sharing the address space
//! (`clone(CLONE_VM | CLONE_PARENT)` injected into the process, no exit
//! signal), stopped by the tracer forever and never run. With it, the
//! killed process only drops its reference to the memory and is gone at
//! once; the holder is killed after the rollback (its teardown then runs
//! in the background of whatever comes next).
//!
//! A holder of a tracked process also copies the pages it wrote since the
//! last checkpoint in the frozen window ([`Copier`], `incremental.rs`):
//! sharing the address space, a `pwritev` injected into it copies them
//! from inside, into a page file it holds.
//!
//! Every captured process gets a holder at its first checkpoint, every
//! restored process at its restore. A holder whose owner exited is killed
//! on the tracer's next tick. Holders are spared by init's kills (they are
//! in [`crate::Tracer::rollback_plan`]).

use crate::reap::Dying;
use std::os::fd::OwnedFd;

use sandtree_sys::ptrace;

use crate::inject::Tracee;
use crate::{Error, HostPid, Result, SandboxPid};

/// A process sharing its owner's address space.
pub(crate) struct Holder {
    /// Host pid.
    pub host: HostPid,
    /// Pid in the sandbox.
    pub ns_pid: SandboxPid,
    /// Host pid of the owner.
    pub owner: HostPid,
    /// pidfd of the owner: readable once it exited.
    owner_fd: OwnedFd,
    /// A template adopted as holder still has its copy of the descriptor
    /// table until [`drop_pending`], right after the rollback's reply.
    undropped: bool,
    /// The holder, to inject calls into (until [`equip`] makes it a
    /// [`Copier`]'s).
    tracee: Option<Tracee>,
    /// What copies the owner's written pages in the frozen window
    /// (`incremental.rs`), once made.
    pub copier: Option<Copier>,
    /// Making a copier failed: the owner's pages are read from the daemon
    /// (`process_vm_readv`).
    no_copier: bool,
    /// The page file's descriptor in the holder, once made (a copier lost
    /// with a failed checkpoint is made again around it).
    page_fd: Option<i32>,
    /// The owner's resident pages, as last read (`None`: not yet).
    owner_resident: Option<u64>,
}

/// A holder equipped to copy its owner's pages written since the last
/// checkpoint, in the frozen window (`incremental.rs`): it shares the
/// owner's address space, so an injected `pwritev` of those pages into a
/// page file copies them within that address space, on the CPU the tracer
/// does not use, while the tracer clones the sandbox's other processes (a
/// `process_vm_readv` from the daemon looks every page up in the other
/// process's page tables and pins it: 1,150 pages took 5-10 ms here
/// where the `pwritev` took 1.5-2.3 ms, in one of the VM's slow spells).
pub(crate) struct Copier {
    /// The holder (in a ptrace stop between calls).
    pub tracee: Tracee,
    /// The page file's descriptor in the holder.
    pub fd: i32,
    /// The page file (`None` while it is made or grown, off the tracer
    /// thread, or lent to a template's [`crate::incremental::Pending`]
    /// until its pages are written).
    pub file: Option<sandtree_sys::pagefile::PageFile>,
    /// The page file being made or grown (allocating its pages: ~1 µs a
    /// page here).
    making: Option<std::thread::JoinHandle<std::io::Result<sandtree_sys::pagefile::PageFile>>>,
    /// Bytes the page file should hold: a half more than the pages read
    /// last time.
    pub want: usize,
    /// The page file is lent to a template's pending write while this
    /// lives (one dropped with its template, unwritten, is made again).
    pub lent: Option<std::sync::Weak<()>>,
    /// Making or growing the page file failed: not tried again.
    failed: bool,
}

/// A page file's size at first: an eighth of the process's resident
/// memory, between 1 and 8 MiB (2,048 pages; the bench's steps write
/// ~1,150). One that is too small for a checkpoint's pages grows after it
/// (the pages went through `process_vm_readv` that time).
fn first_page_file(owner: HostPid) -> usize {
    let resident = crate::procfs::resident_pages(owner) as usize * 4096;
    (resident / 8).clamp(1 << 20, 8 << 20)
}

impl Copier {
    /// The page file, once it is made (`None` while it is being made or
    /// grown, or lent).
    pub(crate) fn ready(&mut self) -> Option<&mut sandtree_sys::pagefile::PageFile> {
        if self.making.as_ref().is_some_and(|m| m.is_finished())
            && let Some(m) = self.making.take()
        {
            match m.join() {
                Ok(Ok(f)) => self.file = Some(f),
                Ok(Err(e)) => {
                    tracing::debug!(holder = self.tracee.tid.raw(), "no page file: {e}");
                    self.failed = true;
                }
                Err(_) => {
                    tracing::debug!(holder = self.tracee.tid.raw(), "the page file's thread panicked");
                    self.failed = true;
                }
            }
        }
        self.file.as_mut()
    }

    /// Make or grow the page file to `want` bytes on a thread of its own
    /// (`file`: the one to grow; `fd`: a new one).
    fn make(&mut self, file: Option<sandtree_sys::pagefile::PageFile>, fd: Option<OwnedFd>) {
        let want = self.want;
        let spawned = std::thread::Builder::new().name("sandtree:pagefile".into()).spawn(move || {
            let _ = rustix::process::setpriority_process(None, crate::inject::BACKGROUND_NICE);
            match (file, fd) {
                (Some(mut f), _) => f.grow(want).map(|()| f),
                (None, Some(fd)) => sandtree_sys::pagefile::PageFile::new(fd, want),
                (None, None) => Err(std::io::Error::other("no page file to make")),
            }
        });
        match spawned {
            Ok(h) => self.making = Some(h),
            Err(e) => {
                tracing::debug!(holder = self.tracee.tid.raw(), "no thread to make the page file: {e}");
                self.failed = true;
            }
        }
    }
}

impl Holder {
    /// A holder (`tracee`, pid `ns_pid` in the sandbox) of the memory of
    /// `owner` (host pid, and a pidfd of it); `undropped`: it still has its
    /// copy of the descriptor table. No copier, no page file yet.
    fn new((tracee, ns_pid): (Tracee, SandboxPid), (owner, owner_fd): (HostPid, OwnedFd), undropped: bool) -> Holder {
        Holder {
            host: tracee.tid,
            ns_pid,
            owner,
            owner_fd,
            undropped,
            tracee: Some(tracee),
            copier: None,
            no_copier: false,
            page_fd: None,
            owner_resident: None,
        }
    }

    /// Whether the owner has exited, or exec'd (a new address space: the
    /// holder then keeps only the old one alive).
    pub(crate) fn orphaned(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.owner_fd, rustix::event::PollFlags::IN)];
        let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
            || !ptrace::same_mm(self.owner.raw(), self.host.raw())
    }
}

/// A pidfd of `owner`, the process a holder keeps the memory of.
fn owner_pidfd(owner: HostPid) -> Result<OwnedFd> {
    let pid =
        rustix::process::Pid::from_raw(owner.raw()).ok_or(Error::Died { pid: owner, how: "has no pid".into() })?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).map_err(|e| Error::Ptrace {
        pid: owner,
        op: "pidfd_open",
        source: e.into(),
    })
}

/// What makes a process sharing the owner's memory a holder: out of the
/// owner's session and group (or their id, the owner's pid, would stay
/// taken after the owner died), and without the copy of its descriptor
/// table (a listener kept there would keep its port taken). A syscall
/// instruction writes no memory: running one in the shared address space
/// is harmless.
fn let_go_of_owner(h: &mut Tracee) -> Result<()> {
    h.call("setsid (holder)", libc::SYS_setsid, &[])?;
    drop_descriptors(h)
}

/// Close every descriptor of holder `h`.
fn drop_descriptors(h: &mut Tracee) -> Result<()> {
    h.call("close_range (holder)", libc::SYS_close_range, &[0, u32::MAX as u64, 0]).map(|_| ())
}

/// A template whose address space a restored process (`owner`) now shares
/// becomes that process's holder (`restore.rs`). Its set-up already took
/// it out of the original's session or group; its copy of the descriptor
/// table goes.
pub(crate) fn adopt((t, ns_pid): (Tracee, SandboxPid), owner: HostPid) -> Result<Holder> {
    let host = t.tid;
    let owner_fd = match owner_pidfd(owner) {
        Ok(fd) => fd,
        Err(e) => {
            crate::inject::kill_tracee(host);
            return Err(e);
        }
    };
    Ok(Holder::new((t, ns_pid), (owner, owner_fd), true))
}

/// Adopted holders drop their copy of the descriptor table (after the
/// rollback's reply: a holder never runs, and the copy only keeps the
/// same files open a moment longer). One that cannot is killed.
pub(crate) fn drop_pending(holders: &mut Vec<Holder>, dying: &mut Vec<Dying>) {
    holders.retain_mut(|h| {
        let Some(t) = h.tracee.as_mut().filter(|_| h.undropped) else { return true };
        if let Err(e) = drop_descriptors(t) {
            tracing::warn!(pid = h.ns_pid.raw(), "holder kept descriptors, killed: {e}");
            dying.push(crate::reap::let_die(h.host, h.ns_pid));
            return false;
        }
        h.undropped = false;
        true
    });
}

/// Processes with fewer resident bytes get no page file (see
/// [`equip_next`]).
const COPIER_MIN_RSS: u64 = 32 << 20;

/// The resident pages of `owner`, as a checkpoint just read them: whether
/// its holder gets a page file ([`equip_next`]) follows its size.
pub(crate) fn note_resident(holders: &mut [Holder], owner: HostPid, pages: u64) {
    for h in holders.iter_mut().filter(|h| h.owner == owner) {
        h.owner_resident = Some(pages);
    }
}

/// Between operations: the next holder of a tracked process that lacks a
/// copier, or whose page file is smaller than the pages read last time,
/// gets one (the page file is made on a thread of its own). Returns
/// whether it did anything.
pub(crate) fn equip_next(holders: &mut [Holder], tracking: &crate::track::Trackings) -> bool {
    // (Read once for a new holder, not at each turn of the tracer's idle
    // loop: checkpoints keep it current, `note_resident`.)
    for h in holders.iter_mut().filter(|h| h.owner_resident.is_none() && h.copier.is_none()) {
        h.owner_resident = Some(crate::procfs::resident_pages(h.owner));
    }
    let wanted = |h: &Holder| {
        !h.no_copier
            && !h.undropped
            && tracking.contains_key(&h.owner)
            && match &h.copier {
                // (A small process writes few pages: read by the daemon,
                // they cost less than a page file kept for it.)
                None => {
                    (h.tracee.is_some() || h.page_fd.is_some())
                        && h.owner_resident.is_some_and(|p| p * 4096 >= COPIER_MIN_RSS)
                }
                Some(c) if c.making.is_some() || c.failed => false,
                Some(c) => match &c.file {
                    Some(f) => f.len() < c.want,
                    None => c.lent.as_ref().is_none_or(|l| l.strong_count() == 0),
                },
            }
    };
    let Some(h) = holders.iter_mut().find(|h| wanted(h)) else { return false };
    if let Some(c) = h.copier.as_mut() {
        let file = c.file.take();
        // (Lost with its template: the holder's descriptor again.)
        let fd = match file {
            Some(_) => None,
            None => match sandtree_sys::uffd::take_fd(h.host.raw(), c.fd) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::debug!(pid = h.ns_pid.raw(), "the holder's page file is gone: {e}");
                    h.copier = None;
                    h.no_copier = true;
                    return true;
                }
            },
        };
        c.lent = None;
        c.make(file, fd);
        return true;
    }
    if let Err(e) = equip(h) {
        tracing::debug!(pid = h.ns_pid.raw(), "the holder copies no pages: {e}");
        h.no_copier = true;
    }
    true
}

/// Give holder `h` a page file: a memfd it makes (injected
/// `memfd_create`; the daemon takes a duplicate with `pidfd_getfd`), whose
/// pages are allocated on a thread of the daemon. It runs off the tracer's
/// CPU from here on (its copies run beside the tracer's work). A holder
/// whose copier was lost (with a checkpoint that failed while it was lent)
/// gets one again around the page file it has.
fn equip(h: &mut Holder) -> Result<()> {
    let host = h.host;
    let (t, fd) = match (h.tracee.take(), h.page_fd) {
        (Some(t), None) => make_page_file(h, t)?,
        (t, Some(fd)) => {
            let t = match t {
                Some(t) => t,
                None => {
                    let regs =
                        ptrace::regs(host.raw()).map_err(|e| Error::Ptrace { pid: host, op: "GETREGS", source: e })?;
                    Tracee::new(host, regs, crate::inject::find_syscall_insn(host)?)
                }
            };
            (t, fd)
        }
        (None, None) => return Ok(()),
    };
    let file = sandtree_sys::uffd::take_fd(host.raw(), fd).map_err(|e| Error::Ptrace {
        pid: host,
        op: "pidfd_getfd",
        source: e,
    })?;
    crate::inject::move_off_tracer(host);
    let want = first_page_file(h.owner);
    let mut c = Copier { tracee: t, fd, file: None, making: None, want, lent: None, failed: false };
    c.make(None, Some(file));
    h.copier = Some(c);
    Ok(())
}

/// The memfd of holder `h`'s page file, made by it (`t`): its descriptor
/// there.
fn make_page_file(h: &mut Holder, mut t: Tracee) -> Result<(Tracee, i32)> {
    let host = h.host;
    let base = crate::procfs::vdso_base(host).map_err(|e| Error::Proc { pid: host, what: "auxv", source: e })?;
    // The name: "", a zero byte of the vDSO's ELF header (e_ident's
    // padding, zero in every ELF file): memory the holder may read
    // whatever its owner does meanwhile.
    let name = base + 9;
    let mut zero = [1u8];
    ptrace::read_mem(host.raw(), name, &mut zero).map_err(|e| Error::Ptrace {
        pid: host,
        op: "read vdso",
        source: e,
    })?;
    if zero[0] != 0 {
        return Err(Error::unsupported(h.ns_pid, "", "vdso", "no zero byte in the vDSO's ELF header"));
    }
    // (Sealable: the daemon seals it against shrinking, `PageFile`.)
    let flags = (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64;
    let fd = t.call("memfd_create (page file)", libc::SYS_memfd_create, &[name, flags])? as i32;
    h.page_fd = Some(fd);
    Ok((t, fd))
}

/// Lend the copier of `owner`'s holder to its checkpoint (`None` when it
/// has none, or none ready).
pub(crate) fn lend_copier(holders: &mut [Holder], owner: HostPid) -> Option<Copier> {
    holders.iter_mut().find(|h| h.owner == owner && h.copier.is_some())?.copier.take()
}

/// The copier lent by [`lend_copier`], back to its holder (or dropped, if
/// the holder is gone). One lost with a failed checkpoint is made again
/// between operations ([`equip_next`]).
pub(crate) fn give_back_copier(holders: &mut [Holder], owner: HostPid, copier: Copier) {
    if let Some(h) = holders.iter_mut().find(|h| h.owner == owner && h.copier.is_none() && h.tracee.is_none()) {
        h.copier = Some(copier);
    }
}

/// A page file lent to a template's pending write, back to the copier of
/// `owner`'s holder once its pages are written.
pub(crate) fn give_back_file(holders: &mut [Holder], owner: HostPid, file: sandtree_sys::pagefile::PageFile) {
    if let Some(c) = holders.iter_mut().find(|h| h.owner == owner).and_then(|h| h.copier.as_mut())
        && c.file.is_none()
        && c.making.is_none()
    {
        c.file = Some(file);
        c.lent = None;
    }
}

/// Make a holder of `t`'s address space (`t` stopped, ours, a child of
/// init: a child of another process has none, since its holder would be a
/// child of that process's parent, which would see it; `transplant.rs`).
pub(crate) fn make(t: &mut Tracee) -> Result<Holder> {
    let owner = t.tid;
    let owner_fd = owner_pidfd(owner)?;
    let flags = (libc::CLONE_VM | libc::CLONE_PARENT) as u64;
    let (host, ns_pid, regs) = t.clone_stopped(flags, "clone (mm holder)")?;
    let mut tracee = Tracee::new(host, regs, t.insn);
    if let Err(e) = let_go_of_owner(&mut tracee) {
        crate::inject::kill_tracee(host);
        return Err(e);
    }
    Ok(Holder::new((tracee, ns_pid), (owner, owner_fd), false))
}

/// SIGKILL the holders whose owner exited; they are reaped by
/// `reap::reap_dying` (their teardown must not hold the tracer).
pub(crate) fn retire(holders: &mut Vec<Holder>, dying: &mut Vec<Dying>) {
    holders.retain(|h| {
        if h.orphaned() {
            dying.push(crate::reap::let_die(h.host, h.ns_pid));
            false
        } else {
            true
        }
    });
}
