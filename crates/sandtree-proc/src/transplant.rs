//! A child brought back by its parent: how a process whose parent is
//! another captured process is restored as that parent's child.
//!
//! A template restores a process by a `clone(CLONE_PARENT)` of itself,
//! which makes a child of the template's parent, init. A process whose
//! parent is not init must be made by its restored parent instead (the
//! kernel gives a new process no other parent, and moves one only to an
//! ancestor when its parent dies). So, once the parent is fixed up and
//! before it runs, the restore *transplants* the template into a new child
//! of it:
//!
//! 1. **clone**: `clone3(CLONE_VM, exit_signal, set_tid = [pid])` injected
//!    into the parent (or through `ns_last_pid`): the child, with its pid,
//!    shares the parent's memory for the next step only (nothing copied);
//! 2. **exec**: `execve("/proc/<template>/exe")` in it: its own, empty
//!    address space, and the template's executable (deleted or not) as
//!    its `/proc/<pid>/exe`; a `PTRACE_EVENT_EXEC` stop, no `SIGTRAP`;
//! 3. **memory map**: the template's scratch mapping at its address; every
//!    mapping the `execve` made is unmapped but the kernel's `[vdso]` and
//!    `[vvar]`s, which move to the template's addresses (`mremap`); each
//!    mapping of the template is made again (anonymous, or a private
//!    mapping of the same file opened by path, at its offset; shared
//!    memory on the template's object, see below; `[stack]`
//!    grows down; an anonymous mapping's name is set again); then
//!    `PR_SET_MM_MAP` gives it the template's code, data, heap, stack,
//!    argument and environment bounds and auxiliary vector (`[heap]`,
//!    `cmdline` and `environ` follow), in one batch;
//! 4. **contents**: the template's own pages (anonymous, present or swapped
//!    out, not the zero page: `PAGEMAP_SCAN`, [`sandtree_sys::uffd::own_pages`])
//!    are copied from the template into the child by the daemon
//!    (`process_vm_readv`, then `process_vm_writev`, or `/proc/<pid>/mem`
//!    where protections forbid); a file's pages never written stay the
//!    file's;
//! 5. **the rest a fork copies**: the FPU state; the signal handlers, the
//!    dumpable flag, the parent-death signal, the THP switch, the program
//!    break and the personality (read in the template with one batch);
//!    umask and name; resource limits, OOM score and timer slack (by the
//!    daemon); and the descriptor table: every descriptor closed, then
//!    each of the template's taken with `pidfd_getfd` onto its number with
//!    its close-on-exec flag (the very same open files, as a fork shares);
//!    then its credentials, where they are not its parent's
//!    (`process::credentials`);
//! 6. **check**: the child's fingerprint (credentials, capabilities,
//!    seccomp, dispositions, bounds, limits, namespaces, ...:
//!    `incremental::fingerprint`) must be the template's; a difference
//!    fails the restore, naming the line.
//!
//! The child is then what a clone of its template would have been, but
//! for its parent: the restore fixes it up the same way (`restore.rs`, as
//! a process that took a standby's memory, whose alternate stack and rseq
//! registration are gone). It gets no holder (a holder is a child of the
//! process it holds: its parent would see it). An interrupted call that
//! restarts through the kernel's restart block (nanosleep, poll or a futex
//! wait with a timeout) returns `EINTR` instead, as in a thread made
//! again: that block is copied by a fork only.
//!
//! Shared memory of no file (`process::shared_memory`) is mapped again on
//! the object the template holds: a descriptor of it, opened by the daemon
//! through the template's `map_files`, sent to the child
//! (`kinds::give_descriptors`); a SysV segment attached again by id (`shmat`).
//!
//! What a transplant cannot give is refused at the checkpoint
//! (`process::tree`): other shared mappings, mappings of deleted files,
//! credentials the parent cannot give, a session or group the child cannot
//! join again.

use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use sandtree_sys::ptrace;

use crate::batch::{Arg, Batch, SCRATCH};
use crate::cloned::Cloned;
use crate::inject::{self, SET_TID_OFFSET, Tracee, clone_args, write_clone_args};
use crate::model::MapImage;
use crate::template::Template;
use crate::{Error, HostPid, Result};

/// Mappings the kernel makes at `execve` and a transplant moves to the
/// template's addresses rather than making.
const MOVED: &[&str] = &["[vdso]", "[vvar]", "[vvar_vclock]"];

/// Where the `execve` argument vector goes in the parent's scratch page
/// (between the `set_tid` array and the paths, `batch.rs`).
const ARGV_OFFSET: u64 = 192;

/// `prctl(PR_SET_MM)` and its `PR_SET_MM_MAP` option, with the size of
/// `struct prctl_mm_map` (eleven addresses, the auxv pointer, its size
/// and `exe_fd`).
const PR_SET_MM: u64 = 35;
const PR_SET_MM_MAP: u64 = 14;
const PRCTL_MM_MAP_SIZE: usize = 104;

/// `prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, ...)`.
const PR_SET_VMA: u64 = 0x53564d41;

/// At most this many bytes of pages are read before they are written.
const COPY_CHUNK: usize = 32 << 20;

/// The parent, restored and fixed up, still stopped: its tracee, scratch
/// mapping and whether it may choose the pid of the process it makes.
/// With `its_parent`, the child is made a child of the parent's parent
/// (`CLONE_PARENT`: init): the parent is then the child's session's maker
/// (`process::session::made_by_session`).
pub(crate) struct Parent<'a> {
    pub tracee: &'a mut Tracee,
    pub scratch: u64,
    pub may_choose_pid: bool,
    pub its_parent: bool,
}

/// Make the process of template `t` again as a child of `parent` (see
/// the module docs), stopped and not fixed up: what [`crate::restore`]
/// makes of a template by a clone, for a process whose parent is not init.
pub(crate) fn child_of(parent: Parent<'_>, t: &mut Template, last_pid: Option<&mut crate::LastPid>) -> Result<Cloned> {
    let t_start = std::time::Instant::now();
    let pid = t.image.pid;
    let Parent { tracee: parent, scratch: parent_scratch, may_choose_pid, its_parent } = parent;
    let flags = if its_parent { libc::CLONE_VM | libc::CLONE_PARENT } else { libc::CLONE_VM };
    let mut args = clone_args(parent_scratch + SET_TID_OFFSET, flags as u64);
    // (`exit_signal`, the fifth field; with `CLONE_PARENT` the kernel gives
    // the parent's, and takes no other.)
    if !its_parent {
        args[32..40].copy_from_slice(&(t.image.exit_signal as u64).to_ne_bytes());
    }
    write_clone_args(parent.tid, parent_scratch, &args, pid)?;
    let by_last_pid =
        crate::process::pid_source(may_choose_pid, last_pid, (parent.tid, "clone3 (a child, by its parent)"))?;
    let mut busy = 0;
    let out = crate::process::clone3_as(parent, parent_scratch, pid, by_last_pid, &mut busy, true)?;
    let (Some(host), true) = (out.child, out.ret > 0) else {
        return Err(Error::Remote {
            pid: parent.tid,
            call: "clone3 (a child, by its parent)",
            errno: std::io::Error::from_raw_os_error((-out.ret) as i32),
        });
    };
    let made = (|| -> Result<Cloned> {
        inject::wait_event_stop(host)?;
        ptrace::trace_exec(host.raw()).map_err(Error::ptrace(host, "SETOPTIONS"))?;
        let regs = ptrace::regs(host.raw()).map_err(Error::ptrace(host, "GETREGS"))?;
        let mut c = Tracee::new(host, regs, parent.insn);
        let t_born = t_start.elapsed();
        exec(&mut c, parent_scratch, &format!("/proc/{}/exe", t.ns_pid))?;
        let t_exec = t_start.elapsed();
        let mut fork_copies = crate::fork_state::read_in_template(t)?;
        crate::fork_state::read_bounds(t.host, &mut fork_copies)?;
        let t_read = t_start.elapsed();
        let theirs = maps_of(t.host)?;
        let mut captured: Vec<MapImage> = theirs.iter().map(|m| as_captured(m, t).clone()).collect();
        // (Read at its first transplant: a template never runs, so its
        // map's advice stays as it was.)
        if t.advice.is_none() {
            t.advice = Some(read_advice(t.host)?);
        }
        with_advice(t.advice.as_deref().unwrap_or_default(), &mut captured);
        let scratch_prot =
            theirs.iter().find(|m| m.start == t.scratch).map_or(libc::PROT_READ | libc::PROT_WRITE, MapImage::prot);
        let layout = Layout { maps: &captured, scratch: (t.scratch, t.scratch_exec, scratch_prot), fork: &fork_copies };
        lay_out(&mut c, &layout, |c| give_objects(c, t, &theirs), &Objects::Template(t.host))?;
        let t_map = t_start.elapsed();
        copy_pages((t.host, t.scratch), host)?;
        advise(&mut c, (t.scratch, t.scratch_exec), &captured)?;
        let t_pages = t_start.elapsed();
        ptrace::set_xstate(host.raw(), &ptrace::xstate(t.host.raw()).map_err(Error::ptrace(t.host, "GETREGSET"))?)
            .map_err(Error::ptrace(host, "SETREGSET"))?;
        let proc_err = |what: &'static str| move |source| Error::Proc { pid: host, what, source };
        sandtree_sys::process::copy_limits(t.host.raw(), host.raw()).map_err(proc_err("resource limits"))?;
        for file in ["oom_score_adj", "timerslack_ns"] {
            let value =
                std::fs::read(format!("/proc/{}/{file}", t.host)).map_err(proc_err("oom score, timer slack"))?;
            std::fs::write(format!("/proc/{host}/{file}"), value).map_err(proc_err("oom score, timer slack"))?;
        }
        set_fork_copies(&mut c, (t.scratch, t.scratch_exec), &t.image, &fork_copies)?;
        take_descriptors(&mut c, t)?;
        // Its own credentials, last (the steps above need its parent's); a
        // change of ids clears the dumpable flag and the parent-death
        // signal again.
        let mut b = Batch::new(t.scratch, t.scratch_exec);
        crate::process::credentials::become_template(&mut c, &mut b, t.host)?;
        set_cleared_by_ids(&mut c, &mut b, &fork_copies)?;
        let t_rest = t_start.elapsed();
        let nice = inject::nice_of(t.host);
        if let Some(n) = nice {
            inject::set_nice(host, n);
        }
        same_as_template(t.host, host)?;
        let t_check = t_start.elapsed();
        tracing::debug!(?t_born, ?t_exec, ?t_read, ?t_map, ?t_pages, ?t_rest, ?t_check, "transplant steps");
        let mut regs = t.image.regs.to_sys();
        crate::process::threads::restart_block_lost(&mut regs);
        let tracee = Tracee::new(host, regs, c.insn).with_mask(t.image.signals.blocked);
        let fds = t.image.fds.iter().map(|f| f.fd).collect();
        Ok(Cloned { tracee, scratch: t.scratch, fds, standby: None, nice, t_start, by_parent: true })
    })();
    if busy > 0 {
        tracing::debug!(pid = pid.raw(), busy, "pid was busy");
    }
    match made {
        Ok(c) => {
            tracing::debug!(pid = pid.raw(), took = ?t_start.elapsed(), "child transplanted");
            Ok(c)
        }
        Err(e) => {
            inject::kill_tracee(host);
            Err(e)
        }
    }
}

/// Step 2: `execve` of `path` (the template's executable, through its
/// `/proc` link; an image's, by its path in the tree), written in the
/// parent's scratch page, which the child shares until then.
pub(crate) fn exec(c: &mut Tracee, parent_scratch: u64, path: &str) -> Result<()> {
    let path_at = crate::batch::write_path(c.tid, parent_scratch, path)?;
    let argv: Vec<u8> = [path_at, 0u64].iter().flat_map(|v| v.to_ne_bytes()).collect();
    ptrace::write_mem(c.tid.raw(), parent_scratch + ARGV_OFFSET, &argv).map_err(Error::ptrace(c.tid, "write argv"))?;
    c.call("execve (the template's executable)", libc::SYS_execve, &[path_at, parent_scratch + ARGV_OFFSET, 0])?;
    c.insn = inject::find_syscall_insn(c.tid)?;
    Ok(())
}

/// What step 3 makes the child's memory map: a template's, or an
/// image's process's.
pub(crate) struct Layout<'a> {
    /// The mappings, as captured (the scratch mapping's is skipped).
    pub maps: &'a [MapImage],
    /// The scratch mapping: address, whether it may hold code (batches
    /// run there), protection.
    pub scratch: (u64, bool, i32),
    /// Its memory bounds (`mm`), auxiliary vector and program break.
    pub fork: &'a crate::model::ForkState,
}

/// The memory map of process `pid`, from `/proc`.
pub(crate) fn maps_of(pid: HostPid) -> Result<Vec<MapImage>> {
    crate::procfs::maps(pid).map_err(|e| Error::Proc { pid, what: "maps", source: e })
}

/// Step 3: the child's memory map made `layout`'s (see the module docs).
/// `give` sends the child the shared memory objects it maps again (by
/// start address: the descriptor's number in the child); `objects` says
/// where the others come from ([`Objects`]).
pub(crate) fn lay_out(
    c: &mut Tracee,
    layout: &Layout<'_>,
    give: impl FnOnce(&mut Tracee) -> Result<Vec<(u64, u64)>>,
    objects: &Objects<'_>,
) -> Result<()> {
    let (scratch, scratch_exec, scratch_prot) = layout.scratch;
    let scratch_end = scratch + SCRATCH;
    let overlaps = |m: &MapImage, start: u64, end: u64| m.start < end && start < m.end;
    let is_moved = |m: &MapImage| m.path.as_deref().is_some_and(|p| MOVED.contains(&p));
    let tid = c.tid;
    let unsupported = move |what: String| Error::unsupported_by_host(tid, "", "memory", what);
    if maps_of(c.tid)?.iter().any(|m| is_moved(m) && overlaps(m, scratch, scratch_end)) {
        return Err(unsupported("the template's scratch mapping lies on the new process's vDSO".into()));
    }
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64;
    c.call("mmap (scratch)", libc::SYS_mmap, &[scratch, SCRATCH, scratch_prot as u64, flags, u64::MAX, 0])?;
    // Shared memory of no file (but SysV's): the objects the template
    // holds, sent to the child to map.
    let given = give(c)?;
    let ours = maps_of(c.tid)?;
    // (A file of another overlay of the tree, `/usr`, shows in `maps`
    // by its path on that mount: `process::memory::mapped_file_in_tree`.)
    let points = crate::process::memory::overlay_mount_points(c.tid);
    let in_tree = |path: &str| crate::process::memory::mapped_file_in_tree(tid, path, &points);
    // (A mapped file that could not be opened: which, as seen now.)
    let explain = |e: Error| match e {
        Error::Remote { call: "open (a mapped file)", errno, .. } => {
            let missing: Vec<String> = (layout.maps.iter())
                .filter_map(mapped_file)
                .map(|p| (p, in_tree(p)))
                .filter(|(_, t)| std::fs::symlink_metadata(format!("/proc/{tid}/root{t}")).is_err())
                .map(|(p, t)| if p == t { p.to_string() } else { format!("{p} (as {t})") })
                .collect();
            Error::Proc {
                pid: tid,
                what: "open (a mapped file)",
                source: std::io::Error::other(format!(
                    "{errno}; not in its tree now: {missing:?} (the tree's other overlays: {points:?})"
                )),
            }
        }
        e => e,
    };
    let mut b = Batch::new(scratch, scratch_exec);
    for m in &ours {
        if is_moved(m) || m.start == scratch || m.path.as_deref() == Some("[vsyscall]") {
            continue;
        }
        b.call("munmap", libc::SYS_munmap, &[Arg::Val(m.start), Arg::Val(m.end - m.start)]);
    }
    // The kernel's mappings, each moved where no other still has to leave.
    let theirs = layout.maps;
    let mut moves = Vec::new();
    for name in MOVED {
        let from = ours.iter().find(|m| m.path.as_deref() == Some(name));
        let to = theirs.iter().find(|m| m.path.as_deref() == Some(name));
        match (from, to) {
            (None, None) => {}
            (Some(f), Some(to)) if f.end - f.start == to.end - to.start => {
                if f.start != to.start {
                    moves.push((name, f.start, to.start, f.end - f.start));
                }
            }
            _ => return Err(unsupported(format!("its {name} mapping differs from the kernel's at an execve"))),
        }
    }
    while !moves.is_empty() {
        let free = |&(_, _, to, len): &(&&str, u64, u64, u64)| {
            !moves.iter().any(|&(_, from, dest, l)| dest != to && from < to + len && to < from + l)
        };
        let Some(i) = moves.iter().position(free) else {
            return Err(unsupported("its vDSO and the new process's lie across each other".into()));
        };
        let (_, from, to, len) = moves.remove(i);
        let flags = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64;
        let args = [Arg::Val(from), Arg::Val(len), Arg::Val(len), Arg::Val(flags), Arg::Val(to)];
        b.call("mremap (vDSO)", libc::SYS_mremap, &args);
    }
    for m in theirs {
        if is_moved(m) || m.start == scratch || m.path.as_deref() == Some("[vsyscall]") {
            continue;
        }
        match crate::process::shared_memory::object_of(m) {
            Some(o) => map_object(&mut b, (m, o), &given, objects).map_err(&unsupported)?,
            None => map_again(&mut b, m, &in_tree).map_err(&unsupported)?,
        }
        if b.is_full() {
            c.run_batch(&mut b).map_err(explain)?;
        }
    }
    let fork = layout.fork;
    let bound = |i: usize| fork.mm.get(i).copied().unwrap_or(0);
    let auxv_at = b.data(&fork.auxv);
    let mut map = Vec::with_capacity(PRCTL_MM_MAP_SIZE);
    // start_code, end_code, start_data, end_data, start_brk, brk,
    // start_stack, arg_start, arg_end, env_start, env_end.
    for v in [bound(0), bound(1), bound(2), bound(3), bound(4), fork.brk, bound(5)] {
        map.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [bound(6), bound(7), bound(8), bound(9), b.address(auxv_at)] {
        map.extend_from_slice(&v.to_ne_bytes());
    }
    map.extend_from_slice(&(fork.auxv.len() as u32).to_ne_bytes());
    map.extend_from_slice(&u32::MAX.to_ne_bytes());
    let map_at = b.data(&map);
    let args = [Arg::Val(PR_SET_MM), Arg::Val(PR_SET_MM_MAP), map_at, Arg::Val(PRCTL_MM_MAP_SIZE as u64), Arg::Val(0)];
    b.call("prctl(PR_SET_MM_MAP)", libc::SYS_prctl, &args);
    for &(_, fd) in &given {
        b.call("close (shared memory, mapped)", libc::SYS_close, &[Arg::Val(fd)]);
    }
    c.run_batch(&mut b).map_err(explain)?;
    // (Its vDSO is the template's now.)
    c.insn = inject::find_syscall_insn(c.tid)?;
    Ok(())
}

/// The file mapping `m` maps, by path, when it is one a path opens (not
/// deleted).
fn mapped_file(m: &MapImage) -> Option<&str> {
    m.path.as_deref().filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"))
}

/// Add to `b` the calls that make mapping `m` again, empty (its pages are
/// copied after); what cannot be made so, as a reason.
fn map_again(b: &mut Batch, m: &MapImage, in_tree: &dyn Fn(&str) -> String) -> std::result::Result<(), String> {
    let (start, len) = (m.start, m.end - m.start);
    let prot = m.prot() as u64;
    let file = mapped_file(m);
    if m.shared() && file.is_none() {
        return Err(format!("mapping {:x}-{:x} is shared memory", m.start, m.end));
    }
    let anon = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64;
    let val = Arg::Val;
    match m.path.as_deref() {
        None | Some("[heap]") => {
            b.call("mmap", libc::SYS_mmap, &[val(start), val(len), val(prot), val(anon), val(u64::MAX), val(0)]);
        }
        Some("[stack]") => {
            let flags = anon | libc::MAP_GROWSDOWN as u64;
            b.call(
                "mmap ([stack])",
                libc::SYS_mmap,
                &[val(start), val(len), val(prot), val(flags), val(u64::MAX), val(0)],
            );
        }
        Some(named) if named.starts_with("[anon:") && named.ends_with(']') => {
            b.call("mmap", libc::SYS_mmap, &[val(start), val(len), val(prot), val(anon), val(u64::MAX), val(0)]);
            let name = b.path(&named[6..named.len() - 1]);
            b.call(
                "prctl(PR_SET_VMA_ANON_NAME)",
                libc::SYS_prctl,
                &[val(PR_SET_VMA), val(0), val(start), val(len), name],
            );
        }
        Some(path) if file.is_some() => {
            // (A shared mapping of a file shows the file: the same file,
            // opened for writing if the mapping writes.)
            let p = b.path(&in_tree(path));
            let write = m.shared() && prot & libc::PROT_WRITE as u64 != 0;
            let flags = (if write { libc::O_RDWR } else { libc::O_RDONLY } | libc::O_CLOEXEC) as u64;
            let fd = b.call("open (a mapped file)", libc::SYS_open, &[p, val(flags), val(0)]);
            let how = if m.shared() { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
            let flags = (how | libc::MAP_FIXED) as u64;
            b.call("mmap (a file)", libc::SYS_mmap, &[val(start), val(len), val(prot), val(flags), fd, val(m.offset)]);
            b.call("close", libc::SYS_close, &[fd]);
        }
        Some(other) => return Err(format!("mapping {:x}-{:x} of {other}", m.start, m.end)),
    }
    Ok(())
}

/// Give each mapping of `maps` made again in `c` (scratch mapping at
/// `scratch`, executable or not) its advice: after its pages are written
/// (here `process_vm_writev` into transparent huge pages took 8x the time
/// of small ones: 100 MB in 400-460 ms against 50 ms; khugepaged may merge
/// them later, as for any advised mapping).
pub(crate) fn advise(c: &mut Tracee, (scratch, exec): (u64, bool), maps: &[MapImage]) -> Result<()> {
    let mut b = Batch::new(scratch, exec);
    for m in maps {
        for advice in &m.advice {
            let args = [Arg::Val(m.start), Arg::Val(m.end - m.start), Arg::Val(advice.madvise() as u64)];
            b.call("madvise (the mapping's advice)", libc::SYS_madvise, &args);
            if b.is_full() {
                c.run_batch(&mut b)?;
            }
        }
    }
    c.run_batch(&mut b).map(|_| ())
}

/// The advice of the mappings of process `pid` (`procfs::advice`:
/// `smaps`, read for a transplant or an image, never in a checkpoint's
/// frozen window).
pub(crate) fn read_advice(pid: HostPid) -> Result<Vec<crate::procfs::AdvisedRange>> {
    crate::procfs::advice(pid).map_err(|source| Error::Proc { pid, what: "smaps", source })
}

/// `maps` given the `advice` of the mappings that hold their starts.
pub(crate) fn with_advice(advice: &[crate::procfs::AdvisedRange], maps: &mut [MapImage]) {
    for m in maps.iter_mut() {
        if let Some((_, a)) = advice.iter().find(|((start, end), _)| *start <= m.start && m.start < *end) {
            m.advice = a.clone();
        }
    }
}

/// Template `t`'s mapping `m` as its image has it: `maps` names a file
/// of a mount detached since by the path on that mount (the old
/// `/dev/shm` tmpfs of a rollback: `/x` for `/dev/shm/x`).
fn as_captured<'a>(m: &'a MapImage, t: &'a Template) -> &'a MapImage {
    let same = |i: &&MapImage| (i.start, i.end, i.dev, i.inode) == (m.start, m.end, m.dev, m.inode);
    t.image.maps.iter().find(same).unwrap_or(m)
}

/// The shared memory objects of the template's mappings `theirs` that are
/// mapped again from a descriptor (`process::shared_memory`: shared
/// anonymous memory, deleted files of `/dev/shm`, memfds), opened by the daemon
/// through the template's `map_files` and sent to child `c` (its scratch
/// mapping made): each mapping's (start, descriptor number in `c`).
fn give_objects(c: &mut Tracee, t: &Template, theirs: &[MapImage]) -> Result<Vec<(u64, u64)>> {
    use crate::process::shared_memory::{self, Object, Reach};
    let mut opened = Vec::new();
    for m in theirs {
        let m = as_captured(m, t);
        if matches!(shared_memory::object_of(m), Some(Object::Anonymous | Object::DeletedShmFile | Object::Memfd)) {
            let access = match m.prot() & libc::PROT_WRITE != 0 {
                true => rustix::fs::OFlags::RDWR,
                false => rustix::fs::OFlags::RDONLY,
            };
            let object = shared_memory::open(t.host, Reach::Mapping(m.start, m.end), access)
                .map_err(|e| Error::Proc { pid: t.host, what: "shared memory of the template", source: e })?;
            opened.push((m.start, object));
        }
    }
    if opened.is_empty() {
        return Ok(Vec::new());
    }
    let fds: Vec<std::os::fd::BorrowedFd<'_>> = opened.iter().map(|(_, f)| f.as_fd()).collect();
    let numbers = crate::kinds::give_descriptors(c, t.scratch + 1024, &fds, &[])?;
    Ok(opened.iter().map(|(start, _)| *start).zip(numbers).collect())
}

/// Where step 3 learns of the shared memory objects it maps again (but
/// those `given`, by descriptor).
pub(crate) enum Objects<'a> {
    /// A template that maps them (a SysV segment's size is read there).
    Template(HostPid),
    /// An image: each SysV segment's size (by id), and the starts of the
    /// shared anonymous mappings whose object is made anew here (by the
    /// `mmap` itself: the first process of the image that maps it).
    Image { sysv_sizes: &'a [(u64, u64)], new_anonymous: &'a [u64], new_files: &'a [(u64, u64)] },
}

/// Add to `b` the calls that map shared memory object mapping `m` (of kind
/// `o`) again: from its descriptor in `given` (by start); a SysV segment
/// attached again (`shmat` at its address: counted among its attaches,
/// detachable; the whole segment only, of the size `objects` says); a
/// shared anonymous object `objects` says to make, by a new shared
/// anonymous `mmap` (a new object, of the mapping's size).
fn map_object(
    b: &mut Batch,
    (m, o): (&MapImage, crate::process::shared_memory::Object),
    given: &[(u64, u64)],
    objects: &Objects<'_>,
) -> std::result::Result<(), String> {
    use crate::process::shared_memory::{self, Object, Reach};
    let (start, len, prot) = (m.start, m.end - m.start, m.prot());
    let val = Arg::Val;
    if o == Object::SysV {
        let size = match objects {
            Objects::Template(template) => {
                shared_memory::open(*template, Reach::Mapping(m.start, m.end), rustix::fs::OFlags::RDONLY)
                    .and_then(|f| Ok(rustix::fs::fstat(&f)?.st_size as u64))
                    .map_err(|e| format!("SysV segment of mapping {:x}-{:x}: {e}", m.start, m.end))?
            }
            Objects::Image { sysv_sizes, .. } => {
                sysv_sizes.iter().find(|(id, _)| *id == m.inode).map(|(_, size)| *size).ok_or_else(|| {
                    format!("mapping {:x}-{:x}: SysV segment {} is not in the image", m.start, m.end, m.inode)
                })?
            }
        };
        if m.offset != 0 || len != size.next_multiple_of(4096) {
            return Err(format!("mapping {:x}-{:x} is a part of a SysV segment (not captured)", m.start, m.end));
        }
        const SHM_RDONLY: u64 = 0o10000;
        const SHM_EXEC: u64 = 0o100000;
        let mut flags = 0;
        if prot & libc::PROT_WRITE == 0 {
            flags |= SHM_RDONLY;
        }
        if prot & libc::PROT_EXEC != 0 {
            flags |= SHM_EXEC;
        }
        b.call("shmat (SysV segment, again)", libc::SYS_shmat, &[val(m.inode), val(start), val(flags)]);
        return Ok(());
    }
    // A deleted file of `/dev/shm` made again under its name, of its size
    // (`new_files`: start, size), mapped, then deleted.
    if let Objects::Image { new_files, .. } = objects
        && o == Object::DeletedShmFile
        && let Some(&(_, size)) = new_files.iter().find(|(s, _)| *s == start)
        && let Some(path) = m.path.as_deref().and_then(|p| p.strip_suffix(" (deleted)"))
    {
        let p = b.path(path);
        let flags = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC) as u64;
        let fd = b.call("open (a deleted file of /dev/shm, again)", libc::SYS_open, &[p, val(flags), val(0o600)]);
        b.call("ftruncate", libc::SYS_ftruncate, &[fd, val(size)]);
        let flags = (libc::MAP_SHARED | libc::MAP_FIXED) as u64;
        b.call(
            "mmap (a deleted file of /dev/shm)",
            libc::SYS_mmap,
            &[val(start), val(len), val(prot as u64), val(flags), fd, val(m.offset)],
        );
        b.call("unlink", libc::SYS_unlink, &[p]);
        b.call("close", libc::SYS_close, &[fd]);
        return Ok(());
    }
    if let Objects::Image { new_anonymous, .. } = objects
        && o == Object::Anonymous
        && new_anonymous.contains(&start)
    {
        let flags = (libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64;
        let args = [val(start), val(len), val(prot as u64), val(flags), val(u64::MAX), val(0)];
        b.call("mmap (shared anonymous memory, anew)", libc::SYS_mmap, &args);
        return Ok(());
    }
    let Some(&(_, fd)) = given.iter().find(|(s, _)| *s == start) else {
        return Err(format!("mapping {:x}-{:x}: its shared memory was not sent", m.start, m.end));
    };
    // (A private mapping of a memfd: its own pages are copied after.)
    let share = if m.shared() { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
    let flags = (share | libc::MAP_FIXED) as u64;
    let args = [val(start), val(len), val(prot as u64), val(flags), val(fd), val(m.offset)];
    b.call("mmap (shared memory, again)", libc::SYS_mmap, &args);
    Ok(())
}

/// Step 4: the template's own pages copied into the child (but its
/// scratch mapping's, at `scratch`).
fn copy_pages((from, scratch): (HostPid, u64), to: HostPid) -> Result<()> {
    let err = |pid: HostPid, what: &'static str| move |source| Error::Proc { pid, what, source };
    let maps = crate::procfs::maps(from).map_err(err(from, "maps"))?;
    let pagemap = std::fs::File::open(format!("/proc/{from}/pagemap")).map_err(err(from, "pagemap"))?;
    let mut runs = Vec::new();
    for m in maps.iter().filter(|m| holds_own_pages(m, scratch)) {
        sandtree_sys::uffd::own_pages(pagemap.as_fd(), (m.start, m.end), &mut runs).map_err(err(from, "pagemap"))?;
    }
    let writer = sandtree_sys::uffd::PageWriter::open(to.raw()).map_err(err(to, "mem"))?;
    let mut buf = Vec::new();
    let mut chunk: Vec<(u64, u64)> = Vec::new();
    let flush = |chunk: &mut Vec<(u64, u64)>, buf: &mut Vec<u8>| -> Result<()> {
        let len: usize = chunk.iter().map(|(s, e)| (e - s) as usize).sum();
        buf.resize(len, 0);
        read_runs(from, chunk, buf).map_err(err(from, "memory"))?;
        writer.write(chunk, buf).map_err(err(to, "memory"))?;
        chunk.clear();
        Ok(())
    };
    let mut size = 0usize;
    for (mut s, e) in runs {
        while s < e {
            let take = (e - s).min((COPY_CHUNK - size) as u64);
            chunk.push((s, s + take));
            size += take as usize;
            s += take;
            if size >= COPY_CHUNK {
                flush(&mut chunk, &mut buf)?;
                size = 0;
            }
        }
    }
    if !chunk.is_empty() {
        flush(&mut chunk, &mut buf)?;
    }
    Ok(())
}

/// Whether mapping `m` of a template (whose scratch mapping starts at
/// `scratch`) is one whose own pages a copy of the process carries: a
/// private mapping of the process's (not the kernel's, not the scratch).
pub(crate) fn holds_own_pages(m: &MapImage, scratch: u64) -> bool {
    !m.shared()
        && m.start != scratch
        && match m.path.as_deref() {
            None => true,
            Some(p) => !p.starts_with('[') || p == "[heap]" || p == "[stack]" || p.starts_with("[anon:"),
        }
}

/// Read `runs` of `pid`'s memory into `buf`: `process_vm_readv`, or, for
/// pages its protections hide (`PROT_NONE`), `/proc/<pid>/mem`.
pub(crate) fn read_runs(pid: HostPid, runs: &[(u64, u64)], buf: &mut [u8]) -> std::io::Result<()> {
    if sandtree_sys::uffd::read_pages(pid.raw(), runs, buf).is_ok() {
        return Ok(());
    }
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut at = 0usize;
    for &(s, e) in runs {
        let len = (e - s) as usize;
        mem.read_exact_at(&mut buf[at..at + len], s)?;
        at += len;
    }
    Ok(())
}

/// Step 5, in the child (one batch, in its scratch area `scratch`, which
/// may hold code or not): handlers, `prctl` settings, personality, umask
/// and name, from `image` and `copies`.
pub(crate) fn set_fork_copies(
    c: &mut Tracee,
    scratch: (u64, bool),
    image: &crate::model::ProcessImage,
    copies: &crate::model::ForkState,
) -> Result<()> {
    let mut b = Batch::new(scratch.0, scratch.1);
    for (sig, act) in &copies.handlers {
        let act = b.data(act);
        b.call("rt_sigaction", libc::SYS_rt_sigaction, &[Arg::Val(*sig), act, Arg::Val(0), Arg::Val(8)]);
    }
    prctl(&mut b, "prctl(PR_SET_THP_DISABLE)", libc::PR_SET_THP_DISABLE, copies.thp_disabled);
    b.call("personality", libc::SYS_personality, &[Arg::Val(copies.personality)]);
    b.call("umask", libc::SYS_umask, &[Arg::Val(u64::from(image.umask))]);
    let name = b.path(&image.comm);
    let args = [Arg::Val(libc::PR_SET_NAME as u64), name, Arg::Val(0), Arg::Val(0), Arg::Val(0)];
    b.call("prctl(PR_SET_NAME)", libc::SYS_prctl, &args);
    // (Kept across `execve`: a transplanted child has it already.)
    if copies.mdwe != 0 {
        prctl(&mut b, "prctl(PR_SET_MDWE)", crate::fork_state::PR_SET_MDWE, copies.mdwe);
    }
    set_cleared_by_ids(c, &mut b, copies)
}

/// The dumpable flag and the parent-death signal, which a change of ids
/// clears: set after the credentials (and before, for the steps between).
pub(crate) fn set_cleared_by_ids(c: &mut Tracee, b: &mut Batch, copies: &crate::model::ForkState) -> Result<()> {
    prctl(b, "prctl(PR_SET_DUMPABLE)", libc::PR_SET_DUMPABLE, copies.dumpable);
    prctl(b, "prctl(PR_SET_PDEATHSIG)", libc::PR_SET_PDEATHSIG, copies.death_signal);
    c.run_batch(b)?;
    Ok(())
}

fn prctl(b: &mut Batch, what: &'static str, option: i32, value: u64) {
    let args = [Arg::Val(option as u64), Arg::Val(value), Arg::Val(0), Arg::Val(0), Arg::Val(0)];
    b.call(what, libc::SYS_prctl, &args);
}

/// Step 5, the descriptor table: every descriptor of the child closed,
/// then each of the template's taken with `pidfd_getfd` onto its number
/// with its close-on-exec flag (the very same open files, as a fork
/// shares).
fn take_descriptors(c: &mut Tracee, t: &Template) -> Result<()> {
    let mut b = Batch::new(t.scratch, t.scratch_exec);
    let fds = template_fds(t.host)?;
    let above = fds.iter().map(|(fd, _)| *fd + 1).max().unwrap_or(1) as u64;
    b.call("close_range", libc::SYS_close_range, &[Arg::Val(0), Arg::Val(u64::from(u32::MAX)), Arg::Val(0)]);
    let pidfd =
        b.call("pidfd_open (the template)", libc::SYS_pidfd_open, &[Arg::Val(t.ns_pid.raw() as u64), Arg::Val(0)]);
    // (Every other number is free: the duplicate gets `above`.)
    b.call(
        "fcntl(F_DUPFD_CLOEXEC)",
        libc::SYS_fcntl,
        &[pidfd, Arg::Val(libc::F_DUPFD_CLOEXEC as u64), Arg::Val(above)],
    );
    b.call("close", libc::SYS_close, &[pidfd]);
    c.run_batch(&mut b)?;
    let high = Arg::Val(above);
    for (fd, cloexec) in fds {
        let got = b.call("pidfd_getfd", libc::SYS_pidfd_getfd, &[high, Arg::Val(fd as u64), Arg::Val(0)]);
        let flags = if cloexec { libc::O_CLOEXEC as u32 } else { 0 };
        b.move_fd(got, fd, flags);
        let fd_flag = if cloexec { libc::FD_CLOEXEC as u64 } else { 0 };
        b.call(
            "fcntl(F_SETFD)",
            libc::SYS_fcntl,
            &[Arg::Val(fd as u64), Arg::Val(libc::F_SETFD as u64), Arg::Val(fd_flag)],
        );
        if b.is_full() {
            c.run_batch(&mut b)?;
        }
    }
    b.call("close", libc::SYS_close, &[high]);
    c.run_batch(&mut b)?;
    Ok(())
}

/// The descriptors of template `host` with their close-on-exec flag.
fn template_fds(host: HostPid) -> Result<Vec<(i32, bool)>> {
    let err = |source| Error::Proc { pid: host, what: "fds", source };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{host}/fd")).map_err(err)? {
        let Some(fd) = entry.map_err(err)?.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let flags = crate::procfs::fd_flags(host, fd).map_err(err)?;
        out.push((fd, flags & libc::O_CLOEXEC as u32 != 0));
    }
    out.sort_unstable();
    Ok(out)
}

/// Step 6: the child's fingerprint must be the template's.
fn same_as_template(template: HostPid, child: HostPid) -> Result<()> {
    let of = |pid: HostPid| {
        crate::incremental::fingerprint(pid, None).map_err(|e| Error::Proc { pid, what: "fingerprint", source: e })
    };
    let (theirs, ours) = (of(template)?, of(child)?);
    if let Some((a, b)) = theirs.lines().zip(ours.lines()).find(|(a, b)| a != b) {
        return Err(Error::Proc {
            pid: child,
            what: "the copy of its template",
            source: std::io::Error::other(format!("it has `{b}` where its template has `{a}`")),
        });
    }
    Ok(())
}
