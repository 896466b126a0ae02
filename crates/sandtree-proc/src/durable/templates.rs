//! Templates made again from a checkpoint's durable image
//! ([`make_templates`]): the slow path of a rollback whose templates are
//! gone (a daemon restart, killed from inside the sandbox, evicted). The
//! rollback then goes on exactly as from live templates (`restore.rs`).
//!
//! Each process of the image is made by a transplant (`transplant.rs`)
//! whose maker is the sandbox's init, and whose source is the image
//! instead of a live template:
//!
//! 1. **maker**: init is seized and stopped, and given a scratch mapping
//!    for the clone's arguments (unmapped, its registers set back and
//!    init let go at the end, whatever happened);
//! 2. **clone**: `clone3(CLONE_VM, SIGCHLD, set_tid = [a free pid])`
//!    injected into init: a child of init, as every template is, on a pid
//!    no process of the image has (from three quarters of the pid range
//!    up, where neither the sandbox nor a restore's `ns_last_pid` is);
//! 3. **exec, memory map**: `execve` of the image's executable by its path
//!    in the tree (the rollback has swapped the checkpoint's tree in
//!    first), the image's mappings made again, the kernel's vDSO moved to
//!    their addresses, and a scratch mapping where neither has one (below
//!    the lowest mapping of the mmap area, where the kernel puts new ones);
//! 4. **contents**: every page the image holds for the process
//!    ([`super::PageSource`]: its own, or its parents', each checked
//!    against its checksum) written into it;
//! 5. **the rest a fork copies**: the [`ForkState`](crate::model::ForkState)
//!    the image kept: XSAVE area, limits, OOM score, timer slack, signal
//!    handlers, `prctl` settings, personality, umask, name; then its
//!    credentials (ids, groups, capabilities, as its fingerprint has
//!    them);
//! 6. **descriptors**: what a template holds after its set-up
//!    (`Template::prepare`): nothing of what a restore makes anew, an
//!    `O_PATH` descriptor of each pipe (one pipe made by the daemon per
//!    pipe of the image, shared by every process that held it), the files
//!    of kept mounts (`/dev/null`, ...) opened again by path at their
//!    offsets;
//! 7. **check**: a session of its own (as a template leaves its
//!    original's; one whose original was in init's session keeps it, in a
//!    group of its own), and the fingerprint the image kept (credentials,
//!    capabilities, seccomp, dispositions, bounds, limits) must be the new
//!    process's, but for the namespaces (another boot of the sandbox has
//!    others): a difference fails the rollback, naming the line.
//!
//! A template made so holds no restart block of the original's (the
//! kernel's record of an interrupted `nanosleep`'s or futex wait's
//! deadline, which only a fork copies): a call the checkpoint interrupted
//! with one returns `EINTR` instead (its registers say so), as in a child
//! made by a transplant; callers of those calls handle it.
//!
//! Eventfds, timerfds, signalfds and epolls, which a template shares with
//! its original, are made anew in the template (empty: the restore puts
//! their state back as into a live template's), one object per open file
//! of the image (`ImageTree::open_files`: shared by processes, or dup'd),
//! taken by the next holders from the template that made it.
//!
//! What an image cannot give yet is refused by name before any process is
//! made (`refusal`): other objects a template shares with its original and
//! a restore does not make anew (memfds, deleted files of `/dev/shm` held
//! open, kept unix and other sockets, pidfds of exited processes),
//! terminals, FIFOs, mappings of other deleted files, data in flight on
//! unix sockets, pipes fed from outside the sandbox's processes.
//!
//! Shared anonymous memory is made anew by the first process that maps it
//! (a shared anonymous `mmap`, whole), and mapped by the next ones through
//! that template's `map_files` (`SharedObjects`); so is a mapped deleted
//! file of `/dev/shm`, made again under its name (then deleted); SysV
//! segments, made again by the rollback before, are attached by id. The
//! restore puts their contents back from the image's copy
//! (`CheckpointTemplates::shared_memory`).
//!
//! A pipe the daemon still holds (a background command's output, which it
//! reads) is given to the processes as it is. One whose other end was
//! outside the captured processes at the checkpoint, read there (the
//! daemon's, gone with a restart), is given a reader again: its `O_PATH`
//! is returned to the caller, who reads and drops what the restored
//! processes write there (a pipe with no reader would kill its writer
//! with `SIGPIPE`).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use sandtree_sys::ptrace;

use super::{ImageProcess, ImageTree, PageSource, image_path};
use crate::batch::{Arg, Batch, SCRATCH};
use crate::check::Unrestorable;
use crate::inject::{self, SET_TID_OFFSET, Tracee, clone_args, write_clone_args};
use crate::model::{AnonState, FdKind, MapImage, ProcessImage};
use crate::process::shared_memory::Reach;
use crate::stop::Stops;
use crate::template::{CheckpointTemplates, Template};
use crate::{Error, HostPid, Result, SandboxPid};

/// At most this many bytes of pages are gathered before they are written.
const WRITE_CHUNK: usize = 32 << 20;

/// A page.
const PAGE: u64 = 4096;

/// The templates of checkpoint `ck` made again from its image in `dir`
/// (see the module docs), children of init (`init`, host pid, stopped
/// meanwhile through `stops`), stopped; with the `O_PATH` descriptors of
/// the pipes whose reader was outside the captured processes (the caller
/// reads them). Nothing is left of them on an error.
pub(crate) fn make_templates(
    dir: &Path,
    (ck, init): (&str, HostPid),
    known_pipes: Vec<OwnedFd>,
    stops: &mut Stops,
) -> Result<(CheckpointTemplates, Vec<OwnedFd>)> {
    let image = open_restorable(dir, ck)?;
    let tree = image.tree();
    let pipes = Pipes::make(tree, init, known_pipes)?;
    let mut maker = Maker::seize(init, stops)?;
    let mut made: Vec<Template> = Vec::new();
    let mut objects = SharedObjects::of(tree);
    let groups = tree.open_files.as_deref().unwrap_or_default();
    let mut anonymous = Anonymous { groups, made: Default::default() };
    let mut pages = PageSource::new(&image, dir);
    let mut next_pid = SandboxPid::max() / 4 * 3;
    let mut each = || -> Result<()> {
        for p in &tree.processes {
            let holds = (&pipes, &mut anonymous, &mut objects);
            made.push(make_one(&mut maker, p, (&image, &mut pages), holds, &mut next_pid)?);
        }
        Ok(())
    };
    let done = each();
    maker.release(stops);
    let shared_memory = match done.and_then(|()| objects.contents(&image, tree)) {
        Ok(shared_memory) => shared_memory,
        Err(e) => {
            for t in made {
                t.kill();
            }
            return Err(e);
        }
    };
    let holder = |ino: u64| {
        made.iter().find_map(|t| {
            t.image.fds.iter().find(|f| matches!(f.kind, FdKind::Pipe { ino: i } if i == ino)).map(|f| (t.host, f.fd))
        })
    };
    let mut set_pipes = Vec::new();
    for b in &tree.pipes {
        let Some((host, fd)) = holder(b.ino) else { continue };
        set_pipes.push((b.clone(), host, fd));
    }
    let set = CheckpointTemplates {
        templates: made,
        pipes: set_pipes,
        shared_memory,
        sockets: Vec::new(),
        pair_data: tree.pair_data.clone(),
        unrestorable: tree.unrestorable.clone(),
        last_used: 0,
    };
    Ok((set, pipes.outputs()))
}

/// Whether the processes of checkpoint `ck` can be made again from its
/// image in `dir`: the image and every image it reads pages from open and
/// check (header, sections, tree and index checksums; the pages are
/// checked as they are read), and nothing in it is refused. Cheap next to
/// a restore (the page data is not read): asked before a rollback kills
/// anything, and before a fork makes anything. The answer is the memory
/// its processes hold: the bytes of their pages, stored in it or in the
/// images it reads from (what each copy of them costs).
pub fn restorable(dir: &Path, ck: &str) -> Result<u64> {
    let image = open_restorable(dir, ck)?;
    Ok(image.summary().processes.iter().map(|p| (p.pages_here + p.pages_in_parents) * PAGE).sum())
}

/// The image of checkpoint `ck` in `dir`, opened and checked with the
/// images it reads pages from, if nothing in it is refused ([`restorable`]).
fn open_restorable(dir: &Path, ck: &str) -> Result<super::Image> {
    let image_err = |e| Error::Image(Box::new(e));
    let image = super::Image::open(&image_path(dir, ck)).map_err(image_err)?;
    for source in image.tree().sources.iter().filter(|s| s.as_str() != ck) {
        super::Image::open(&image_path(dir, source)).map_err(image_err)?;
    }
    match refusal(image.tree()) {
        Some(refused) => Err(Error::Unsupported(refused)),
        None => Ok(image),
    }
}

/// Why the processes of `tree` cannot be made again from its image yet
/// (the first reason found), or `None`.
fn refusal(tree: &ImageTree) -> Option<Unrestorable> {
    let refuse = |p: &ProcessImage, resource: String, why: &str| {
        Some(Unrestorable {
            pid: p.pid,
            comm: p.comm.clone(),
            resource,
            reason: format!("{why}: not restored from a process image yet (only from its live templates)"),
        })
    };
    if let Some(s) = tree.sockets.first() {
        let p = tree.processes.first().map(|p| &p.image)?;
        return refuse(p, format!("unix socket {}", s.ino), "data queued on a kept unix socket");
    }
    for ImageProcess { image: p, .. } in &tree.processes {
        if p.exe.ends_with(" (deleted)") || !p.exe.starts_with('/') {
            return refuse(p, format!("executable {}", p.exe), "a deleted executable");
        }
        if let Some((m, why)) = p.maps.iter().find_map(|m| shared_refusal(tree, p, m).map(|why| (m, why))) {
            return refuse(p, format!("mapping {:x}-{:x}", m.start, m.end), why);
        }
        let deleted_file = |m: &&MapImage| {
            m.path.as_deref().is_some_and(|p| p.ends_with(" (deleted)"))
                && crate::process::shared_memory::object_of(m).is_none()
        };
        if let Some(m) = p.maps.iter().find(deleted_file) {
            return refuse(p, format!("mapping {:x}-{:x}", m.start, m.end), "a mapping of a deleted file");
        }
        for f in &p.fds {
            let what = || format!("fd {}", f.fd);
            if f.in_flight {
                return refuse(p, what(), "a file in flight on a unix socket");
            }
            let why = match &f.kind {
                k if k.terminal().is_some() => Some("a terminal"),
                FdKind::PtyMaster { .. } => Some("a pseudo-terminal master"),
                FdKind::Fifo { .. } => Some("a FIFO"),
                FdKind::Memfd { .. } => Some("a memfd"),
                FdKind::OtherMount { .. } => Some("a file of another mount"),
                FdKind::ShmFile { deleted: true, .. } => Some("a deleted file of /dev/shm"),
                FdKind::Pipe { ino } if outside_fed(tree, *ino) => {
                    Some("a pipe fed from outside the sandbox's processes (a command's input)")
                }
                FdKind::AnonInode { state: Some(AnonState::Inotify { .. }), .. } => None,
                k if kept_anonymous(k) && tree.open_files.is_some() => None,
                FdKind::AnonInode { state: Some(AnonState::Pidfd { pid }), .. } if pid.raw() > 0 => None,
                FdKind::AnonInode { what, .. } => {
                    return refuse(p, format!("fd {} ({what})", f.fd), "an object its template shares");
                }
                k if k.recreated() => None,
                FdKind::KeptFile { .. } => None,
                FdKind::Socket { .. } => Some("a unix or other socket its template shares"),
                _ => Some("a file its template shares"),
            };
            if let Some(why) = why {
                return refuse(p, what(), why);
            }
        }
    }
    None
}

/// Why mapping `m` of process `p` of `tree`, of a shared memory object,
/// cannot be made again from the image yet (`None`: it can, or it is no
/// such mapping). Shared anonymous memory can (made anew by the first
/// process that maps it, whole, then given to the others), and SysV
/// segments (made again by the rollback before, attached by id).
fn shared_refusal(tree: &ImageTree, p: &ProcessImage, m: &MapImage) -> Option<&'static str> {
    use crate::process::shared_memory::{Object, object_of};
    let o = object_of(m)?;
    let key = (m.dev, m.inode, o == Object::SysV);
    let saved = tree.shared_memory.iter().find(|s| s.key == key);
    let same = |x: &&MapImage| object_of(x) == Some(o) && (x.dev, x.inode) == (m.dev, m.inode);
    match o {
        Object::Memfd => Some("a memfd mapping"),
        _ if saved.is_none() => Some("shared memory whose contents the image does not hold"),
        Object::SysV => None,
        Object::DeletedShmFile => {
            (p.maps.iter().filter(same).count() > 1).then_some("a deleted file of /dev/shm mapped twice by one process")
        }
        Object::Anonymous => {
            let first = tree.processes.iter().find_map(|q| q.image.maps.iter().find(same))?;
            let size = saved.map_or(0, |s| s.data.size);
            if p.maps.iter().filter(same).count() > 1 {
                Some("shared anonymous memory mapped twice by one process")
            } else if first.offset != 0 || first.end - first.start != size.next_multiple_of(PAGE) {
                Some("a part of a shared anonymous object")
            } else {
                None
            }
        }
    }
}

/// Whether `kind` is one a template keeps from its original and an image
/// makes anew (a new object of the kind in the template; the restore puts
/// its state back as into the template's own): eventfds, timerfds,
/// signalfds, epolls.
pub(crate) fn kept_anonymous(kind: &FdKind) -> bool {
    matches!(
        kind,
        FdKind::AnonInode {
            state: Some(
                AnonState::Eventfd { .. }
                    | AnonState::Timerfd { .. }
                    | AnonState::Signalfd { .. }
                    | AnonState::Epoll { .. }
            ),
            ..
        }
    )
}

/// The objects of the kept anonymous kinds made so far, by open file: a
/// descriptor of one process of the image held by the template made for
/// it (host pid, number), that the next holders get too.
struct Anonymous<'a> {
    groups: &'a [Vec<(SandboxPid, i32)>],
    made: std::collections::HashMap<usize, (HostPid, i32)>,
}

impl Anonymous<'_> {
    fn group_of(&self, pid: SandboxPid, fd: i32) -> Option<usize> {
        self.groups.iter().position(|g| g.contains(&(pid, fd)))
    }
}

/// Whether the pipe of inode `ino` had an end outside the captured
/// processes that may write (no captured process reads it: the outside
/// end is its reader, else it may be a writer).
fn outside_fed(tree: &ImageTree, ino: u64) -> bool {
    let Some(b) = tree.pipes.iter().find(|b| b.ino == ino) else { return false };
    b.outside && captured_reads(tree, ino)
}

/// Whether a captured process holds a read end of pipe `ino`.
fn captured_reads(tree: &ImageTree, ino: u64) -> bool {
    tree.processes.iter().flat_map(|p| &p.image.fds).any(|f| {
        matches!(f.kind, FdKind::Pipe { ino: i } if i == ino)
            && f.flags & libc::O_ACCMODE as u32 != libc::O_WRONLY as u32
    })
}

/// The pipes of an image made anew by the daemon: for each, an `O_PATH`
/// descriptor (what the templates hold) and, for one whose reader was
/// outside, a read end kept until [`Pipes::outputs`].
struct Pipes {
    made: Vec<(u64, OwnedFd)>,
    outside: Vec<u64>,
}

impl Pipes {
    /// Each pipe owned by the sandbox's root (init's ids), mode 0666, as
    /// the daemon makes the pipes of a command's stdio: the restore opens
    /// it again inside the sandbox through `/proc/self/fd`, as whatever
    /// user the process runs as.
    /// A pipe of `known` (`O_PATH`s) whose inode the image names is that
    /// pipe, not another.
    fn make(tree: &ImageTree, init: HostPid, known: Vec<OwnedFd>) -> Result<Pipes> {
        let err = |source| Error::Proc { pid: init, what: "a pipe made again", source };
        let (uid, gid) = owner_of(init).map_err(err)?;
        let mut made = Vec::new();
        let mut outside = Vec::new();
        let mut known: Vec<(u64, OwnedFd)> = known
            .into_iter()
            .filter_map(|f| {
                let st = rustix::fs::fstat(&f).ok()?;
                (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo)
                    .then_some((st.st_ino, f))
            })
            .collect();
        for ino in tree.processes.iter().flat_map(|p| &p.image.fds).filter_map(|f| match f.kind {
            FdKind::Pipe { ino } => Some(ino),
            _ => None,
        }) {
            if made.iter().any(|(i, _)| *i == ino) {
                continue;
            }
            if let Some(at) = known.iter().position(|(i, _)| *i == ino) {
                made.push(known.swap_remove(at));
                continue;
            }
            let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| err(e.into()))?;
            if let Some(size) = tree.pipes.iter().find(|b| b.ino == ino).map(|b| b.size).filter(|s| *s > 0) {
                rustix::pipe::fcntl_setpipe_size(&w, size).map_err(|e| err(e.into()))?;
            }
            rustix::fs::fchown(&r, Some(uid), Some(gid)).map_err(|e| err(e.into()))?;
            rustix::fs::fchmod(&r, rustix::fs::Mode::from_raw_mode(0o666)).map_err(|e| err(e.into()))?;
            let path = format!("/proc/self/fd/{}", r.as_raw_fd());
            let o_path =
                rustix::fs::open(path.as_str(), rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, 0.into())
                    .map_err(|e| err(e.into()))?;
            if tree.pipes.iter().any(|b| b.ino == ino && b.outside) {
                outside.push(ino);
            }
            made.push((ino, o_path));
        }
        Ok(Pipes { made, outside })
    }

    fn get(&self, ino: u64) -> Option<&OwnedFd> {
        self.made.iter().find(|(i, _)| *i == ino).map(|(_, f)| f)
    }

    /// The `O_PATH`s of the pipes whose reader was outside.
    fn outputs(self) -> Vec<OwnedFd> {
        let outside = self.outside;
        self.made.into_iter().filter(|(i, _)| outside.contains(i)).map(|(_, f)| f).collect()
    }
}

/// The (host) user and group of process `pid`.
fn owner_of(pid: HostPid) -> std::io::Result<(rustix::process::Uid, rustix::process::Gid)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(format!("/proc/{pid}"))?;
    Ok((rustix::process::Uid::from_raw(meta.uid()), rustix::process::Gid::from_raw(meta.gid())))
}

/// Init, stopped (`Stops::stop_init`, as a snapshot checkpoint stops it),
/// with a scratch mapping: the maker of every template.
struct Maker {
    tracee: Tracee,
    scratch: u64,
}

impl Maker {
    fn seize(init: HostPid, stops: &mut Stops) -> Result<Maker> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let regs = stops.stop_init(init, deadline)?;
        let mut tracee = Tracee::new(init, regs, 0);
        let set_up = (|| -> Result<u64> {
            tracee.insn = inject::find_syscall_insn(init)?;
            let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
            let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
            tracee.call("mmap (init's scratch)", libc::SYS_mmap, &[0, SCRATCH, rw, flags, u64::MAX, 0])
        })();
        match set_up {
            Ok(scratch) => Ok(Maker { tracee, scratch }),
            Err(e) => {
                stops.resume_init();
                Err(e)
            }
        }
    }

    /// Init as it was: its scratch unmapped, its registers, let go.
    fn release(mut self, stops: &mut Stops) {
        let _ = self.tracee.call("munmap (init's scratch)", libc::SYS_munmap, &[self.scratch, SCRATCH]);
        stops.resume_init();
    }
}

/// Template of process `p` of the image made again (see the module docs).
fn make_one(
    maker: &mut Maker,
    p: &ImageProcess,
    (image, pages): (&super::Image, &mut PageSource<'_>),
    (pipes, anonymous, objects): (&Pipes, &mut Anonymous<'_>, &mut SharedObjects),
    next_pid: &mut i32,
) -> Result<Template> {
    let t_start = std::time::Instant::now();
    let (host, ns_pid) = born(maker, p, next_pid)?;
    let made = (|| -> Result<Template> {
        ptrace::trace_exec(host.raw()).map_err(Error::ptrace(host, "SETOPTIONS"))?;
        let regs = ptrace::regs(host.raw()).map_err(Error::ptrace(host, "GETREGS"))?;
        let mut c = Tracee::new(host, regs, maker.tracee.insn);
        crate::transplant::exec(&mut c, maker.scratch, &p.image.exe)?;
        let ours = crate::transplant::maps_of(host)?;
        let scratch = free_scratch(&p.image.maps, &ours)
            .ok_or_else(|| Error::unsupported(p.image.pid, &p.image.comm, "memory", "no room for a scratch mapping"))?;
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        let layout = crate::transplant::Layout { maps: &p.image.maps, scratch: (scratch, true, rwx), fork: &p.fork };
        let (to_give, new_anonymous, new_files) = objects.for_process(&p.image)?;
        let from = crate::transplant::Objects::Image {
            sysv_sizes: &objects.sysv_sizes,
            new_anonymous: &new_anonymous,
            new_files: &new_files,
        };
        let give = |c: &mut Tracee| -> Result<Vec<(u64, u64)>> {
            if to_give.is_empty() {
                return Ok(Vec::new());
            }
            let fds: Vec<_> = to_give.iter().map(|(_, f)| f.as_fd()).collect();
            let numbers = crate::kinds::give_descriptors(c, scratch + 1024, &fds, &[])?;
            Ok(to_give.iter().map(|(start, _)| *start).zip(numbers).collect())
        };
        let t_exec = t_start.elapsed();
        crate::transplant::lay_out(&mut c, &layout, give, &from)?;
        objects.made_by(host, &p.image);
        let t_layout = t_start.elapsed();
        write_pages(pages, p.image.pid, host)?;
        crate::transplant::advise(&mut c, (scratch, true), &p.image.maps)?;
        let t_pages = t_start.elapsed();
        let proc_err = |what: &'static str| move |source| Error::Proc { pid: host, what, source };
        ptrace::set_xstate(host.raw(), &p.fork.xstate).map_err(Error::ptrace(host, "SETREGSET"))?;
        sandtree_sys::process::set_limits(host.raw(), &p.fork.limits).map_err(proc_err("resource limits"))?;
        for (file, value) in [("oom_score_adj", &p.fork.oom_score_adj), ("timerslack_ns", &p.fork.timerslack_ns)] {
            std::fs::write(format!("/proc/{host}/{file}"), value).map_err(proc_err("oom score, timer slack"))?;
        }
        crate::transplant::set_fork_copies(&mut c, (scratch, true), &p.image, &p.fork)?;
        descriptors(&mut c, scratch, &p.image, (pipes, anonymous))?;
        // Out of its maker's (init's) session, as a live template leaves
        // its original's; but one whose original was in init's own session
        // (sid 0 in the sandbox: every process an exec starts) stays in it,
        // in a group of its own, so that its copy is back in that session
        // (`Template::prepare` does the same).
        if p.image.sid.raw() == 0 {
            c.call("setpgid (template)", libc::SYS_setpgid, &[0, 0])?;
        } else {
            c.call("setsid (template)", libc::SYS_setsid, &[])?;
        }
        // Its own credentials, last (a change of ids clears the dumpable
        // flag and the parent-death signal: set again).
        let mut b = Batch::new(scratch, true);
        crate::process::credentials::become_from_fingerprint(&mut c, &mut b, &p.fork.fingerprint)?;
        crate::transplant::set_cleared_by_ids(&mut c, &mut b, &p.fork)?;
        same_fingerprint(host, &p.fork.fingerprint)?;
        let mut process = p.image.clone();
        // (A fork copies no restart block of the original's: its call
        // interrupted with one returns `EINTR`, as a transplanted child's.)
        let mut regs = process.regs.to_sys();
        crate::process::threads::restart_block_lost(&mut regs);
        process.regs.rax = regs.rax;
        for (fd, file) in &p.files {
            process.ghosts.push((*fd, Arc::new(sparse_copy(image, file)?)));
        }
        tracing::debug!(
            pid = p.image.pid.raw(),
            template = ns_pid.raw(),
            ?t_exec,
            ?t_layout,
            ?t_pages,
            took = ?t_start.elapsed(),
            "template made from the image"
        );
        Ok(Template {
            image: process,
            host,
            ns_pid,
            tracee: c,
            scratch,
            scratch_exec: true,
            standby: None,
            forking: None,
            no_standby: false,
            standby_taken: false,
            any_pid: false,
            fingerprint: None,
            incremental: false,
            generation: 0,
            changed_since: None,
            to_write: None,
            advice: None,
        })
    })();
    if made.is_err() {
        inject::kill_tracee(host);
    }
    made
}

/// The file `file` of `image` (a deleted file's, a shared memory
/// object's contents) in a memfd of the daemon.
fn sparse_copy(image: &super::Image, file: &super::SparseFile) -> Result<crate::fdstate::SparseCopy> {
    let mut runs = Vec::with_capacity(file.runs.len());
    for (offset, blob) in &file.runs {
        runs.push((*offset, image.read_blob(*blob).map_err(|e| Error::Image(Box::new(e)))?));
    }
    crate::fdstate::SparseCopy::from_runs(file.size, &runs).map_err(|source| Error::Proc {
        pid: HostPid(std::process::id() as i32),
        what: "a copy of a file of the image",
        source,
    })
}

/// The shared memory objects of an image made so far: by key, the
/// template that maps it and where (for the next processes that map it,
/// and for the restore, which puts the contents back through it).
struct SharedObjects {
    made: std::collections::HashMap<crate::process::shared_memory::ObjectKey, (HostPid, Reach)>,
    /// Each SysV segment's size, by id.
    sysv_sizes: Vec<(u64, u64)>,
    /// Each object's size (its saved contents'), by key.
    sizes: std::collections::HashMap<crate::process::shared_memory::ObjectKey, u64>,
}

impl SharedObjects {
    fn of(tree: &ImageTree) -> SharedObjects {
        let sysv_sizes = tree.shared_memory.iter().filter(|s| s.key.2).map(|s| (s.key.1, s.data.size)).collect();
        let sizes = tree.shared_memory.iter().map(|s| (s.key, s.data.size)).collect();
        SharedObjects { made: Default::default(), sysv_sizes, sizes }
    }

    /// For process `p`: the objects made before that it maps (each
    /// mapping's start, the object opened through its maker), the starts
    /// of its shared anonymous mappings whose object it makes, and those
    /// of its mappings of deleted files of `/dev/shm` it makes again (with
    /// each file's size).
    #[allow(clippy::type_complexity)]
    fn for_process(&self, p: &ProcessImage) -> Result<(Vec<(u64, OwnedFd)>, Vec<u64>, Vec<(u64, u64)>)> {
        use crate::process::shared_memory::{Object, object_of};
        let (mut given, mut new, mut files) = (Vec::new(), Vec::new(), Vec::new());
        for m in &p.maps {
            let o = object_of(m);
            if !matches!(o, Some(Object::Anonymous | Object::DeletedShmFile)) {
                continue;
            }
            match self.made.get(&(m.dev, m.inode, false)) {
                Some(&(host, reach)) => {
                    let access = match m.prot() & libc::PROT_WRITE != 0 {
                        true => rustix::fs::OFlags::RDWR,
                        false => rustix::fs::OFlags::RDONLY,
                    };
                    let object = crate::process::shared_memory::open(host, reach, access).map_err(|source| {
                        Error::Proc { pid: host, what: "shared memory of a template made before", source }
                    })?;
                    given.push((m.start, object));
                }
                None if o == Some(Object::Anonymous) => new.push(m.start),
                None => files.push((m.start, self.sizes.get(&(m.dev, m.inode, false)).copied().unwrap_or(0))),
            }
        }
        Ok((given, new, files))
    }

    /// The contents of `tree`'s shared memory objects (of `image`), each
    /// with the template that maps it and where: what the restore puts
    /// back.
    #[allow(clippy::type_complexity)]
    fn contents(
        &self,
        image: &super::Image,
        tree: &ImageTree,
    ) -> Result<Vec<(crate::process::shared_memory::SharedMemoryCopy, HostPid, Reach)>> {
        let mut out = Vec::new();
        for saved in &tree.shared_memory {
            let Some(&(host, reach)) = self.made.get(&saved.key) else {
                return Err(Error::Image(Box::new(super::Error::Corrupt {
                    path: image.path().into(),
                    what: format!("shared memory object {:?}: no process maps it", saved.key),
                })));
            };
            let copy = sparse_copy(image, &saved.data)?;
            let c = crate::process::shared_memory::SharedMemoryCopy::from_saved(saved.key, copy, saved.memfd);
            out.push((c, host, reach));
        }
        Ok(out)
    }

    /// Process `p`'s template `host` maps its objects now.
    fn made_by(&mut self, host: HostPid, p: &ProcessImage) {
        use crate::process::shared_memory::{Object, object_of};
        for m in &p.maps {
            if let Some(o) = object_of(m) {
                self.made.entry((m.dev, m.inode, o == Object::SysV)).or_insert((host, Reach::Mapping(m.start, m.end)));
            }
        }
    }
}

/// Step 2: the new process, a child of init on a free pid from
/// `next_pid` up (moved past it), stopped at birth.
fn born(maker: &mut Maker, p: &ImageProcess, next_pid: &mut i32) -> Result<(HostPid, SandboxPid)> {
    const CALL: &str = "clone3 (a template, by init)";
    let mut args = clone_args(maker.scratch + SET_TID_OFFSET, libc::CLONE_VM as u64);
    args[32..40].copy_from_slice(&(libc::SIGCHLD as u64).to_ne_bytes());
    for _ in 0..256 {
        let pid = SandboxPid(*next_pid);
        *next_pid += 1;
        write_clone_args(maker.tracee.tid, maker.scratch, &args, pid)?;
        let mut busy = 0;
        let out = crate::process::clone3_as(&mut maker.tracee, maker.scratch, pid, None, &mut busy, false)?;
        match (out.child, out.ret) {
            (Some(host), r) if r > 0 => {
                inject::wait_event_stop(host)?;
                return Ok((host, pid));
            }
            (_, r) if r == -(libc::EEXIST as i64) => continue,
            (_, r) => {
                return Err(Error::Remote {
                    pid: maker.tracee.tid,
                    call: CALL,
                    errno: std::io::Error::from_raw_os_error((-r) as i32),
                });
            }
        }
    }
    Err(Error::unsupported(p.image.pid, &p.image.comm, "pid", "no free pid for its template"))
}

/// Where a scratch mapping fits in a process whose image maps `theirs`
/// and that maps `ours` now: just below the lowest mapping of the mmap
/// area (at 1 << 46 and up) that leaves room, with a free page on each
/// side.
fn free_scratch(theirs: &[MapImage], ours: &[MapImage]) -> Option<u64> {
    let mut taken: Vec<(u64, u64)> = theirs.iter().chain(ours).map(|m| (m.start, m.end)).collect();
    taken.sort_unstable();
    let len = SCRATCH + 2 * PAGE;
    let top = taken.iter().map(|r| r.0).find(|&s| s >= 1 << 46).unwrap_or(0x7f00_0000_0000);
    let mut at = top.checked_sub(len)?;
    loop {
        match taken.iter().rev().find(|&&(s, e)| s < at + len && at < e) {
            Some(&(s, _)) => at = s.checked_sub(len)?,
            None => return (at >= 1 << 32).then_some(at + PAGE),
        }
    }
}

/// Step 4: the pages the image holds for process `pid` written into `host`.
fn write_pages(pages: &mut PageSource<'_>, pid: SandboxPid, host: HostPid) -> Result<()> {
    let writer = sandtree_sys::uffd::PageWriter::open(host.raw()).map_err(|source| Error::Proc {
        pid: host,
        what: "mem",
        source,
    })?;
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_CHUNK);
    let flush = |runs: &mut Vec<(u64, u64)>, buf: &mut Vec<u8>| -> super::Result<()> {
        writer.write(runs, buf).map_err(|source| super::Error::Proc { pid: host, what: "memory", source })?;
        runs.clear();
        buf.clear();
        Ok(())
    };
    pages
        .each_page(pid.raw() as u32, |addr, page| {
            match runs.last_mut() {
                Some((_, end)) if *end == addr => *end += PAGE,
                _ => runs.push((addr, addr + PAGE)),
            }
            buf.extend_from_slice(page);
            if buf.len() >= WRITE_CHUNK { flush(&mut runs, &mut buf) } else { Ok(()) }
        })
        .and_then(|()| if runs.is_empty() { Ok(()) } else { flush(&mut runs, &mut buf) })
        .map_err(|e| Error::Image(Box::new(e)))
}

/// Step 6: the descriptors a template of `image`'s process holds (see the
/// module docs), in new process `c` (scratch mapping at `scratch`).
fn descriptors(
    c: &mut Tracee,
    scratch: u64,
    image: &ProcessImage,
    (pipes, anonymous): (&Pipes, &mut Anonymous<'_>),
) -> Result<()> {
    let mut b = Batch::new(scratch, true);
    b.call("close_range", libc::SYS_close_range, &[Arg::Val(0), Arg::Val(u64::from(u32::MAX)), Arg::Val(0)]);
    c.run_batch(&mut b)?;
    // Objects an earlier template of the image made: taken from it.
    let mut taken: Vec<(OwnedFd, i32, u32)> = Vec::new();
    for f in image.fds.iter().filter(|f| kept_anonymous(&f.kind)) {
        let Some(&(host, fd)) = anonymous.group_of(image.pid, f.fd).and_then(|g| anonymous.made.get(&g)) else {
            continue;
        };
        let copy = crate::fdstate::pidfd_of(host)
            .and_then(|pidfd| Ok(rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty())?))
            .map_err(|source| Error::Proc { pid: host, what: "an object of a template made before", source })?;
        taken.push((copy, f.fd, f.flags));
    }
    let mut given: Vec<(std::os::fd::BorrowedFd<'_>, i32, u32)> =
        taken.iter().map(|(copy, fd, flags)| (copy.as_fd(), *fd, *flags)).collect();
    for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
        match &f.kind {
            FdKind::Pipe { ino } => {
                let Some(o_path) = pipes.get(*ino) else { continue };
                given.push((o_path.as_fd(), f.fd, f.flags));
            }
            k if kept_anonymous(k) => {
                let group = anonymous.group_of(image.pid, f.fd);
                match group.and_then(|g| anonymous.made.get(&g)) {
                    // A dup of one this process made just before.
                    Some(&(host, made)) if host == c.tid => {
                        let cloexec = u64::from(f.flags & libc::O_CLOEXEC as u32);
                        b.call(
                            "dup3",
                            libc::SYS_dup3,
                            &[Arg::Val(made as u64), Arg::Val(f.fd as u64), Arg::Val(cloexec)],
                        );
                        continue;
                    }
                    // (Taken from the template that made it, above.)
                    Some(_) => continue,
                    None => {}
                }
                let made = make_anonymous(&mut b, k, f.flags);
                b.move_fd(made, f.fd, f.flags);
                if let Some(g) = group {
                    anonymous.made.insert(g, (c.tid, f.fd));
                }
            }
            FdKind::KeptFile { path, .. } => {
                let p = b.path(path);
                let flags = f.flags & !((libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY) as u32);
                let o =
                    b.call("open (a file of a kept mount)", libc::SYS_open, &[p, Arg::Val(flags as u64), Arg::Val(0)]);
                b.move_fd(o, f.fd, f.flags);
                if f.pos != 0 {
                    let args = [Arg::Val(f.fd as u64), Arg::Val(f.pos), Arg::Val(libc::SEEK_SET as u64)];
                    b.call("lseek", libc::SYS_lseek, &args);
                }
            }
            _ => {}
        }
        if b.is_full() {
            c.run_batch(&mut b)?;
        }
    }
    c.run_batch(&mut b)?;
    if !given.is_empty() {
        let fds: Vec<_> = given.iter().map(|g| g.0).collect();
        let numbers: Vec<i32> = image.fds.iter().map(|f| f.fd).collect();
        let got = crate::kinds::give_descriptors(c, scratch + 1024, &fds, &numbers)?;
        for (tmp, &(_, fd, flags)) in got.into_iter().zip(&given) {
            crate::kinds::move_fd(c, tmp, fd, flags)?;
        }
    }
    Ok(())
}

/// Add to `b` the call that makes a new object of kept anonymous kind
/// `kind` (see [`kept_anonymous`]), with the status flags `flags` (its
/// descriptor's): empty, as the restore puts its state back (an eventfd's
/// counter, a timerfd's setting, an epoll's watches; a signalfd's mask is
/// given here).
fn make_anonymous(b: &mut Batch, kind: &FdKind, flags: u32) -> Arg {
    let nonblock = u64::from(flags & libc::O_NONBLOCK as u32);
    let cloexec = libc::O_CLOEXEC as u64;
    let val = Arg::Val;
    match kind {
        FdKind::AnonInode { state: Some(AnonState::Eventfd { semaphore, .. }), .. } => {
            let semaphore = if *semaphore { libc::EFD_SEMAPHORE as u64 } else { 0 };
            b.call("eventfd2", libc::SYS_eventfd2, &[val(0), val(nonblock | cloexec | semaphore)])
        }
        FdKind::AnonInode { state: Some(AnonState::Timerfd { clockid, .. }), .. } => {
            b.call("timerfd_create", libc::SYS_timerfd_create, &[val(*clockid as u64), val(nonblock | cloexec)])
        }
        FdKind::AnonInode { state: Some(AnonState::Signalfd { mask }), .. } => {
            let mask = b.data(&mask.to_ne_bytes());
            b.call("signalfd4", libc::SYS_signalfd4, &[val(u64::MAX), mask, val(8), val(nonblock | cloexec)])
        }
        _ => b.call("epoll_create1", libc::SYS_epoll_create1, &[val(cloexec)]),
    }
}

/// Step 7: the fingerprint of `host` must be `want`, but for the lines
/// of namespaces (`mnt:[4026531841]`).
fn same_fingerprint(host: HostPid, want: &str) -> Result<()> {
    let ours = crate::incremental::fingerprint(host, None).map_err(|source| Error::Proc {
        pid: host,
        what: "fingerprint",
        source,
    })?;
    let namespace = |l: &&str| l.ends_with(']') && l.contains(":[");
    let (a, b) = (want.lines().filter(|l| !namespace(l)), ours.lines().filter(|l| !namespace(l)));
    if let Some((w, o)) = a.zip(b).find(|(w, o)| w != o) {
        return Err(Error::Proc {
            pid: host,
            what: "the process made from its image",
            source: std::io::Error::other(format!("it has `{o}` where the image has `{w}`")),
        });
    }
    Ok(())
}
