//! Pipes (`FdKind::Pipe`), and the buffered bytes of pipes and FIFOs.
//!
//! A template holds no end of a pipe: a pipe's readers see the end of file
//! once its running writers closed theirs, and its writers `EPIPE` once
//! its running readers did, checkpoint or not. At its set-up the template
//! turns each pipe end into an `O_PATH` descriptor of the pipe's inode, on
//! the same number (`template.rs`): it names the inode without opening it.
//! Opening `/proc/self/fd/<n>` through it opens that pipe inode again (the
//! kernel's `fifo_open`, which never waits for a peer on a pipe): the same
//! pipe while any end of it is open, else a new empty one on the same
//! inode (same inode number, owner and mode).
//!
//! The buffered bytes are read in pass 1 (originals stopped) through
//! `/proc/<pid>/fd/<n>`, `tee`d into a pipe of the daemon's (a copy that
//! consumes nothing), once per pipe (by device and inode: a pipe's and a
//! FIFO's inode numbers come from different file systems). Pass 1 also
//! asks whether the pipe has readers and writers at all (`poll` of an end
//! of the daemon's: `POLLHUP` on a reader, no writer; `POLLERR` on a
//! writer, no reader): a pipe with an end outside the captured processes
//! (the daemon's end of a background process's output) is left as it is
//! at the restore ([`crate::model::PipeBuffer::outside`]).
//!
//! At the restore, before any process is cloned, the daemon opens each
//! pipe again through a template's `O_PATH` descriptor (read-write: a
//! *keeper*), drains it (the killed originals may not have closed their
//! ends yet: then it is still the old pipe) and fills it with the
//! checkpoint's bytes at the checkpoint's capacity. Each restored process
//! opens its ends again through its own `O_PATH` descriptors, with their
//! access mode and flags (batched, [`Kind::reopen`]); dups of an end in one
//! process are dups again. An end its user may not open (the pipe made by
//! root, before the process changed users: `subprocess.Popen(user=...)`)
//! is opened by the daemon instead and handed over
//! ([`crate::model::FdImage::daemon_opens`]). The keepers close once every process is back,
//! before any runs. A FIFO on a layer is reached through its own keeper
//! (`fifo.rs`).
//!
//! Not kept: one open end shared by two processes (a fork's) is one open
//! file per process after the restore: a flag one of them sets later (`O_NONBLOCK`)
//! no longer shows in the other.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;
use rustix::io::Errno;

use super::Kind;
use crate::batch::{Arg, Batch};
use crate::fdstate::{Seen, open_proc_fd};
use crate::model::{FdImage, FdKind, PipeBuffer};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// Pipes.
pub(crate) struct Pipe;

impl Kind for Pipe {
    fn reopen(&self, f: &FdImage, b: &mut Batch, _handed: &super::Handed) -> bool {
        if !f.kind.held_as_o_path() || f.daemon_opens {
            return false;
        }
        reopen_through_o_path(f, b);
        true
    }

    /// An end its user may not open: opened by the daemon through the
    /// template's `O_PATH`, handed over.
    fn remake(&self, f: &FdImage, cx: &mut super::Remake<'_>) -> Result<()> {
        // (A dup is made a dup again, after.)
        if !f.daemon_opens || f.same_as.is_some() {
            return Ok(());
        }
        let key = super::hand_over::Key::Opened(cx.template.raw(), f.fd);
        let access = f.flags & libc::O_ACCMODE as u32;
        // (Opened non-blocking: its own status flags set after.)
        let status = f.flags & (libc::O_NONBLOCK | libc::O_DIRECT) as u32;
        let end = open_proc_fd(cx.template, f.fd, OFlags::from_bits_retain(access))
            .and_then(|end| {
                rustix::fs::fcntl_setfl(&end, OFlags::from_bits_retain(status))?;
                Ok(end)
            })
            .map_err(|e| Error::Proc {
                pid: cx.template,
                what: "a pipe end, opened for a restored process",
                source: e,
            })?;
        cx.handed.ends.insert(key, end);
        cx.wanted.push((key, f.fd, f.flags));
        Ok(())
    }
}

/// Opens end `f` of a pipe (or of a FIFO on a kept mount) again through
/// the `O_PATH` on its number, onto that number, with its flags. (The
/// keeper holds both ends: a FIFO's open does not wait for a peer.)
pub(crate) fn reopen_through_o_path(f: &FdImage, b: &mut Batch) {
    // (`O_DIRECT`, a packet-mode pipe's, is refused by `open` and taken
    // by `F_SETFL`.)
    let open_flags = libc::O_ACCMODE | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let path = b.path(&format!("/proc/self/fd/{}", f.fd));
    let args = [path, Arg::Val((f.flags & open_flags as u32) as u64), Arg::Val(0)];
    let fd = b.call("open (pipe end, through its O_PATH)", libc::SYS_open, &args);
    if f.flags & libc::O_DIRECT as u32 != 0 {
        b.call("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, Arg::Val(libc::F_SETFL as u64), Arg::Val(f.flags as u64)]);
    }
    b.move_fd(fd, f.fd, f.flags);
}

/// A pipe or FIFO descriptor and its pipe's key: (descriptor, (device,
/// inode)).
pub(crate) type PipeKey = (i32, (u64, u64));

/// Pass 1 for stopped process `host`: the bytes of each pipe and FIFO among
/// `fds` not `seen` yet, and the key (device, inode) of each pipe and
/// FIFO descriptor.
pub(crate) fn capture(host: HostPid, fds: &[FdImage], seen: &mut Seen) -> Result<(Vec<PipeBuffer>, Vec<PipeKey>)> {
    let mut pipes = Vec::new();
    let mut keys = Vec::new();
    for f in fds {
        if !matches!(f.kind, FdKind::Pipe { .. } | FdKind::Fifo { .. }) {
            continue;
        }
        let k = key(host, f.fd).map_err(|e| Error::Proc { pid: host, what: "pipe inode", source: e })?;
        // (A dup's number is not the template's: it closed it.)
        if f.same_as.is_none() {
            keys.push((f.fd, k));
        }
        if seen.first_pipe(k) {
            let anonymous = matches!(f.kind, FdKind::Pipe { .. });
            let read = || -> io::Result<_> {
                let (buffered, writers) = read_buffered(host, f.fd)?;
                let readers = anonymous && has_readers(host, f.fd)?;
                Ok((buffered, (readers, writers && anonymous)))
            };
            let (b, ends) = read().map_err(|e| Error::Proc { pid: host, what: "pipe contents", source: e })?;
            let (bytes, size, packets) = (b.bytes, b.size, b.packets);
            pipes.push(PipeBuffer { dev: k.0, ino: k.1, bytes, size, outside: false, packets, ends });
        }
    }
    Ok((pipes, keys))
}

/// At a restore: each pipe of `set` holds its checkpoint's bytes again,
/// put in through a keeper (an anonymous pipe's, opened again through a
/// template's `O_PATH` descriptor, returned: open until every process is
/// back), a layer FIFO's keeper (`fifo_keepers`), or the template that
/// holds a kept FIFO. A pipe with an end outside is left as it is, and
/// needs no keeper: it lives on through that end (the daemon's output
/// pipes: opened again by the daemon before the kill, see
/// `sandtree_sandbox`'s `Sandbox::revive_background`).
pub(crate) fn put_back(set: &CheckpointTemplates, fifo_keepers: &HashMap<String, OwnedFd>) -> Result<Vec<OwnedFd>> {
    let mut keepers = Vec::new();
    for (pipe, host, fd) in &set.pipes {
        let kind = set.templates.iter().filter(|t| t.host == *host).flat_map(|t| &t.image.fds).find(|f| f.fd == *fd);
        let filled = match kind.map(|f| &f.kind) {
            // (One with an end outside lives on through that end.)
            Some(FdKind::Pipe { .. }) if pipe.outside => Ok(()),
            Some(k) if k.held_as_o_path() => open_proc_fd(*host, *fd, OFlags::RDWR).and_then(|keeper| {
                let stream: &[u8] = if pipe.packets.is_empty() { &pipe.bytes } else { &[] };
                super::fifo::fill(&keeper, stream, pipe.size)?;
                write_packets(&keeper, pipe)?;
                keepers.push(keeper);
                Ok(())
            }),
            Some(FdKind::Fifo { path, on_layer: true, .. }) => match fifo_keepers.get(path) {
                Some(keeper) => super::fifo::fill(keeper, &pipe.bytes, pipe.size),
                None => Ok(()),
            },
            _ => refill(*host, *fd, &pipe.bytes),
        };
        filled.map_err(|e| Error::Proc { pid: *host, what: "pipe contents", source: e })?;
    }
    Ok(keepers)
}

/// What a pipe holds.
struct Buffered {
    bytes: Vec<u8>,
    /// Its capacity.
    size: usize,
    /// The messages' lengths, if written in packet mode (see
    /// [`PipeBuffer::packets`]).
    packets: Vec<u32>,
}

/// The bytes buffered in the pipe that `fd` of process `host` refers to,
/// without consuming them, and whether it has a writer (a reader of ours
/// sees `POLLHUP` on an anonymous pipe without). A read of the copy stops
/// at the end of a message written in packet mode (the `tee`d buffers keep
/// their flag): more than one read for all of it tells the messages apart.
fn read_buffered(host: HostPid, fd: i32) -> io::Result<(Buffered, bool)> {
    let src = open_proc_fd(host, fd, OFlags::RDONLY)?;
    let size = rustix::pipe::fcntl_getpipe_size(&src)?;
    let writers = !polled(&src, rustix::event::PollFlags::HUP)?;
    let (copy_r, copy_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
    rustix::pipe::fcntl_setpipe_size(&copy_w, size)?;
    let n = match rustix::pipe::tee(&src, &copy_w, size, rustix::pipe::SpliceFlags::NONBLOCK) {
        Ok(n) => n,
        Err(Errno::AGAIN) => 0,
        Err(e) => return Err(e.into()),
    };
    let mut out = vec![0u8; n];
    let mut got = 0;
    let mut packets = Vec::new();
    while got < n {
        match rustix::io::read(&copy_r, &mut out[got..]) {
            Ok(0) => break,
            Ok(k) => {
                got += k;
                packets.push(k as u32);
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    out.truncate(got);
    if packets.len() < 2 {
        packets.clear();
    }
    Ok((Buffered { bytes: out, size, packets }, writers))
}

/// Whether the anonymous pipe behind `fd` of `host` has a reader: a writer
/// of ours sees `POLLERR` without. (Asked once the daemon's reader of
/// [`read_buffered`] is closed.)
fn has_readers(host: HostPid, fd: i32) -> io::Result<bool> {
    let w = open_proc_fd(host, fd, OFlags::WRONLY)?;
    Ok(!polled(&w, rustix::event::PollFlags::ERR)?)
}

/// Whether `poll` of `fd` reports `what` now.
fn polled(fd: &OwnedFd, what: rustix::event::PollFlags) -> io::Result<bool> {
    let mut p = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::empty())];
    rustix::event::poll(&mut p, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 }))?;
    Ok(p[0].revents().contains(what))
}

/// Write `pipe`'s messages through `keeper` (emptied by a fill without
/// them), each in packet mode, when it held them so.
fn write_packets(keeper: &OwnedFd, pipe: &PipeBuffer) -> io::Result<()> {
    if pipe.packets.is_empty() {
        return Ok(());
    }
    let flags = rustix::fs::fcntl_getfl(keeper)?;
    rustix::fs::fcntl_setfl(keeper, flags | OFlags::DIRECT)?;
    let mut at = 0;
    for &len in &pipe.packets {
        let m = &pipe.bytes[at..at + len as usize];
        if rustix::io::write(keeper, m)? != m.len() {
            return Err(io::Error::other("a pipe message was cut"));
        }
        at += len as usize;
    }
    rustix::fs::fcntl_setfl(keeper, flags)?;
    Ok(())
}

/// Make the pipe behind `fd` of `host` hold exactly `bytes`.
fn refill(host: HostPid, fd: i32, bytes: &[u8]) -> io::Result<()> {
    let rd = open_proc_fd(host, fd, OFlags::RDONLY)?;
    drain(&rd)?;
    if bytes.is_empty() {
        return Ok(());
    }
    // `rd` stays open: a FIFO refuses a non-blocking writer without a reader.
    let mut wr = std::fs::File::from(open_proc_fd(host, fd, OFlags::WRONLY)?);
    wr.write_all(bytes)
}

/// Read and drop whatever the (non-blocking) pipe `rd` holds.
pub(crate) fn drain(rd: &OwnedFd) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rustix::io::read(rd, &mut buf) {
            Ok(0) | Err(Errno::AGAIN) => return Ok(()),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// (device, inode) of the pipe or FIFO behind descriptor `fd` of `host`:
/// the two kinds' inode numbers come from different filesystems.
pub(crate) fn key(host: HostPid, fd: i32) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("/proc/{host}/fd/{fd}"))?;
    Ok((m.dev(), m.ino()))
}
