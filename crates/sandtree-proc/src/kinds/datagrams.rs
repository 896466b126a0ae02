//! Datagrams queued on a socket, read without taking them: each peeked
//! (`MSG_PEEK`) with its sender's address, the queue walked with
//! `SO_PEEK_OFF` (set to 0 for the walk: each peek moves it past the
//! datagram it read; the socket's own offset is put back, so the process's
//! later peeks see what they would have). For UDP sockets (`udp.rs`) and
//! unconnected unix datagram sockets (`unix_datagrams.rs`).
//!
//! Refused (an error): a datagram with descriptors passed along where the
//! caller takes none (UDP; the peek installed copies here: dropped), one
//! larger than the caller allows, an
//! empty one (the kernel marks an empty datagram peeked, and a later peek
//! at offset 0 goes past it: a second capture would not see it), more
//! datagrams than the caller allows.

use std::io;
use std::os::fd::OwnedFd;

use rustix::io::Errno;
use rustix::net::{RecvAncillaryMessage, RecvFlags, ReturnFlags, SocketAddrAny};

/// A datagram peeked: its sender's address, its bytes, and the files in
/// flight with it (`SCM_RIGHTS`: new descriptors of the daemon, the same
/// open files, close-on-exec).
pub(crate) type PeekedDatagram = (Option<SocketAddrAny>, Vec<u8>, Vec<OwnedFd>);

/// Every datagram queued on `sock`, oldest first, with its sender's
/// address: `largest` bytes each at most, `most` of them; with the files
/// in flight with them if `files` (else those are an error).
pub(crate) fn peek_all(sock: &OwnedFd, largest: usize, most: usize, files: bool) -> io::Result<Vec<PeekedDatagram>> {
    let saved = sandtree_sys::sockopt::peek_offset(sock)?;
    sandtree_sys::sockopt::set_peek_offset(sock, 0)?;
    let walked = walk(sock, (largest, most), files);
    put_back_peek_offset(sock, saved)?;
    walked
}

/// Peek every datagram of `sock`'s queue (its peek offset at 0).
fn walk(sock: &OwnedFd, (largest, most): (usize, usize), files: bool) -> io::Result<Vec<PeekedDatagram>> {
    // (One byte more than the largest allowed: a larger one shows.)
    let mut buf = vec![0u8; largest + 1];
    let mut out = Vec::new();
    let flags = RecvFlags::PEEK | RecvFlags::DONTWAIT | RecvFlags::TRUNC | RecvFlags::CMSG_CLOEXEC;
    loop {
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(253))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        match rustix::net::recvmsg(sock, &mut [io::IoSliceMut::new(&mut buf)], &mut control, flags) {
            Ok(m) => {
                let mut passed = Vec::new();
                for c in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(fds) = c {
                        passed.extend(fds);
                    }
                }
                if !passed.is_empty() && !files {
                    return Err(io::Error::other("descriptors are in flight with them"));
                }
                if m.flags.contains(ReturnFlags::CTRUNC) {
                    return Err(io::Error::other("more descriptors in flight with a datagram than it can carry"));
                }
                if m.flags.contains(ReturnFlags::TRUNC) || m.bytes > largest {
                    return Err(io::Error::other(format!("a datagram larger than {largest} bytes")));
                }
                if m.bytes == 0 {
                    return Err(io::Error::other("an empty datagram is queued (a peek cannot capture it twice)"));
                }
                out.push((m.address, buf[..m.bytes].to_vec(), passed));
                if out.len() > most {
                    return Err(io::Error::other(format!("more than {most} datagrams are queued")));
                }
            }
            Err(Errno::AGAIN) => return Ok(out),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Set `sock`'s peek offset back to `saved` (a try interrupted by a signal
/// is tried again: the process's later peeks depend on it).
fn put_back_peek_offset(sock: &OwnedFd, saved: i32) -> io::Result<()> {
    let mut tries = 0;
    loop {
        match sandtree_sys::sockopt::set_peek_offset(sock, saved) {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) && tries < 100 => tries += 1,
            r => return r,
        }
    }
}
