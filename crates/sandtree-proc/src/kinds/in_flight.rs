//! Files in flight: descriptors sent on a unix socket with `SCM_RIGHTS`
//! and not received yet. They are in no process's descriptor table, only
//! in the socket's queue, attached to the message they were sent with.
//!
//! **Checkpoint (pass 1, the process stopped).** The queue of a connected
//! unix socket is peeked (`unix::capture_queue`); a peek installs the
//! files in flight in the daemon, as new descriptors of the same open
//! files. A template forked for the process is then given them
//! ([`give_to_template`]: `SCM_RIGHTS` again, received by an injected
//! `recvmsg`), on numbers above every number of the process. From there
//! each is captured like a descriptor of the process, through the
//! template, and marked [`FdImage::in_flight`]: a pipe end is paired with
//! the pipe's other ends, a unix socket with its peer, a file with the
//! same open file in other processes, and the template's set-up treats it
//! as any other (a pipe end becomes an `O_PATH`, ...). The queue's
//! [`SocketBuffer::passed`] says which message carried which of those
//! numbers. The original process is not touched: its descriptor table,
//! and the queue, are as they were.
//!
//! **Restore.** The restored process gets those numbers too, made by their
//! kinds; once its descriptors are all made, the daemon takes a copy of
//! each and closes it there ([`lift`]). The queue's messages that carry
//! descriptors are not put back with the others: once every process is
//! back, the daemon sends the whole queue again from its copy of the
//! peer, each message with its files ([`send_again`]); a socket pair's
//! shutdowns wait for that.
//!
//! A stream's queue comes back as pieces that each end with the bytes
//! sent with descriptors (`unix::socket_messages`): bytes sent before
//! them, without descriptors, are in their piece, and a receiver that
//! reads less than that piece gets the descriptors with its first read.
//!
//! Refused: a file in flight of a kind not listed in [`refusal`]; files
//! in flight on a socket that is itself in flight; a process whose
//! template would come from a standby (the checkpoint forks it instead:
//! `checkpoint::track_for`). A process with files in flight cannot move to
//! a new tree: such a checkpoint is a snapshot.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use sandtree_sys::mountinfo::MountEntry;

use super::hand_over::{Handed, Key, give};
use crate::fdstate::dup_from;
use crate::inject::Tracee;
use crate::model::{FdImage, FdKind, ProcessImage, SocketBuffer};
use crate::template::CheckpointTemplates;
use crate::{Error, Result, SandboxPid};

/// A queue peeked in pass 1, with the files in flight with its messages
/// (by message index), held by the daemon until [`give_to_template`].
pub(crate) type PeekedQueue = (SocketBuffer, Vec<(usize, Vec<OwnedFd>)>);

/// Files in flight with datagrams queued on unconnected unix datagram
/// sockets (`unix_datagrams::capture`): (index of the socket's descriptor
/// among the process's, index of the datagram, the files).
pub(crate) type DatagramFiles = Vec<(usize, usize, Vec<OwnedFd>)>;

/// Whether any of `queues` carries files in flight.
pub(crate) fn any(queues: &[PeekedQueue]) -> bool {
    queues.iter().any(|(_, passed)| !passed.is_empty())
}

/// Pass 1: the files in flight on the unix sockets of process `pid` (with
/// the messages of `queues`, peeked by `unix::capture_queue`, and with the
/// datagrams of `datagrams`; `fds` its descriptors) given to its forked
/// template `t`, on numbers that are none of `fds`', and the daemon's
/// copies closed. Returns their images (read through the template, with
/// `mounts`), marked [`FdImage::in_flight`]; each queue's `passed`, and
/// each datagram's, says which carried which.
pub(crate) fn give_to_template(
    t: &mut Tracee,
    fds: &mut [FdImage],
    (queues, datagrams): (&mut [PeekedQueue], DatagramFiles),
    mounts: &HashMap<i32, MountEntry>,
    pid: SandboxPid,
) -> Result<Vec<FdImage>> {
    let tid = t.tid;
    let files: Vec<BorrowedFd<'_>> = queues
        .iter()
        .flat_map(|(_, passed)| passed.iter().flat_map(|(_, fds)| fds.iter().map(|f| f.as_fd())))
        .chain(datagrams.iter().flat_map(|(_, _, fds)| fds.iter().map(|f| f.as_fd())))
        .collect();
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let numbers: Vec<i32> = fds.iter().map(|f| f.fd).collect();
    // (A page of its own for the hand-over's buffers: the template's
    // memory is the restored process's.)
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let area = t.call("mmap (files in flight)", libc::SYS_mmap, &[0, 4096, prot, flags, u64::MAX, 0])?;
    let given = give(t, area, &files, &numbers);
    let unmapped = t.call("munmap (files in flight)", libc::SYS_munmap, &[area, 4096]);
    let given = given?;
    unmapped?;
    drop(files);
    let mut at = given.iter().map(|&n| n as i32);
    for (buf, passed) in queues.iter_mut() {
        for (i, files) in passed.drain(..) {
            buf.passed.push((i, at.by_ref().take(files.len()).collect()));
        }
        if !buf.passed.is_empty() {
            buf.passed_in = Some(pid);
        }
    }
    for (socket, i, files) in datagrams {
        if let FdKind::Socket { unix_datagrams: Some(q), .. } = &mut fds[socket].kind
            && let Some(d) = q.datagrams.get_mut(i)
        {
            d.passed = at.by_ref().take(files.len()).collect();
        }
    }
    let wanted: Vec<i32> = given.iter().map(|&n| n as i32).collect();
    let mut images: Vec<FdImage> = crate::procfs::fds(tid, mounts)
        .map_err(|e| Error::Proc { pid: tid, what: "files in flight", source: e })?
        .into_iter()
        .filter(|f| wanted.contains(&f.fd))
        .collect();
    if images.len() != wanted.len() {
        let source = io::Error::other(format!("{} given, {} found", wanted.len(), images.len()));
        return Err(Error::Proc { pid: tid, what: "files in flight given to a template", source });
    }
    for f in images.iter_mut() {
        f.in_flight = true;
    }
    Ok(images)
}

/// Pass 2: why file in flight `f` cannot be restored, if it cannot (the
/// kinds that are: pipe ends, files of the tree and of the kept mounts
/// but terminals, sockets, memfds, eventfds, timerfds, epolls).
pub(crate) fn refusal(f: &FdImage) -> Option<String> {
    let what = match &f.kind {
        FdKind::Pipe { .. } | FdKind::LayerFile { .. } | FdKind::Socket { .. } => return None,
        // (Kept by the template, its contents put back: `process::shared_memory`.)
        FdKind::Memfd { hugetlb: false, .. } => return None,
        k @ FdKind::KeptFile { path, .. } if k.terminal().is_none() && !path.starts_with("/dev/pts/") => return None,
        // (An epoll's watches are added again by number in the process
        // that receives it: refused where a number names another file
        // there, `epoll.rs`.)
        FdKind::AnonInode { what, .. } if ["eventfd", "timerfd", "eventpoll"].contains(&what.as_str()) => return None,
        FdKind::KeptFile { path, .. } => format!("terminal {path}"),
        FdKind::AnonInode { what, .. } => format!("an {what}"),
        FdKind::Deleted { path, .. } => format!("deleted file {path}"),
        FdKind::Memfd { .. } => "a memfd on huge pages".into(),
        FdKind::ShmFile { path, .. } => format!("shared memory file {path}"),
        FdKind::PtyMaster { .. } => "a pty master".into(),
        FdKind::Fifo { path, .. } => format!("FIFO {path}"),
        FdKind::OtherMount { path } => format!("file {path}"),
    };
    Some(format!(
        "{what} is in flight on a unix socket (sent with SCM_RIGHTS, not received yet): of the files in flight, only pipes, files, sockets, memfds, eventfds, timerfds and epolls are captured; checkpoint once it is received"
    ))
}

/// At the restore of `image`'s process `p`, once its descriptors are all
/// made: each file in flight handed to the daemon (`handed.in_flight`),
/// then closed in `p`.
pub(crate) fn lift(p: &mut Tracee, image: &ProcessImage, handed: &mut Handed) -> Result<()> {
    let pid = p.tid;
    for f in image.fds.iter().filter(|f| f.in_flight) {
        let copy = super::hand_over::take_copy(pid, f.fd).map_err(|e| Error::Proc {
            pid,
            what: "a copy of a file in flight",
            source: e,
        })?;
        handed.in_flight.insert((image.pid, f.fd), copy);
        p.call("close (a file in flight)", libc::SYS_close, &[f.fd as u64])?;
    }
    Ok(())
}

/// Whether a queue's messages go back at the end of the restore
/// ([`send_again`]) rather than with the others.
pub(crate) fn sent_last(buf: &SocketBuffer) -> bool {
    !buf.passed.is_empty()
}

/// Once every process is back: the queues with files in flight, sent
/// again whole by the daemon from a copy of each one's peer, each message
/// with its files (handed over by [`lift`]); then the shutdowns of the
/// socket pairs they are on. A queue kept by a template (`set.sockets`)
/// is sent from the template's peer; one of a pair or connection made
/// anew, from the daemon's copy of the new peer (`handed.ends`), and the
/// pair's other queue with it.
/// (`restored`: a restored process, named in an error.)
pub(crate) fn send_again(set: &CheckpointTemplates, handed: &Handed, restored: crate::HostPid) -> Result<()> {
    let failed = |e: io::Error| Error::Proc { pid: restored, what: "files in flight sent again", source: e };
    for (buf, host, fd) in set.sockets.iter().filter(|(b, ..)| sent_last(b)) {
        let from = dup_from(*host, *fd).map_err(failed)?;
        send_queue(&from, buf, handed).map_err(failed)?;
    }
    let mut done: Vec<u64> = Vec::new();
    for buf in set.pair_data.iter().filter(|b| sent_last(b)) {
        if done.contains(&buf.ino) {
            continue;
        }
        for (ino, peer) in [(buf.ino, buf.peer), (buf.peer, buf.ino)] {
            done.push(ino);
            let Some(queued) = handed.pair_queued.get(&ino) else { continue };
            let from = handed
                .ends
                .get(&Key::Socket(peer))
                .ok_or_else(|| failed(io::Error::other(format!("the peer of unix socket {ino} was not made again"))))?;
            send_queue(from, queued, handed).map_err(failed)?;
        }
        for ino in [buf.ino, buf.peer] {
            if let (Some(sock), Some(st)) = (handed.ends.get(&Key::Socket(ino)), handed.pair_states.get(&ino)) {
                super::unix::shut_down(sock, st).map_err(failed)?;
            }
        }
    }
    Ok(())
}

/// `buf`'s messages sent from `from`, each with its files in flight.
fn send_queue(from: &OwnedFd, buf: &SocketBuffer, handed: &Handed) -> io::Result<()> {
    let holder = buf.passed_in.unwrap_or(SandboxPid::INIT);
    let messages = buf.messages.iter().enumerate().map(|(i, m)| {
        let numbers = buf.passed.iter().find(|(j, _)| *j == i).map(|(_, n)| &n[..]).unwrap_or_default();
        Ok((&m[..], files_of(handed, holder, numbers)?))
    });
    super::unix::send_each(from, messages, buf.stream)
}

/// The daemon's copies of the files in flight `numbers` of process `pid`
/// ([`lift`]).
pub(crate) fn files_of<'a>(handed: &'a Handed, pid: SandboxPid, numbers: &[i32]) -> io::Result<Vec<BorrowedFd<'a>>> {
    numbers
        .iter()
        .map(|&n| {
            handed
                .in_flight
                .get(&(pid, n))
                .map(|f| f.as_fd())
                .ok_or_else(|| io::Error::other(format!("file in flight {n} of process {pid} was not made")))
        })
        .collect()
}
