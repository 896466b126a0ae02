//! Epoll instances (`FdKind::AnonInode`, `eventpoll`): the template holds
//! the same instance as the running original, whose watch list changed
//! since; at the restore the list is set back to the checkpoint's by
//! `epoll_ctl` in the restored process, once every descriptor it names
//! exists again (a watch on a descriptor made anew is always added anew).

use sandtree_sys::ptrace;

use super::{Kind, Remake};
use crate::inject::Tracee;
use crate::model::{AnonState, FdImage, FdKind, ProcessImage};
use crate::{Error, HostPid, Result};

/// Epoll instances.
pub(crate) struct Epoll;

impl Kind for Epoll {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::AnonInode { state: Some(AnonState::Epoll { stale, .. }), .. } if !stale.is_empty() => Err(format!(
                "an epoll instance with watches keyed by descriptors {stale:?}, which no longer name the watched files (closed, or dup'd and closed): not captured yet"
            )),
            _ => Ok(()),
        }
    }

    fn link(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        let FdKind::AnonInode { state: Some(AnonState::Epoll { watches, .. }), .. } = &f.kind else { return Ok(()) };
        let fds = &cx.image.fds;
        let recreated: Vec<i32> = fds.iter().filter(|f| f.kind.recreated()).map(|f| f.fd).collect();
        let signalfds: Vec<i32> = fds
            .iter()
            .filter(|f| matches!(f.kind, FdKind::AnonInode { state: Some(AnonState::Signalfd { .. }), .. }))
            .map(|f| f.fd)
            .collect();
        set_watches(cx.p, cx.scratch, cx.template, f.fd, watches, &signalfds, &recreated)
    }
}

/// Make the epoll instance behind `epfd` (shared with the template, so
/// changed by the original after the checkpoint) watch exactly `watches`
/// again, by `epoll_ctl` in the restored process. A watched signalfd is
/// always added again: epoll waits for it on the signal queue of the task
/// that added it, the dead original's.
fn set_watches(
    p: &mut Tracee,
    scratch: u64,
    template: HostPid,
    epfd: i32,
    watches: &[(i32, u32, u64)],
    signalfds: &[i32],
    recreated: &[i32],
) -> Result<()> {
    let pid = p.tid;
    let now = crate::procfs::epoll_watches_of(template, epfd).map_err(|e| Error::Proc {
        pid: template,
        what: "epoll fdinfo",
        source: e,
    })?;
    let event = |p: &mut Tracee, events: u32, data: u64| -> Result<u64> {
        let mut ev = events.to_ne_bytes().to_vec();
        ev.extend_from_slice(&data.to_ne_bytes());
        ptrace::write_mem(p.tid.raw(), scratch + 1024, &ev).map_err(Error::ptrace(pid, "write epoll_event"))?;
        Ok(scratch + 1024)
    };
    for &(tfd, events, data) in &now {
        if !watches.iter().any(|w| w.0 == tfd) || signalfds.contains(&tfd) {
            let ev = event(p, events, data)?;
            // Not ours to fail on: the watched file may be gone already.
            let _ = p.syscall(libc::SYS_epoll_ctl, &[epfd as u64, libc::EPOLL_CTL_DEL as u64, tfd as u64, ev])?;
        }
    }
    for &(tfd, events, data) in watches {
        let op = match now.iter().find(|w| w.0 == tfd) {
            _ if signalfds.contains(&tfd) => libc::EPOLL_CTL_ADD,
            // A new file on that number: an entry seen there is the old
            // file's (its last holder, the killed original, may not be
            // gone yet), keyed by that file, so the new one is added.
            _ if recreated.contains(&tfd) => libc::EPOLL_CTL_ADD,
            Some(&(_, e, d)) if e == events && d == data => continue,
            Some(_) => libc::EPOLL_CTL_MOD,
            None => libc::EPOLL_CTL_ADD,
        };
        let ev = event(p, events, data)?;
        p.call("epoll_ctl", libc::SYS_epoll_ctl, &[epfd as u64, op as u64, tfd as u64, ev])?;
    }
    Ok(())
}
