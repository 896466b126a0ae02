//! A process's memory. A template shares it copy-on-write (the fork copies
//! the page tables, or a standby's are patched: `incremental.rs`); what a
//! template cannot hold apart from the running process is refused here:
//! a mapping of a memfd, a writable shared mapping; and, for a template
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

/// The checks of a captured image's memory map.
pub(crate) fn check(p: &ProcessImage) -> Result<(), Unrestorable> {
    let no = |resource: String, reason: String| Unrestorable { pid: p.pid, comm: p.comm.clone(), resource, reason };
    if let Some(m) = p.maps.iter().find(|m| m.path.as_deref().is_some_and(|p| p.starts_with("/memfd:"))) {
        return Err(no(
            format!("mapping {:x}-{:x}", m.start, m.end),
            format!(
                "mapping of {}: its pages would be the running process's memfd, not the checkpoint's copy",
                m.path.as_deref().unwrap_or("a memfd")
            ),
        ));
    }
    if let Some(m) = p.maps.iter().find(|m| m.shared() && m.perms.starts_with("rw")) {
        let what = m.path.clone().unwrap_or_else(|| "anonymous memory".into());
        return Err(no(
            format!("mapping {:x}-{:x}", m.start, m.end),
            format!("writable shared mapping of {what}: a template would share it with the running process"),
        ));
    }
    Ok(())
}
