//! A process's memory. A template shares it copy-on-write (the fork copies
//! the page tables, or a standby's are patched: `incremental.rs`); what a
//! template cannot hold apart from the running process is refused here:
//! a writable shared mapping of anything but a file of the tree or of
//! `/dev/shm` or shared memory (`shared_memory.rs`: memfds too), a private mapping of
//! a file the process holds open for writing; and, for a template
//! made by fork, what the fork does not copy ([`wiped_by_fork`]; mappings
//! marked `MADV_DONTFORK` are found by the map's size, `checkpoint/`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::HostPid;
use crate::check::Unrestorable;
use crate::model::{MapImage, ProcessImage};

/// A mapping of the original that a template made by fork got empty
/// while the original has pages of its own there (present, not the zero
/// page): memory marked `MADV_WIPEONFORK`, which the
/// fork zeroes (`smaps`' `wf` flag says so too, but reading `smaps` walks
/// every page, far too slow for the frozen window). Asked of the private
/// anonymous mappings of `maps` (the original's, read after the fork,
/// while it is stopped), each with one `PAGEMAP_SCAN` that stops at the
/// first page (the template's first: an ordinary mapping has its pages
/// there too; the original's only where the template has none). A
/// mapping marked but never written holds nothing to lose: not named.
/// Not seen: a marked mapping whose every page is swapped out (the
/// write tracking's markers, `incremental.rs`, look swapped out too).
pub(crate) fn wiped_by_fork(orig: HostPid, template: HostPid, maps: &[MapImage]) -> io::Result<Option<(u64, u64)>> {
    let special = ["[vdso]", "[vvar]", "[vvar_vclock]", "[vsyscall]", "[uprobes]"];
    let private_anonymous =
        |m: &&MapImage| !m.shared() && m.inode == 0 && !m.path.as_deref().is_some_and(|p| special.contains(&p));
    let open =
        |pid: HostPid| -> io::Result<OwnedFd> { Ok(std::fs::File::open(format!("/proc/{pid}/pagemap"))?.into()) };
    let template_map = open(template)?;
    let mut orig_map = None;
    for m in maps.iter().filter(private_anonymous) {
        if sandtree_sys::uffd::has_own_page(template_map.as_fd(), (m.start, m.end), true)? {
            continue;
        }
        let orig_map = match &orig_map {
            Some(fd) => fd,
            None => orig_map.insert(open(orig)?),
        };
        // (Present pages only: the tracking's markers look swapped out.)
        if sandtree_sys::uffd::has_own_page(orig_map.as_fd(), (m.start, m.end), false)? {
            return Ok(Some((m.start, m.end)));
        }
    }
    Ok(None)
}

/// The path a mapping's file had (` (deleted)` taken off).
fn mapped_path(m: &MapImage) -> Option<&str> {
    m.path.as_deref().map(|p| p.strip_suffix(" (deleted)").unwrap_or(p))
}

/// The checks of a captured image's memory map.
pub(crate) fn check(p: &ProcessImage) -> Result<(), Unrestorable> {
    let no = |resource: String, reason: String| Unrestorable { pid: p.pid, comm: p.comm.clone(), resource, reason };
    // A private mapping of a file the process holds open for writing: the
    // restore opens the file again in the rolled-back tree (or a copy of a
    // deleted one), while the template's mapping stays on the old inode,
    // which the running process may write after the checkpoint. Its pages
    // not copied yet would show those writes, and no longer the restored
    // descriptor's. (A file mapped and closed, or open read-only, is not
    // looked at: written later by path, it is not seen.)
    let writable = |f: &&crate::model::FdImage| f.flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
    let written: std::collections::HashSet<&str> = p
        .fds
        .iter()
        .filter(writable)
        .filter_map(|f| match &f.kind {
            crate::model::FdKind::LayerFile { path, .. } | crate::model::FdKind::Deleted { path, .. } => {
                Some(path.as_str())
            }
            _ => None,
        })
        .collect();
    if let Some((m, path)) =
        p.maps.iter().filter(|m| !m.shared()).find_map(|m| Some((m, mapped_path(m).filter(|p| written.contains(p))?)))
    {
        return Err(no(
            format!("mapping {:x}-{:x}", m.start, m.end),
            format!(
                "private mapping of {path}, which it holds open for writing: the mapping would stay on the file as it is, not as the checkpoint saw it, and would no longer see writes through the restored descriptor (not captured yet)"
            ),
        ));
    }
    // A writable shared mapping of a file of the tree or of `/dev/shm` is
    // mapped again at a restore (`remap_shared_files`); shared memory of no
    // file has its contents put back (`shared_memory`); of anything else
    // (a deleted file of the layers, huge pages), the template would share
    // it with the running process.
    let captured = |m: &MapImage| remapped(m) || super::shared_memory::object_of(m).is_some();
    if let Some(m) = p.maps.iter().find(|m| m.shared() && m.perms.starts_with("rw") && !captured(m)) {
        let what = m.path.clone().unwrap_or_else(|| "anonymous memory".into());
        return Err(no(
            format!("mapping {:x}-{:x}", m.start, m.end),
            format!(
                "writable shared mapping of {what}: a template would share it with the running process (not captured: only files of the tree and of /dev/shm, shared anonymous memory and SysV segments are)"
            ),
        ));
    }
    Ok(())
}

/// A shared mapping that a restore maps again by path: a writable one of
/// a file of the tree (the layers: not deleted, not under `/dev`, `/proc`
/// or `/sys`, whose mounts a rollback keeps or makes anew; mounts of the
/// sandbox's own are refused as a whole), or any of a file of `/dev/shm`
/// (a rollback gives it a fresh tmpfs with the checkpoint's files: the
/// template's mapping is of the old one's).
fn remapped(m: &MapImage) -> bool {
    let Some(path) = m.path.as_deref() else { return false };
    if !m.shared() || m.inode == 0 || !path.starts_with('/') || path.ends_with(" (deleted)") {
        return false;
    }
    if let Some(name) = path.strip_prefix("/dev/shm/") {
        return !name.is_empty() && !name.contains('/');
    }
    m.perms.starts_with("rw") && !["/dev/", "/proc/", "/sys/", "/memfd:", "/SYSV"].iter().any(|p| path.starts_with(p))
}

/// At a restore of process `host` (added to `b`): each writable shared
/// mapping of a file of the tree mapped again, at its address, onto the
/// file in the rolled-back tree ([`mapped_file_in_tree`]) (which has the bytes the mapping had at the
/// checkpoint: the checkpoint's snapshot wrote them out). The template's
/// mapping, which the restored process inherited, is of the replaced
/// tree's file, which the killed original went on writing.
pub(crate) fn remap_shared_files(b: &mut crate::batch::Batch, image: &ProcessImage, host: HostPid) {
    use crate::batch::Arg;
    let mut points = None;
    for m in image.maps.iter().filter(|m| remapped(m)) {
        let points = points.get_or_insert_with(|| overlay_mount_points(host));
        let path = b.path(&mapped_file_in_tree(host, m.path.as_deref().unwrap_or_default(), points));
        let prot = m.prot();
        let access = if prot & libc::PROT_WRITE != 0 { libc::O_RDWR } else { libc::O_RDONLY };
        let flags = access | libc::O_CLOEXEC | libc::O_NOCTTY;
        let fd = b.call("open (a file mapped shared)", libc::SYS_open, &[path, Arg::Val(flags as u64), Arg::Val(0)]);
        let args = [
            Arg::Val(m.start),
            Arg::Val(m.end - m.start),
            Arg::Val(prot as u64),
            Arg::Val((libc::MAP_SHARED | libc::MAP_FIXED) as u64),
            fd,
            Arg::Val(m.offset),
        ];
        b.call("mmap (a file mapped shared, again)", libc::SYS_mmap, &args);
        b.call("close", libc::SYS_close, &[fd]);
    }
}

/// At a restore: the mappings marked `MADV_DONTFORK` at the checkpoint
/// marked again (added to `b`). The template had them as ordinary
/// mappings (the mark was lifted for its fork, `checkpoint/`), and so does
/// the restored process, a fork of it.
pub(crate) fn mark_again(b: &mut crate::batch::Batch, image: &crate::model::ProcessImage) {
    use crate::batch::Arg;
    for m in image.maps.iter().filter(|m| m.dont_fork) {
        let args = [Arg::Val(m.start), Arg::Val(m.end - m.start), Arg::Val(libc::MADV_DONTFORK as u64)];
        b.call("madvise(MADV_DONTFORK)", libc::SYS_madvise, &args);
    }
}

/// The mount points of the overlays of `host`'s tree other than its root
/// (`/usr`: the sandbox's layers of it), from its `mounts`. Not the
/// daemon's trees under the kept `/dev` (a layered checkpoint's staged
/// one, a rollback's old one, which init detaches in its own time): a
/// mapped file resolved there could be gone by the time it is opened.
pub(crate) fn overlay_mount_points(host: HostPid) -> Vec<String> {
    let mounts = std::fs::read_to_string(format!("/proc/{host}/mounts")).unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (_, point, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "overlay" && point != "/" && !point.starts_with("/dev/")).then(|| point.to_string())
        })
        .collect()
}

/// The path in `host`'s tree of a file that `maps` names `path`. A file
/// of an overlay mounted below the root (`points`: `/usr`) shows there by
/// its path on that overlay's layer, without the mount point (the kernel
/// maps the layer's own file): `/local/lib/x.so` for `/usr/local/lib/x.so`
/// (`/lib/...` and `/bin/...` still resolve, through the merged-`/usr`
/// symlinks). The path as it is when it names a file of the tree; else the
/// first mount point that makes it one; else as it is.
pub(crate) fn mapped_file_in_tree(host: HostPid, path: &str, points: &[String]) -> String {
    let exists = |p: &str| std::fs::symlink_metadata(format!("/proc/{host}/root{p}")).is_ok();
    if exists(path) {
        return path.to_string();
    }
    points.iter().map(|point| format!("{point}{path}")).find(|p| exists(p)).unwrap_or_else(|| path.to_string())
}
