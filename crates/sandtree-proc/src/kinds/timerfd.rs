//! Timerfds (`FdKind::AnonInode`, `timerfd`): the template holds the same
//! object as the running original; at the restore its setting goes back to
//! the checkpoint's (time to the next expiry, interval, and the expirations
//! not read yet), through a duplicate taken with `pidfd_getfd`.

use std::io;

use super::Kind;
use crate::fdstate::dup_from;
use crate::model::{AnonState, FdImage, FdKind};
use crate::{Error, HostPid, Result};

/// Timerfds.
pub(crate) struct Timerfd;

impl Kind for Timerfd {}

/// At a restore: the setting of timerfd `f` of template `host` back to the
/// checkpoint's.
pub(crate) fn put_back(host: HostPid, f: &FdImage) -> Result<()> {
    let FdKind::AnonInode { state: Some(AnonState::Timerfd { value_ns, interval_ns, ticks, .. }), .. } = &f.kind else {
        return Ok(());
    };
    set(host, f.fd, (*value_ns, *interval_ns, *ticks)).map_err(|e| Error::Proc {
        pid: host,
        what: "timerfd setting",
        source: e,
    })
}

fn set(host: HostPid, fd: i32, (value_ns, interval_ns, ticks): (u64, u64, u64)) -> io::Result<()> {
    let obj = dup_from(host, fd)?;
    let ts =
        |ns: u64| rustix::time::Timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
    let spec = rustix::time::Itimerspec { it_interval: ts(interval_ns), it_value: ts(value_ns) };
    rustix::time::timerfd_settime(&obj, rustix::time::TimerfdTimerFlags::empty(), &spec)?;
    if ticks > 0 {
        sandtree_sys::timerfd::set_ticks(&obj, ticks)?;
    }
    Ok(())
}
