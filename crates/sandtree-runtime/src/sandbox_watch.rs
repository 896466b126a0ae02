//! Watching a directory of a sandbox: what is created, written, removed,
//! renamed or changed in it (and, recursively, below it), as it happens.
//!
//! inotify, from the daemon: the directory is opened in the sandbox's root
//! ([`crate::sandbox_root`], never out of it) and watched through its open
//! descriptor (`/proc/self/fd/N`), so no path is resolved on the host.
//! Recursive watches add a watch per subdirectory, and one for each
//! directory created later. A thread reads the events and sends them on a
//! channel; dropping the [`DirWatch`] ends it. Events of the sandbox's own
//! processes arrive (they go through the same overlay mount), as do the
//! files API's.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use tokio::sync::mpsc;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::sandbox_files::entry_names;
use crate::sandbox_root::SandboxPath;

/// What happened to an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirEventKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One change: the entry's path relative to the watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEvent {
    pub name: String,
    pub kind: DirEventKind,
}

/// A running watch; dropping it ends the watch.
pub struct DirWatch {
    /// The changes, in order.
    pub events: mpsc::Receiver<DirEvent>,
    /// The watched directory (absolute, in the sandbox).
    pub path: String,
    stop: Arc<AtomicBool>,
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Most events held for a slow reader (the oldest are then dropped by the
/// kernel's own queue limit, not here: the thread waits).
const QUEUE: usize = 1024;
/// Deepest recursion of a recursive watch.
const MAX_DEPTH: usize = 32;

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::MODIFY
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::ATTRIB
        | WatchFlags::ONLYDIR
}

/// Watches directory `dir` (open) as `rel`, and with `depth` > 0 its
/// subdirectories.
fn add_tree(
    inot: &OwnedFd,
    dir: OwnedFd,
    rel: String,
    depth: usize,
    wds: &mut HashMap<i32, String>,
) -> std::result::Result<(), Errno> {
    let wd = inotify::add_watch(inot, format!("/proc/self/fd/{}", dir.as_raw_fd()), mask())?;
    wds.insert(wd, rel.clone());
    if depth == 0 {
        return Ok(());
    }
    for n in entry_names(&dir)? {
        let Ok(st) = rustix::fs::statat(&dir, n.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            continue;
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if let Ok(sub) = rustix::fs::openat(&dir, n.as_c_str(), flags, Mode::empty()) {
            let name = n.to_string_lossy();
            let sub_rel = if rel.is_empty() { name.into_owned() } else { format!("{rel}/{name}") };
            let _ = add_tree(inot, sub, sub_rel, depth - 1, wds);
        }
    }
    Ok(())
}

impl Engine {
    /// Starts watching directory `path` of sandbox `id`.
    pub async fn watch_dir(&self, id: &str, path: &str, recursive: bool, user: Option<&str>) -> Result<DirWatch> {
        let account = self.files_account(id, user).await?;
        let path = SandboxPath::parse(path, &account.home).map_err(Error::InvalidArgument)?;
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        let fail = |e: Errno| crate::sandbox_files::file_error(id, &path, "watch", e);
        let dir = root.open_dir(&path).map_err(fail)?;
        let inot = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).map_err(fail)?;
        let mut wds = HashMap::new();
        let depth = if recursive { MAX_DEPTH } else { 0 };
        // (The directory's own descriptor keeps it open for the walk.)
        let dup = rustix::io::fcntl_dupfd_cloexec(&dir, 0).map_err(fail)?;
        add_tree(&inot, dup, String::new(), depth, &mut wds).map_err(fail)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("sandtree:watch".into())
            .spawn(move || read_events(inot, dir, wds, recursive, tx, stopped))
            .map_err(|e| Error::Internal(format!("starting a watch thread: {e}")))?;
        Ok(DirWatch { events: rx, path: path.as_str().to_string(), stop })
    }
}

/// A name the files API's own writes pass through, not the sandbox's: the
/// unnamed file (`#<inode>`, as the kernel names it) and its temporary
/// link (`crate::sandbox_files`). A write shows as the `Create` of its
/// path.
fn is_internal(name: &str) -> bool {
    name.starts_with(crate::sandbox_files::TEMP_PREFIX)
        || name.strip_prefix('#').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The watch's thread: reads inotify events until the watch is dropped.
fn read_events(
    inot: OwnedFd,
    dir: OwnedFd,
    mut wds: HashMap<i32, String>,
    recursive: bool,
    tx: mpsc::Sender<DirEvent>,
    stop: Arc<AtomicBool>,
) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
    while !stop.load(Ordering::Relaxed) && !tx.is_closed() {
        let mut fds = [rustix::event::PollFd::new(&inot, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec::try_from(Duration::from_millis(200)).expect("a valid timeout");
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let mut new_dirs = Vec::new();
        let mut reader = inotify::Reader::new(&inot, &mut buf);
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(Errno::AGAIN | Errno::INVAL) => break,
                Err(_) => return,
            };
            let flags = ev.events();
            if flags.contains(ReadFlags::IGNORED) {
                wds.remove(&ev.wd());
                continue;
            }
            let (Some(base), Some(name)) = (wds.get(&ev.wd()), ev.file_name()) else { continue };
            let name = name.to_string_lossy();
            if is_internal(&name) {
                continue;
            }
            let rel = if base.is_empty() { name.into_owned() } else { format!("{base}/{name}") };
            // (A rename: the old name is a Rename, the new one a Create.)
            let kind = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                DirEventKind::Create
            } else if flags.intersects(ReadFlags::MODIFY | ReadFlags::CLOSE_WRITE) {
                DirEventKind::Write
            } else if flags.contains(ReadFlags::DELETE) {
                DirEventKind::Remove
            } else if flags.contains(ReadFlags::MOVED_FROM) {
                DirEventKind::Rename
            } else if flags.contains(ReadFlags::ATTRIB) {
                DirEventKind::Chmod
            } else {
                continue;
            };
            if recursive && kind == DirEventKind::Create && flags.contains(ReadFlags::ISDIR) {
                new_dirs.push(rel.clone());
            }
            if tx.blocking_send(DirEvent { name: rel, kind }).is_err() {
                return;
            }
        }
        for rel in new_dirs {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            // (Opened one component at a time below the watched directory.)
            let mut cur = match rustix::io::fcntl_dupfd_cloexec(&dir, 0) {
                Ok(fd) => fd,
                Err(_) => continue,
            };
            let mut ok = true;
            for part in rel.split('/') {
                match rustix::fs::openat(&cur, part, flags, Mode::empty()) {
                    Ok(next) => cur = next,
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                let depth = MAX_DEPTH.saturating_sub(rel.split('/').count());
                let _ = add_tree(&inot, cur, rel, depth, &mut wds);
            }
        }
    }
}
