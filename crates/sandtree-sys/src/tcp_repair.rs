//! TCP repair mode (`TCP_REPAIR`): the state of an established connection
//! that the kernel otherwise keeps to itself, read from a live socket and
//! set on a new one, which then carries on the connection without a
//! handshake.
//!
//! Repair mode needs `CAP_NET_ADMIN` over the socket's network namespace
//! (the daemon has it over every sandbox's), and a socket that is closed
//! or established. In it:
//! - [`select_queue`] picks the receive or the send queue; [`queue_seq`]
//!   is then `rcv_nxt` (the next byte expected) or `write_seq` (the next
//!   byte the process would write), and can be set on a closed socket;
//!   a `MSG_PEEK` receive ([`peek`]) reads that queue without taking it:
//!   the send queue holds the bytes not acknowledged yet (sent or not);
//!   a send ([`fill`]) appends to it, as received or as sent (nothing goes
//!   on the wire: the peer has them already, or gets them again);
//! - `bind` takes an address in use (the socket may reuse it by force) and
//!   `connect` makes the socket established at once ([`bind_raw`],
//!   [`connect_raw`]);
//! - [`set_options`] sets what the handshake would have agreed (MSS,
//!   window scale, SACK, timestamps), [`set_window`] the windows,
//!   [`set_timestamp`] the timestamp clock's offset.
//!
//! Leaving it ([`leave`]) with [`Leave::Probe`] sends a window probe
//! (the peer answers with its acknowledgement: what it has is no longer
//! sent again); [`Leave::Quiet`] sends nothing. Either way the socket's
//! `SO_REUSEADDR` is cleared (the kernel sets "no reuse"): a caller puts it
//! back.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use crate::sockopt::{get_raw, set_raw};

const TCP_REPAIR: i32 = 19;
const TCP_REPAIR_QUEUE: i32 = 20;
const TCP_QUEUE_SEQ: i32 = 21;
const TCP_REPAIR_OPTIONS: i32 = 22;
const TCP_TIMESTAMP: i32 = 24;
const TCP_REPAIR_WINDOW: i32 = 29;
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

/// `TCP_REPAIR_OPTIONS` codes (`TCPOPT_*`).
pub const OPT_MSS: u32 = 2;
/// Window scale: the send shift in the low 16 bits, the receive shift in
/// the high ones.
pub const OPT_WINDOW: u32 = 3;
/// SACK permitted.
pub const OPT_SACK_PERM: u32 = 4;
/// Timestamps.
pub const OPT_TIMESTAMP: u32 = 8;

/// `tcpi_options` bits of [`Info::options`].
pub const INFO_TIMESTAMPS: u8 = 1;
/// SACK was agreed.
pub const INFO_SACK: u8 = 2;
/// Window scaling was agreed.
pub const INFO_WSCALE: u8 = 4;

/// `tcpi_state` of an established connection.
pub const ESTABLISHED: u8 = 1;
/// `tcpi_state` of a listener.
pub const LISTEN: u8 = 10;

/// The size of `struct tcp_repair_window`.
pub const WINDOW_SIZE: usize = 20;

/// A queue of a connection in repair mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// Neither (sends and receives are refused).
    None = 0,
    /// The receive queue.
    Receive = 1,
    /// The send queue.
    Send = 2,
}

/// How a socket leaves repair mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// With a window probe (`TCP_REPAIR_OFF`).
    Probe = 0,
    /// Sending nothing (`TCP_REPAIR_OFF_NO_WP`).
    Quiet = -1,
}

fn set_int(fd: impl AsFd, name: i32, v: i32) -> io::Result<()> {
    set_raw(fd, libc::IPPROTO_TCP, name, &v.to_ne_bytes())
}

fn get_u32(fd: impl AsFd, name: i32) -> io::Result<u32> {
    let v = get_raw(fd, libc::IPPROTO_TCP, name, 4)?;
    Ok(u32::from_ne_bytes(v.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(|| io::Error::other("short option"))?))
}

/// Put socket `fd` in repair mode.
pub fn enter(fd: impl AsFd) -> io::Result<()> {
    set_int(fd, TCP_REPAIR, 1)
}

/// Take socket `fd` out of repair mode.
pub fn leave(fd: impl AsFd, how: Leave) -> io::Result<()> {
    set_int(fd, TCP_REPAIR, how as i32)
}

/// Pick the queue that [`queue_seq`], [`peek`] and [`fill`] work on.
pub fn select_queue(fd: impl AsFd, q: Queue) -> io::Result<()> {
    set_int(fd, TCP_REPAIR_QUEUE, q as i32)
}

/// The selected queue's sequence number (`rcv_nxt` or `write_seq`).
pub fn queue_seq(fd: impl AsFd) -> io::Result<u32> {
    get_u32(fd, TCP_QUEUE_SEQ)
}

/// Set the selected queue's sequence number (a closed socket).
pub fn set_queue_seq(fd: impl AsFd, seq: u32) -> io::Result<()> {
    set_raw(fd, libc::IPPROTO_TCP, TCP_QUEUE_SEQ, &seq.to_ne_bytes())
}

/// The first `len` bytes of the selected queue, not taken.
pub fn peek(fd: impl AsFd, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    let (n, _) = rustix::net::recv(&fd, &mut buf[..], flags)?;
    buf.truncate(n);
    Ok(buf)
}

/// Append `data` to the selected queue (in parts: the receive queue takes
/// a bounded amount per call).
pub fn fill(fd: impl AsFd, data: &[u8]) -> io::Result<()> {
    let mut at = 0;
    while at < data.len() {
        let end = (at + 64 * 1024).min(data.len());
        match rustix::net::send(&fd, &data[at..end], rustix::net::SendFlags::DONTWAIT) {
            Ok(0) => return Err(io::Error::other("a repair-mode send took nothing")),
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `struct tcp_repair_window`, raw ([`WINDOW_SIZE`] bytes).
pub fn window(fd: impl AsFd) -> io::Result<Vec<u8>> {
    get_raw(fd, libc::IPPROTO_TCP, TCP_REPAIR_WINDOW, WINDOW_SIZE)
}

/// Set the windows (an established socket in repair mode).
pub fn set_window(fd: impl AsFd, raw: &[u8]) -> io::Result<()> {
    set_raw(fd, libc::IPPROTO_TCP, TCP_REPAIR_WINDOW, raw)
}

/// The connection's timestamp clock (`TCP_TIMESTAMP`).
pub fn timestamp(fd: impl AsFd) -> io::Result<u32> {
    get_u32(fd, TCP_TIMESTAMP)
}

/// Set the timestamp clock's offset so that it reads `ts` now.
pub fn set_timestamp(fd: impl AsFd, ts: u32) -> io::Result<()> {
    set_raw(fd, libc::IPPROTO_TCP, TCP_TIMESTAMP, &ts.to_ne_bytes())
}

/// Set what the handshake agreed: (`OPT_*` code, value) pairs.
pub fn set_options(fd: impl AsFd, opts: &[(u32, u32)]) -> io::Result<()> {
    let raw: Vec<u8> = opts.iter().flat_map(|&(c, v)| c.to_ne_bytes().into_iter().chain(v.to_ne_bytes())).collect();
    set_raw(fd, libc::IPPROTO_TCP, TCP_REPAIR_OPTIONS, &raw)
}

/// What `TCP_INFO` tells of a socket that a checkpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    /// `tcpi_state` ([`ESTABLISHED`], [`LISTEN`], ...).
    pub state: u8,
    /// `tcpi_options` (`INFO_*`).
    pub options: u8,
    /// Send and receive window shifts.
    pub wscale: (u8, u8),
    /// A listener's connections not accepted yet (`tcpi_unacked`).
    pub unacked: u32,
}

/// [`Info`] of socket `fd`.
pub fn info(fd: impl AsFd) -> io::Result<Info> {
    let raw = get_raw(fd, libc::IPPROTO_TCP, libc::TCP_INFO, 104)?;
    if raw.len() < 28 {
        return Err(io::Error::other("short TCP_INFO"));
    }
    Ok(Info {
        state: raw[0],
        options: raw[5],
        wscale: (raw[6] & 0xf, raw[6] >> 4),
        unacked: u32::from_ne_bytes(raw[24..28].try_into().unwrap_or_default()),
    })
}

/// Bytes of the send queue not sent yet (`SIOCOUTQNSD`).
pub fn not_sent(fd: impl AsFd) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: `fd` is borrowed for the call; this ioctl writes one `int`
    // to the live local it points at.
    let r = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), SIOCOUTQNSD, &mut v as *mut libc::c_int) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(v as u32) }
}

/// Bytes of the send queue not acknowledged yet (`SIOCOUTQ`).
pub fn not_acked(fd: impl AsFd) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: as in `not_sent`: one `int` written to a live local.
    let r = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCOUTQ, &mut v as *mut libc::c_int) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(v as u32) }
}

/// `bind` socket `fd` to the raw `sockaddr_in`/`sockaddr_in6` `addr`.
pub fn bind_raw(fd: impl AsFd, addr: &[u8]) -> io::Result<()> {
    // SAFETY: `fd` is borrowed for the call; the address points at `addr`,
    // live for the call, and its length is passed (the kernel copies it
    // and checks it against the family).
    let r = unsafe { libc::bind(fd.as_fd().as_raw_fd(), addr.as_ptr().cast(), addr.len() as libc::socklen_t) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// `connect` socket `fd` to the raw `sockaddr_in`/`sockaddr_in6` `addr`.
pub fn connect_raw(fd: impl AsFd, addr: &[u8]) -> io::Result<()> {
    // SAFETY: as in `bind_raw`.
    let r = unsafe { libc::connect(fd.as_fd().as_raw_fd(), addr.as_ptr().cast(), addr.len() as libc::socklen_t) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// The raw address of socket `fd` (`getsockname`), or of its peer.
pub fn address(fd: impl AsFd, peer: bool) -> io::Result<Vec<u8>> {
    let mut buf = [0u8; 128];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `fd` is borrowed for the call; `buf` is a live buffer of
    // `len` bytes and `len` a live local the kernel sets to the address's
    // size (it writes no more than `len` bytes).
    let r = unsafe {
        match peer {
            true => libc::getpeername(fd.as_fd().as_raw_fd(), buf.as_mut_ptr().cast(), &mut len),
            false => libc::getsockname(fd.as_fd().as_raw_fd(), buf.as_mut_ptr().cast(), &mut len),
        }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(buf[..(len as usize).min(buf.len())].to_vec())
}
