//! Datagrams queued on an unconnected unix datagram socket bound to a path
//! (`model::UnixDatagrams`): sent to it by any socket that names its path
//! (`sendto`), each with its sender's address. A restore binds the socket
//! anew (`unix.rs`), so its queue goes with the old one: captured at the
//! checkpoint, the datagrams are sent to the new socket again, each from
//! its sender.
//!
//! - **Capture** (pass 1, every process stopped): through a `pidfd_getfd`
//!   copy, each datagram is peeked with its sender's address, walking the
//!   queue with `SO_PEEK_OFF` (set to 0 for the walk, put back after:
//!   `datagrams.rs`).
//! - **Check** (pass 2): a sender bound to a path must be a socket a
//!   captured process holds and the restore binds anew (a datagram socket
//!   not connected): its new socket sends the datagram again, so the
//!   receiver reads that path as its sender again.
//! - **Restore**, once every process is back: each datagram is sent to the
//!   socket's path in the rolled-back tree (reached through an `O_PATH` of
//!   its socket file, `/proc/self/fd/<n>`: no length limit) from its
//!   sender's new socket (the daemon's copy, `hand_over`), or, from an
//!   unbound sender, from an unbound socket of the daemon; with the files
//!   in flight with it (`SCM_RIGHTS`: given to the template in pass 1 and
//!   made by the restore like descriptors, `in_flight.rs`).
//!
//! Refused: a socket a captured datagram socket is connected to (kept by
//! the template, not bound again), a datagram with files in flight of a
//! kind `in_flight.rs` refuses, one from an abstract
//! address or from a sender no captured process holds (or that is
//! connected: it is not made anew), an empty one (a peek marks it peeked),
//! a receiver with `SO_PASSCRED` (the datagrams would carry the daemon's
//! credentials). Not kept: the credentials of the senders
//! (`SO_PEERCRED`-like data a receiver without `SO_PASSCRED` never sees).

use std::io;
use std::os::fd::OwnedFd;

use rustix::net::SocketAddrUnix;

use super::hand_over::{Handed, Key};
use crate::fdstate::dup_from;
use crate::model::{FdImage, FdKind, ProcessImage, UnixDatagram, UnixDatagrams};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// The most datagrams captured from one socket.
const MOST: usize = 4096;

/// Pass 1: the datagrams queued on the unconnected unix datagram sockets
/// bound to a path among `fds` of stopped process `host` (into their
/// `unix_datagrams`). Returns the files in flight with them, by
/// (index in `fds`, index of the datagram), for `kinds/in_flight.rs` to
/// give to the template.
pub(crate) fn capture(host: HostPid, fds: &mut [FdImage]) -> Vec<(usize, usize, Vec<OwnedFd>)> {
    let mut in_flight = Vec::new();
    for (at, f) in fds.iter_mut().enumerate().filter(|(_, f)| f.same_as.is_none()) {
        let FdKind::Socket {
            family,
            stream: false,
            connected: false,
            listening: false,
            queued: true,
            bound: Some(bound),
            unix_datagrams,
            ..
        } = &mut f.kind
        else {
            continue;
        };
        // (One bound in the abstract namespace is kept: its datagrams are
        // not captured yet.)
        if family != "unix" || bound.starts_with('@') {
            continue;
        }
        let q = match dup_from(host, f.fd).and_then(|sock| capture_one(&sock)) {
            Ok(peeked) => {
                let mut datagrams = Vec::with_capacity(peeked.len());
                for (i, (d, files)) in peeked.into_iter().enumerate() {
                    datagrams.push(d);
                    if !files.is_empty() {
                        in_flight.push((at, i, files));
                    }
                }
                UnixDatagrams { datagrams, refused: None }
            }
            Err(e) => UnixDatagrams {
                datagrams: Vec::new(),
                refused: Some(format!("a unix datagram socket whose queued datagrams cannot be captured: {e}")),
            },
        };
        *unix_datagrams = Some(Box::new(q));
    }
    in_flight
}

/// The datagrams queued on socket `sock` (see the module docs), each with
/// the files in flight with it.
fn capture_one(sock: &OwnedFd) -> io::Result<Vec<(UnixDatagram, Vec<OwnedFd>)>> {
    if rustix::net::sockopt::socket_passcred(sock)? {
        return Err(io::Error::other("its receiver takes its senders' credentials (SO_PASSCRED)"));
    }
    let peeked = super::datagrams::peek_all(sock, 256 * 1024, MOST, true)?;
    peeked
        .into_iter()
        .map(|(from, bytes, files)| Ok((UnixDatagram { from: sender(from)?, bytes, passed: Vec::new() }, files)))
        .collect()
}

/// A datagram's sender: its bound path, or `None` for an unbound one.
fn sender(a: Option<rustix::net::SocketAddrAny>) -> io::Result<Option<String>> {
    let Some(a) = a else { return Ok(None) };
    let a = SocketAddrUnix::try_from(a).map_err(|_| io::Error::other("a sender of another family"))?;
    if let Some(path) = a.path_bytes().filter(|p| !p.is_empty()) {
        return Ok(Some(String::from_utf8_lossy(path).into_owned()));
    }
    if a.abstract_name().is_some() {
        return Err(io::Error::other("a datagram from an abstract address (not sent again yet)"));
    }
    Ok(None)
}

/// Pass 2: why `f`'s datagrams could not be captured, if so.
pub(crate) fn refusal(f: &FdImage) -> Option<String> {
    match &f.kind {
        FdKind::Socket { unix_datagrams: Some(q), .. } => q.refused.clone(),
        _ => None,
    }
}

/// The inode of the socket bound to `path` that a restore binds anew (a
/// datagram socket not connected), among `images`.
fn sender_socket<'a>(images: impl IntoIterator<Item = &'a ProcessImage>, path: &str) -> Option<u64> {
    images.into_iter().flat_map(|i| &i.fds).find_map(|f| match &f.kind {
        k @ FdKind::Socket { ino, family, stream: false, connected: false, bound: Some(b), .. }
            if family == "unix" && b == path && k.recreated() =>
        {
            Some(*ino)
        }
        _ => None,
    })
}

/// Pass 2, over every process: the first of `images` holding a datagram
/// whose sender a restore cannot send it from again, or a socket with
/// datagrams that a captured socket is connected to (it stays the
/// template's, not bound again: `has_clients`), as (index, resource,
/// reason).
pub(crate) fn sender_refusal(images: &[&ProcessImage]) -> Option<(usize, String, String)> {
    let connected_to = |path: &str| {
        images
            .iter()
            .flat_map(|i| &i.fds)
            .any(|f| matches!(&f.kind, FdKind::Socket { peer_path: Some(p), .. } if p == path))
    };
    for (i, image) in images.iter().enumerate() {
        for f in &image.fds {
            let FdKind::Socket { bound, unix_datagrams: Some(q), .. } = &f.kind else { continue };
            if let Some(path) = bound.as_deref().filter(|p| !q.datagrams.is_empty() && connected_to(p)) {
                let why = format!(
                    "a unix datagram socket bound to {path} with datagrams queued, which a captured socket is connected to (it is kept, not bound again: its datagrams could not be sent to it again)"
                );
                return Some((i, format!("fd {}", f.fd), why));
            }
            for path in q.datagrams.iter().filter_map(|d| d.from.as_deref()) {
                if sender_socket(images.iter().copied(), path).is_none() {
                    let why = format!(
                        "a unix datagram from {path} is queued, whose socket no captured process holds (or it is connected): it could not be sent again from there"
                    );
                    return Some((i, format!("fd {}", f.fd), why));
                }
            }
        }
    }
    None
}

/// At a restore, once every process is back: each socket's datagrams of
/// the checkpoint, sent to its new socket again from their senders (their
/// new sockets, the daemon's copies in `handed`). `restored` is a restored
/// process (host pid), through whose root the paths are found.
pub(crate) fn send_again(set: &CheckpointTemplates, handed: &Handed, restored: HostPid) -> Result<()> {
    let images: Vec<&ProcessImage> = set.templates.iter().map(|t| &t.image).collect();
    let mut unbound: Option<OwnedFd> = None;
    let mut sent_to = std::collections::HashSet::new();
    for image in &images {
        for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
            let FdKind::Socket { ino, bound: Some(bound), bound_from, unix_datagrams: Some(q), .. } = &f.kind else {
                continue;
            };
            if q.datagrams.is_empty() || !sent_to.insert(*ino) {
                continue;
            }
            let sent = (|| -> io::Result<()> {
                // The socket file in the rolled-back tree, through an O_PATH.
                let path = bound_from.as_deref().unwrap_or(bound);
                let file = crate::fdstate::open_in(
                    &crate::fdstate::tree_root(restored)?,
                    path,
                    rustix::fs::OFlags::PATH | rustix::fs::OFlags::NOFOLLOW,
                )?;
                let to = SocketAddrUnix::new(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)))?;
                for d in &q.datagrams {
                    let from = match &d.from {
                        Some(p) => {
                            let ino = sender_socket(images.iter().copied(), p)
                                .ok_or_else(|| io::Error::other(format!("no socket bound to {p}")))?;
                            handed
                                .ends
                                .get(&Key::Socket(ino))
                                .ok_or_else(|| io::Error::other(format!("the socket bound to {p} was not made anew")))?
                        }
                        None => match &mut unbound {
                            Some(s) => &*s,
                            empty => &*empty.insert(rustix::net::socket(
                                rustix::net::AddressFamily::UNIX,
                                rustix::net::SocketType::DGRAM,
                                None,
                            )?),
                        },
                    };
                    let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
                    // (With its files in flight, which the restore of this
                    // process handed to the daemon: `in_flight::lift`.)
                    let files = super::in_flight::files_of(handed, image.pid, &d.passed)?;
                    let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(253))];
                    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
                    if !files.is_empty() {
                        control.push(rustix::net::SendAncillaryMessage::ScmRights(&files));
                    }
                    let n = rustix::net::sendmsg_addr(from, &to, &[io::IoSlice::new(&d.bytes)], &mut control, flags)?;
                    if n != d.bytes.len() {
                        return Err(io::Error::other("a datagram was cut"));
                    }
                }
                Ok(())
            })();
            sent.map_err(|e| Error::Proc { pid: restored, what: "unix datagrams, sent again", source: e })?;
        }
    }
    Ok(())
}
