//! Pipes (`FdKind::Pipe`), and the buffered bytes of pipes and FIFOs.
//!
//! A pipe is the same kernel object in the template as in the running
//! original: kept as it is. Its buffered bytes are read in pass 1
//! (originals stopped) through `/proc/<pid>/fd/<n>`, `tee`d into a pipe of
//! the daemon's (a copy that consumes nothing), once per pipe (by device
//! and inode: a pipe's and a FIFO's inode numbers come from different
//! file systems). At the restore the pipe is reached through a template
//! that holds it, drained, and refilled; a FIFO on a layer through its
//! keeper (`fifo.rs`).

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;
use rustix::io::Errno;

use super::Kind;
use crate::fdstate::{Seen, open_proc_fd};
use crate::model::{FdImage, FdKind, PipeBuffer};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// Pipes.
pub(crate) struct Pipe;

impl Kind for Pipe {}

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
        keys.push((f.fd, k));
        if seen.first_pipe(k) {
            let (bytes, size) =
                read_buffered(host, f.fd).map_err(|e| Error::Proc { pid: host, what: "pipe contents", source: e })?;
            pipes.push(PipeBuffer { dev: k.0, ino: k.1, bytes, size });
        }
    }
    Ok((pipes, keys))
}

/// At a restore: each pipe of `set` holds its checkpoint's bytes again,
/// put in through the template that reaches it, or a FIFO's keeper.
pub(crate) fn put_back(set: &CheckpointTemplates, keepers: &HashMap<String, OwnedFd>) -> Result<()> {
    for (pipe, host, fd) in &set.pipes {
        let layer_fifo =
            set.templates.iter().filter(|t| t.host == *host).flat_map(|t| &t.image.fds).find_map(|f| match &f.kind {
                FdKind::Fifo { path, on_layer: true, .. } if f.fd == *fd => Some(path),
                _ => None,
            });
        let filled = match layer_fifo.and_then(|path| keepers.get(path)) {
            Some(keeper) => super::fifo::fill(keeper, &pipe.bytes, pipe.size),
            None => refill(*host, *fd, &pipe.bytes),
        };
        filled.map_err(|e| Error::Proc { pid: *host, what: "pipe contents", source: e })?;
    }
    Ok(())
}

/// The bytes buffered in the pipe that `fd` of process `host` refers to,
/// without consuming them, and the pipe's capacity.
fn read_buffered(host: HostPid, fd: i32) -> io::Result<(Vec<u8>, usize)> {
    let src = open_proc_fd(host, fd, OFlags::RDONLY)?;
    let size = rustix::pipe::fcntl_getpipe_size(&src)?;
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
    while got < n {
        match rustix::io::read(&copy_r, &mut out[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    out.truncate(got);
    Ok((out, size))
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
