//! Eventfds (`FdKind::AnonInode`, `eventfd`): the template holds the same
//! object as the running original; at the restore its counter goes back
//! to the checkpoint's (read from `eventfd-count`): a duplicate taken with
//! `pidfd_getfd` from the template is drained and written.

use std::io;

use rustix::fs::OFlags;
use rustix::io::Errno;

use super::Kind;
use crate::fdstate::dup_from;
use crate::model::{AnonState, FdImage, FdKind};
use crate::{Error, HostPid, Result};

/// Eventfds.
pub(crate) struct Eventfd;

impl Kind for Eventfd {}

/// At a restore: the counter of eventfd `f` of template `host` back to the
/// checkpoint's.
pub(crate) fn put_back(host: HostPid, f: &FdImage) -> Result<()> {
    let FdKind::AnonInode { state: Some(AnonState::Eventfd { count, .. }), .. } = &f.kind else { return Ok(()) };
    set_count(host, f.fd, *count).map_err(|e| Error::Proc { pid: host, what: "eventfd counter", source: e })
}

fn set_count(host: HostPid, fd: i32, count: u64) -> io::Result<()> {
    let obj = dup_from(host, fd)?;
    // The status flags belong to the shared open file: set
    // O_NONBLOCK only while draining, then put them back.
    let flags = rustix::fs::fcntl_getfl(&obj)?;
    rustix::fs::fcntl_setfl(&obj, flags | OFlags::NONBLOCK)?;
    let mut buf = [0u8; 8];
    // A semaphore-mode eventfd gives 1 per read.
    let mut reads = 0u32;
    let drained = loop {
        match rustix::io::read(&obj, &mut buf) {
            Ok(_) if reads < 1 << 20 => reads += 1,
            Ok(_) => break Err(io::Error::other("eventfd does not drain")),
            Err(Errno::AGAIN) => break Ok(()),
            Err(Errno::INTR) => {}
            Err(e) => break Err(e.into()),
        }
    };
    let written = match (drained.is_ok(), count) {
        (true, c) if c > 0 => rustix::io::write(&obj, &c.to_ne_bytes()).map(|_| ()).map_err(io::Error::from),
        _ => Ok(()),
    };
    rustix::fs::fcntl_setfl(&obj, flags)?;
    drained?;
    written
}
