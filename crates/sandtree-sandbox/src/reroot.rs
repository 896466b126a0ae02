//! Rollback in place: init swaps the sandbox's filesystem tree under itself.
//!
//! A rollback used to kill init (and with it the namespaces) and boot a new
//! one on the rolled-back subvolume: ~4 ms of namespace, cgroup and mount
//! setup. Keeping init, its namespaces, its cgroup and its `/dev` (with the
//! devpts instance) and swapping only the overlays costs a fraction of that,
//! and is the step into which restored processes will later be put.
//!
//! Sequence (runs in init, request [`crate::protocol::Request::Reroot`], the
//! overlay mount fds built by the zygote as real root attached):
//! 1. SIGKILL every process but init and the process templates
//!    (`sandtree-proc`), scan after scan until no new pid shows
//!    ([`signal_all`]; the daemon sends `KillAll` first, while the zygote
//!    builds the layers). Init does not wait for them: a killed process
//!    never runs user code again, and tearing down a large one takes
//!    milliseconds that overlap with the swap and the restore. Init reaps
//!    them in its main loop; the daemon's `WaitGone`, sent while it
//!    restores processes, waits (bounded) until every killed pid is reaped.
//! 2. `move_mount` the new root overlay on top of `/`; every further layer
//!    onto its target inside the new root (resolved through the mount fd).
//! 3. `move_mount` the old tree's `/proc` and `/dev` (with its binds, devpts
//!    and `/dev/shm`) into the new root: they are not part of the state.
//! 4. `fchdir` into the new root, `pivot_root(".", ".")` (the kernel moves
//!    the root and cwd of every task that used the old root: init and the
//!    templates: a fork under way, whose child is not on the task list
//!    yet, keeps the old root, see `sandtree-proc`'s `holder.rs`), and
//!    detach the old root, which sits on top of `.` now (after step 5,
//!    and at the first request after the rollback's `WaitGone`, once the
//!    killed processes are reaped and the restore is over: a path walk
//!    never crosses a mount stacked on its starting point, so nothing
//!    reaches the old tree meanwhile);
//! 5. detach whatever the sandbox itself mounted under the kept `/proc` and
//!    `/dev`, and mount a fresh `/dev/shm` if the old one holds anything
//!    (its files belong to the old state).
//!
//! The old overlays are released when the detach returns (volatile overlays:
//! no sync). A failure part-way leaves init in an unknown tree: the caller
//! must then kill the sandbox and boot it again.
//!
//! # Restack (a layered checkpoint)
//!
//! [`restack`] is steps 2-4 without killing anything and without step 5:
//! the new overlays hold the old writable directories as their top lower
//! layers under new empty upper ones, so the tree looks the same and every
//! write lands in the new uppers from then on. It is only done when nothing
//! could still write through the old tree: init is alone (other pids are
//! process templates, which never run until a restore reopens their files,
//! or zombies) and the only mounts are setup's (a mount the sandbox made
//! would be left behind in the old tree). `/proc` and `/dev` move across
//! with everything under them, `/dev/shm` included: they are live state,
//! not part of the checkpoint. Init handles one request at a time, so a
//! spawn either came before the check (and is seen by it) or comes after
//! the swap (and runs in the new tree).
//!
//! With live processes (stopped by the daemon, spared like templates) the
//! restack comes in halves, so that they can reopen their files of the tree
//! in the new one before it replaces the old (`sandtree-proc`'s
//! `repoint.rs`): [`stage`] checks the mounts (the daemon holds every
//! process, so the pids need no look) and mounts the new tree at
//! [`STAGE`] (on the kept `/dev`), where they reopen them; then
//! [`swap_staged`] moves the staged root to `/` (descriptors opened through
//! it follow the mount) and does steps 3-4, or [`unstage`] detaches it and
//! nothing changed. The old root is put under the new `/dev`
//! (`pivot_root(".", put_old)`), not on top of the new root, where a `..`
//! reaching `/` would cross into it while the processes run, and detached
//! after the reply.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{MntFlags, umount2};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use rustix::fs::{CWD, Mode};
use rustix::mount::{MoveMountFlags, move_mount};

/// How long the killed processes may take to die.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// The mounts kept across a reroot.
const KEPT: [&str; 2] = ["proc", "dev"];

/// An exit reaped while killing.
pub(crate) struct Reaped {
    pub pid: i32,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// Step 1: SIGKILL every other process of the pid namespace except `keep`
/// (process templates, which are ptrace-stopped and never run), without
/// waiting for them to die.
///
/// Every pid in `/proc` that is neither init nor kept is killed, and the
/// scan repeats until it finds no new one: a child forked after a scan by a
/// process not yet killed is found by the next one, and a process with
/// SIGKILL pending can no longer fork (`copy_process` fails), so the scans
/// end. A killed process never runs user code again; it may still finish a
/// syscall in the kernel (on the old tree, which is discarded) and is
/// reaped by init's main loop. Returns the pids killed (signalled).
///
/// With `members` (the sandbox's cgroup directory, from the daemon) the
/// list is its `cgroup.procs` instead of `/proc`: every process of the
/// sandbox but the daemon's pool, which sits in a child cgroup (see
/// `cgroup.rs`). A process cannot leave its cgroup (the cgroup files are
/// the host's), and a child starts in its parent's, so the scans end the
/// same way; they read a few pids instead of the hundreds of the pool
/// (0.3-0.7 ms of a rollback, mostly the first scan's, cold). Zombies are
/// not members (their parent, or init, reaps them; the caller signals the
/// pids it restores itself). If the file cannot be read, `/proc` it is.
pub(crate) fn signal_all(keep: &[i32], members: Option<&OwnedFd>) -> Vec<i32> {
    // (Sets: with 100 checkpoints' templates, standbys and holders kept,
    // ~600 pids, list lookups took ~1 ms of a rollback.)
    let keep: std::collections::HashSet<i32> = keep.iter().copied().collect();
    let mut killed: std::collections::HashSet<i32> = std::collections::HashSet::new();
    let mut signaled = Vec::new();
    let mut members = members;
    for _ in 0..10_000 {
        let listed = match members.map(cgroup_members) {
            Some(Ok(pids)) => pids,
            Some(Err(e)) => {
                eprintln!("sandtree init: the sandbox's cgroup.procs: {e}; listing /proc");
                members = None;
                others()
            }
            None => others(),
        };
        let new: Vec<i32> = listed.into_iter().filter(|p| !keep.contains(p) && !killed.contains(p)).collect();
        if new.is_empty() {
            break;
        }
        for &pid in &new {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                signaled.push(pid);
            }
        }
        killed.extend(new);
    }
    signaled
}

/// Reap until none of `awaiting` (pids killed by [`signal_all`]) is
/// `present`, for at most [`KILL_TIMEOUT`] (a task in
/// uninterruptible sleep cannot die before its syscall ends); on timeout
/// the error names the pids still there. Only the killed pids count:
/// processes that appear meanwhile (restored ones, the tracer's holders)
/// do not, so the daemon can restore while init waits.
pub(crate) fn wait_gone(
    sigfd: &SignalFd,
    awaiting: &mut std::collections::HashSet<i32>,
    reaped: &mut Vec<Reaped>,
    present: &dyn Fn(i32) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + KILL_TIMEOUT;
    loop {
        let before = reaped.len();
        reap_all(reaped)?;
        for r in &reaped[before..] {
            awaiting.remove(&r.pid);
        }
        // Reaped by another parent: gone all the same (`present` tells a
        // pid reused meanwhile from its killed owner).
        awaiting.retain(|&p| present(p));
        if awaiting.is_empty() {
            return Ok(());
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            let mut left: Vec<i32> = awaiting.iter().copied().collect();
            left.sort_unstable();
            return Err(format!("processes did not die within {KILL_TIMEOUT:?}: {left:?}"));
        }
        let ms = wait.as_millis().clamp(1, 5) as u16;
        let mut fds = [PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(ms));
        while let Ok(Some(_)) = sigfd.read_signal() {}
    }
}

/// Reap every child that has exited (`__WALL`: restored processes are
/// clone children with no exit signal).
fn reap_all(reaped: &mut Vec<Reaped>) -> Result<(), String> {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) => {
                reaped.push(Reaped { pid: pid.as_raw(), code: Some(code), signal: None })
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                reaped.push(Reaped { pid: pid.as_raw(), code: None, signal: Some(sig as i32) })
            }
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(()),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(format!("waitpid: {e}")),
        }
    }
}

/// Reap child `pid` if it has exited (`waitid(P_PID)`: the kernel looks
/// that one child up, not the whole list).
pub(crate) fn reap_one(pid: i32) -> Option<Reaped> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::__WALL;
    match nix::sys::wait::waitid(nix::sys::wait::Id::Pid(Pid::from_raw(pid)), flags) {
        Ok(WaitStatus::Exited(p, code)) => Some(Reaped { pid: p.as_raw(), code: Some(code), signal: None }),
        Ok(WaitStatus::Signaled(p, sig, _)) => Some(Reaped { pid: p.as_raw(), code: None, signal: Some(sig as i32) }),
        _ => None,
    }
}

/// Pids other than init in `cgroup.procs` of cgroup directory `dir`
/// (opened anew for each read: cgroup v1 keeps the list it read at an
/// open file's first read).
fn cgroup_members(dir: &OwnedFd) -> io::Result<Vec<i32>> {
    use std::io::Read;
    let fd = rustix::fs::openat(
        dir,
        "cgroup.procs",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut text = String::new();
    std::fs::File::from(fd).read_to_string(&mut text)?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).filter(|p| *p != 1).collect())
}

/// Pids other than init still present (zombies included until reaped).
fn others() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<i32> =
        dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).filter(|p| *p != 1).collect();
    pids.sort_unstable();
    pids
}

fn step<E: Into<io::Error>>(what: impl FnOnce() -> String) -> impl FnOnce(E) -> String {
    move |e| format!("{}: {}", what(), e.into())
}

fn mkdir_in(dir: &OwnedFd, rel: &Path) -> Result<(), String> {
    match rustix::fs::mkdirat(dir, rel, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(format!("mkdir {} in the new root: {e}", rel.display())),
    }
}

/// Mounts known to be the sandbox's own set-up or ours (unique mount id,
/// mount point), from a listing taken when nothing but init could mount:
/// at init's start and at the end of each swap, before its reply. Mount
/// ids are never reused, so a mount listed here is one a check has passed
/// already (or that init made). Reading `mountinfo` costs ~0.1-0.2 ms
/// (an overlay prints every layer's path); [`listmount`] and the mount
/// points cost ~30 µs: when every mount is approved, the checks of
/// [`stage`], [`restack`] and the sweep after a rollback skip the read.
///
/// [`listmount`]: sandtree_sys::mount::list_mounts
#[derive(Debug, Default)]
pub(crate) struct Approved(std::collections::HashMap<u64, PathBuf>);

impl Approved {
    /// Every mount there is now (call it only when nothing but init can
    /// mount: nothing else runs, or every other process is held).
    pub(crate) fn now() -> Approved {
        Approved(listing().map(|l| l.into_iter().collect()).unwrap_or_default())
    }

    /// After a swap of ours, before its reply: every mount there is now.
    /// The mounts were checked before the swap and every other process is
    /// held or killed since, so a mount already approved is where it was
    /// (the swap's moves keep `/proc` and `/dev` at their paths; the old
    /// root's paths go stale, and it is detached next): only the new ones
    /// (the new tree's layers, a fresh `/dev/shm`) are looked up.
    fn update(&mut self) {
        let Ok(ids) = sandtree_sys::mount::list_mounts() else {
            self.0.clear();
            return;
        };
        let mut known = std::mem::take(&mut self.0);
        for id in ids {
            let point = match known.remove(&id) {
                Some(p) => p,
                None => match sandtree_sys::mount::mount_point(id) {
                    Ok(p) => p,
                    Err(_) => {
                        self.0.clear();
                        return;
                    }
                },
            };
            self.0.insert(id, point);
        }
    }

    /// Whether every mount of `mounts` is approved.
    fn all(&self, mounts: &[(u64, PathBuf)]) -> bool {
        !self.0.is_empty() && mounts.iter().all(|(id, p)| self.0.get(id) == Some(p))
    }
}

/// (unique id, mount point) of every mount of the namespace; `None` when
/// the kernel cannot tell (no `listmount`: the callers read `mountinfo`).
fn listing() -> Option<Vec<(u64, PathBuf)>> {
    let ids = sandtree_sys::mount::list_mounts().ok()?;
    ids.into_iter().map(|id| sandtree_sys::mount::mount_point(id).ok().map(|p| (id, p))).collect()
}

/// Checks a request before anything is killed.
pub(crate) fn validate(targets: &[PathBuf], layers: &[OwnedFd]) -> Result<(), String> {
    if targets.len() != layers.len() || targets.first().map(|t| t != Path::new("/")).unwrap_or(true) {
        return Err(format!("reroot: {} targets for {} layers, first must be /", targets.len(), layers.len()));
    }
    if targets.iter().skip(1).any(|t| !t.is_absolute() || t.components().any(|c| c.as_os_str() == "..")) {
        return Err(format!("reroot: bad layer targets {targets:?}"));
    }
    Ok(())
}

/// Steps 2-5: make `layers` (root first, with their targets) the tree;
/// [`detach_old_root`] completes it. The caller has run [`validate`]
/// (before killing anything).
pub(crate) fn swap_root(targets: &[PathBuf], layers: Vec<OwnedFd>, approved: &mut Approved) -> Result<(), String> {
    swap_tree(targets, layers)?;
    // A path walk does not cross the old root stacked on the new one: the
    // sweep sees the new tree.
    let res = sweep_kept(approved);
    // (The killed processes mount nothing, the restored ones are not
    // back yet.) The sweep's own listing, when it changed nothing.
    match res {
        Ok(Some(now)) => {
            approved.0 = now.into_iter().collect();
            Ok(())
        }
        other => {
            approved.update();
            other.map(|_| ())
        }
    }
}

/// Steps 2-4.
fn swap_tree(targets: &[PathBuf], layers: Vec<OwnedFd>) -> Result<(), String> {
    let root = &layers[0];
    move_mount(root.as_fd(), "", CWD, "/", MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(step(|| "attach the new root".into()))?;
    attach_layers(root, targets, &layers)?;
    enter(root)
}

/// Steps 3-4, `root` being attached on top of `/`.
fn enter(root: &OwnedFd) -> Result<(), String> {
    move_kept(root)?;
    rustix::process::fchdir(root).map_err(step(|| "enter the new root".into()))?;
    nix::unistd::pivot_root(".", ".").map_err(step(|| "pivot_root".into()))
}

/// Step 3: `/proc` and `/dev` into `root`.
fn move_kept(root: &OwnedFd) -> Result<(), String> {
    for name in KEPT {
        // "/proc" resolves in the old tree: a path walk does not cross the
        // mount stacked on its starting point.
        let from = format!("/{name}");
        attach(root, Path::new(name), &|| move_mount(CWD, from.as_str(), root.as_fd(), name, MoveMountFlags::empty()))
            .map_err(step(|| format!("move /{name} into the new root")))?;
    }
    Ok(())
}

/// Move a mount to `rel` inside `root` with `mv`; the mount point usually
/// exists in the new tree: it is made only when the move finds none (a
/// lookup through every layer saved per mount).
fn attach(root: &OwnedFd, rel: &Path, mv: &dyn Fn() -> rustix::io::Result<()>) -> rustix::io::Result<()> {
    match mv() {
        Err(rustix::io::Errno::NOENT) => {
            mkdir_in(root, rel).map_err(|_| rustix::io::Errno::NOENT)?;
            mv()
        }
        other => other,
    }
}

/// Every layer but the root onto its target inside `root`.
fn attach_layers(root: &OwnedFd, targets: &[PathBuf], layers: &[OwnedFd]) -> Result<(), String> {
    for (target, fd) in targets.iter().zip(layers).skip(1) {
        let rel = target.strip_prefix("/").unwrap_or(target);
        attach(root, rel, &|| move_mount(fd.as_fd(), "", root.as_fd(), rel, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH))
            .map_err(step(|| format!("attach layer {}", target.display())))?;
    }
    Ok(())
}

/// Where [`stage`] mounts the next tree: on the kept `/dev` (not part of
/// any checkpoint), reachable by the sandbox's processes.
pub const STAGE: &str = "/dev/.sandtree-next";

/// A layered checkpoint's swap (see the module docs); `Err((why, EBUSY))`
/// when init is not alone or the sandbox mounted something, and nothing
/// was changed.
pub(crate) fn restack(
    targets: &[PathBuf],
    keep: &[i32],
    layers: Vec<OwnedFd>,
    approved: &mut Approved,
) -> Result<(), (String, Option<i32>)> {
    validate(targets, &layers).map_err(|e| (e, None))?;
    check_alone(targets, keep, approved)?;
    swap_tree(targets, layers).map_err(|e| (e, None))?;
    // (Init is alone.)
    approved.update();
    Ok(())
}

/// The first half of a restack with live processes (see the module docs):
/// the mount check (the daemon holds every other process: stopped, spawns
/// held, templates being made), then the new tree is mounted at [`STAGE`],
/// where the stopped processes reopen their files. Any error leaves nothing
/// changed (`EBUSY`).
pub(crate) fn stage(
    targets: &[PathBuf],
    layers: Vec<OwnedFd>,
    approved: &Approved,
) -> Result<(), (String, Option<i32>)> {
    validate(targets, &layers).map_err(|e| (e, None))?;
    // (What a daemon that died part-way left, or the sandbox put there.)
    clear(STAGE).and_then(|()| clear(OLD)).map_err(|e| (e, None))?;
    check_mounts(targets, approved)?;
    let staged = (|| {
        // A directory made now, by init: the sandbox's processes share
        // `/dev` and could have put a symlink there.
        std::fs::create_dir(STAGE).map_err(|e| format!("mkdir {STAGE}: {e}"))?;
        let root = &layers[0];
        move_mount(root.as_fd(), "", CWD, STAGE, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
            .map_err(step(|| "stage the new root".into()))?;
        attach_layers(root, targets, &layers)
    })();
    staged.map_err(|e| {
        let _ = unstage();
        (e, Some(Errno::EBUSY as i32))
    })
}

/// Undo [`stage`].
pub(crate) fn unstage() -> Result<(), String> {
    clear(STAGE)
}

/// Clear what is at `path` (a tree left mounted there by a daemon or init
/// that died part-way, or anything the sandbox put there; [`STAGE`] and
/// [`OLD`] are on its `/dev`). Never follows a symlink.
fn clear(path: &str) -> Result<(), String> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.is_dir() {
        return std::fs::remove_file(path).map_err(|e| format!("remove {path}: {e}"));
    }
    match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(format!("detach {path}: {e}")),
    }
    std::fs::remove_dir(path).map_err(|e| format!("remove {path}: {e}"))
}

/// The second half: the staged tree becomes the root (the files opened
/// through it are the new tree's); the old root is left at [`OLD`], for
/// [`detach_staged_old`] after the reply.
pub(crate) fn swap_staged(approved: &mut Approved) -> Result<(), String> {
    let root: OwnedFd = rustix::fs::open(
        STAGE,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(step(|| format!("open {STAGE}")))?;
    move_mount(root.as_fd(), "", CWD, "/", MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(step(|| "move the staged root".into()))?;
    move_kept(&root)?;
    // The old root goes to [`OLD`], not on top of the new one: a `..` that
    // reaches `/` would cross into a mount stacked there, and the
    // processes run before it is detached (after the reply: detaching
    // waits for an RCU grace period).
    let old = Path::new(OLD).strip_prefix("/").unwrap_or(Path::new(OLD));
    rustix::fs::mkdirat(&root, old, Mode::from_raw_mode(0o700))
        .map_err(step(|| format!("mkdir {OLD} in the new root")))?;
    rustix::process::fchdir(&root).map_err(step(|| "enter the new root".into()))?;
    nix::unistd::pivot_root(".", old).map_err(step(|| "pivot_root".into()))?;
    nix::unistd::chdir("/").map_err(step(|| "chdir /".into()))?;
    let _ = std::fs::remove_dir(STAGE);
    // (Every other process is still held.)
    approved.update();
    Ok(())
}

/// Where [`swap_staged`] puts the old root until [`detach_staged_old`].
pub const OLD: &str = "/dev/.sandtree-old";

/// Detach the old root [`swap_staged`] left at [`OLD`].
pub(crate) fn detach_staged_old() -> Result<(), String> {
    clear(OLD)
}

/// Whether init is alone but for `keep` and only setup's mounts exist
/// (`Err((why, EBUSY))` if not).
fn check_alone(targets: &[PathBuf], keep: &[i32], approved: &Approved) -> Result<(), (String, Option<i32>)> {
    let busy = |why: String| (why, Some(Errno::EBUSY as i32));
    let keep: std::collections::HashSet<i32> = keep.iter().copied().collect();
    for pid in others().into_iter().filter(|p| !keep.contains(p)) {
        // Every thread: a leader that called pthread_exit shows as a
        // zombie while its other threads run.
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
            .unwrap_or_default();
        for tid in tasks {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
            if !matches!(state, Some('Z') | None) {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                return Err(busy(format!("pid {pid} ({}) runs", comm.trim_end())));
            }
        }
    }
    check_mounts(targets, approved)
}

/// Whether only the layers and what setup mounted under /proc and /dev
/// exist: a mount the sandbox made (a bind of a directory of the tree,
/// say) would keep writing into the old tree, the checkpoint's layer.
fn check_mounts(targets: &[PathBuf], approved: &Approved) -> Result<(), (String, Option<i32>)> {
    if listing().is_some_and(|now| approved.all(&now)) {
        return Ok(());
    }
    let busy = |why: String| (why, Some(Errno::EBUSY as i32));
    let mounts = sandtree_sys::mountinfo::mounts().map_err(|e| (format!("read mountinfo: {e}"), None))?;
    let shm = Path::new("/dev/shm");
    let ours = |t: &Path| targets.iter().any(|l| l == t) || t == shm || setup_mount(t);
    if let Some(m) = mounts.iter().find(|m| !ours(&m.target)) {
        return Err(busy(format!("the sandbox mounted {} on {}", m.fstype, m.target.display())));
    }
    // More than one mount on one of them: the sandbox stacked its own.
    for m in &mounts {
        if mounts.iter().filter(|o| o.target == m.target).count() > 1 && m.target != Path::new("/") {
            return Err(busy(format!("the sandbox mounted {} on {}", m.fstype, m.target.display())));
        }
    }
    Ok(())
}

/// Step 4's end, after the reply (nothing walks into the old root, which
/// sits on top of the new one, so the restore need not wait for it):
/// detach the old tree, whose overlays are then released.
pub(crate) fn detach_old_root() -> Result<(), String> {
    umount2(".", MntFlags::MNT_DETACH).map_err(step(|| "detach the old root".into()))?;
    nix::unistd::chdir("/").map_err(step(|| "chdir /".into()))
}

/// Whether `t` is where setup mounts something under the kept `/proc` and
/// `/dev` (besides `/dev/shm`).
fn setup_mount(t: &Path) -> bool {
    t == Path::new("/proc")
        || t == Path::new("/dev")
        || t == Path::new("/dev/pts")
        || crate::spawn::DEV_NODES.iter().any(|n| t == Path::new("/dev").join(n))
}

/// Step 5: the kept `/proc` and `/dev` came with whatever the sandbox
/// mounted under them (a bind of an old-tree directory would keep the old
/// layer mounted and visible): detach everything there that setup did not
/// make, and give `/dev/shm` (files of the old state) a fresh tmpfs unless
/// it is empty. Returns the listing of every mount it took, when every
/// mount under the kept ones was approved (it then changed nothing).
fn sweep_kept(approved: &Approved) -> Result<Option<Vec<(u64, PathBuf)>>, String> {
    // An empty `/dev/shm` (our one tmpfs there, nothing created, mode as
    // made) holds no state: it stays, which saves a mount per rollback.
    let shm = Path::new("/dev/shm");
    let shm_empty = || {
        std::fs::read_dir(shm).is_ok_and(|mut d| d.next().is_none())
            && std::fs::metadata(shm).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.mode() & 0o7777 == 0o1777 && m.uid() == 0 && m.gid() == 0
            })
    };
    // Every mount under the kept ones approved (set-up's, or ours): none
    // to detach, and the one at `/dev/shm` is the tmpfs we made.
    if let Some(now) = listing() {
        let kept: Vec<_> =
            now.iter().filter(|(_, t)| t.starts_with("/proc") || t.starts_with("/dev")).cloned().collect();
        if approved.all(&kept) && kept.iter().filter(|(_, t)| t == shm).count() == 1 && shm_empty() {
            return Ok(Some(now));
        }
    }
    let mounts = sandtree_sys::mountinfo::mounts().map_err(|e| format!("read mountinfo: {e}"))?;
    let shm_clean = {
        let at_shm: Vec<_> = mounts.iter().filter(|m| m.target == shm).collect();
        at_shm.len() == 1 && at_shm[0].fstype == "tmpfs" && shm_empty()
    };
    let ours = |t: &Path| (shm_clean && t == shm) || setup_mount(t);
    for m in mounts.iter().rev() {
        let under_kept = m.target.starts_with("/proc") || m.target.starts_with("/dev");
        if under_kept && !ours(&m.target) {
            match umount2(&m.target, MntFlags::MNT_DETACH) {
                Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(format!("detach {}: {e}", m.target.display())),
            }
        }
    }
    if shm_clean {
        return Ok(None);
    }
    crate::spawn::mount_dev_shm(shm).map(|()| None).map_err(|e| format!("mount /dev/shm: {e}"))
}
