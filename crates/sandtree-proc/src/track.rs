//! Tracking the pages a live process writes between checkpoints.
//!
//! A process large enough that copying its page tables at every
//! checkpoint costs milliseconds (a 100 MB Python whose huge pages
//! copy-on-write split: ~4 ms per fork; 1 GB: ~15 ms), or any process at
//! all (a small one that ran no code since needs no fork either:
//! `incremental.rs`), is *tracked* from its first checkpoint on: a
//! userfaultfd in asynchronous write-protect mode covers its private
//! mappings (see `sandtree_sys::uffd`). The next checkpoint then asks
//! which pages were written since (one `PAGEMAP_SCAN`, which protects them
//! again) and makes its template from the previous one (`incremental.rs`)
//! instead of forking the process.
//!
//! Making the userfaultfd: `userfaultfd(O_CLOEXEC | O_NONBLOCK |
//! UFFD_USER_MODE_ONLY)` is injected into the stopped process with its
//! seccomp filter suspended for that one call (the sandbox's filter denies
//! userfaultfd to the sandbox's own code); the daemon takes the descriptor
//! with `pidfd_getfd` and the process closes its copy. Nothing of it stays
//! in the process: a kernel object hangs on its mappings, and its writes
//! run as fast as before but for one minor fault per page and checkpoint
//! interval.
//!
//! A [`Tracking`] is relative to a *base*: the template whose memory equals
//! the process's at the last scan. It has none until a checkpoint made that
//! template and joined the pool (any failure leaves it without one: the
//! next checkpoint forks).
//!
//! [`Trackings`] holds the trackings of a sandbox's live processes and the
//! userfaultfds of dead ones, [`Parked`] until their memory is gone.
//! [`Delta`] is what a template changed over the one before it, kept with
//! that one ([`PreviousTemplate`]) for `incremental::OlderStandby`.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

use sandtree_sys::{ptrace, uffd};

use crate::inject::Tracee;
use crate::model::MapImage;
use crate::{Error, HostPid, Result};

/// How far below the stack pointer the checkpoint writes into a stopped
/// process, at most: injected calls' results (192 bytes), the holder's
/// lists of runs (1,024 runs of 16 bytes, 512 bytes down).
const OWN_WRITES: u64 = 32 << 10;

/// Written-page tracking of one live process.
pub(crate) struct Tracking {
    /// Start time of the process (`/proc/<pid>/stat` field 22): a reused
    /// pid is another process.
    start_time: u64,
    /// (Always `Some` but in `drop`.)
    uffd: Option<OwnedFd>,
    pagemap: File,
    /// Registered ranges: whole private mappings, adjacent ones merged.
    ranges: Vec<(u64, u64)>,
    /// The template the written pages are counted from: (checkpoint,
    /// template host pid).
    pub base: Option<(String, HostPid)>,
    /// The template before it, and what the base changed over it, when the
    /// base was made from a standby (`incremental::OlderStandby`): the next
    /// checkpoint may start from it, if the base's standby is not ready.
    pub prev: Option<crate::track::PreviousTemplate>,
    /// The last checkpoint found the base's standby not ready (it waited
    /// for its fork, or forked the process): the standby of the template
    /// before is made again first (`Pool::base_hosts`), so that the next
    /// checkpoint can start from that one.
    pub behind: bool,
}

/// Mappings whose writes must be followed: private ones, but the kernel's
/// (`[vsyscall]`, `[vvar]`, `[vdso]`: not pages of the process) and
/// inaccessible reservations (a JVM heap, a wasm guard region: protecting
/// them would build page tables for all of it; one made accessible changes
/// the map, and the checkpoint forks).
fn tracked(m: &MapImage) -> bool {
    !m.shared() && !m.perms.starts_with("---") && !matches!(m.path.as_deref(), Some(p) if p.starts_with("[v"))
}

impl Drop for Tracking {
    /// Closing the userfaultfd takes the write protection off every page
    /// it covers: a walk of the page tables of the whole address space
    /// (~3 ms for a 100 MB Python), which a rollback (dropping the killed
    /// originals' trackings) or a checkpoint must not wait for. It closes
    /// on the closer thread instead.
    fn drop(&mut self) {
        if let Some(fd) = self.uffd.take() {
            crate::closer::drop_later(vec![fd]);
        }
    }
}

/// The userfaultfd of a tracking whose process died or was killed, kept
/// open until its address space is gone: closing a userfaultfd whose
/// memory still exists takes the write protection off every page it
/// covers (the walk of [`Tracking`]'s drop: 3-6 ms of CPU for a 100 MB
/// Python, which competed with the first rollback after a burst of
/// checkpoints, the one that kills the tracked original), while closing it
/// afterwards finds no address space and does nothing. The memory outlives
/// the process while its holder (`memory_holder.rs`) lives: the descriptor closes
/// once that holder is reaped.
pub(crate) struct Parked {
    /// Host pid of the holder sharing the process's memory.
    holder: HostPid,
    uffd: OwnedFd,
}

/// The written-page trackings of a sandbox's live processes, by host pid,
/// and the parked descriptors of dead ones.
#[derive(Default)]
pub(crate) struct Trackings {
    live: std::collections::HashMap<HostPid, Tracking>,
    parked: Vec<Parked>,
}

impl Trackings {
    /// The tracking of process `host`.
    pub(crate) fn get(&self, host: &HostPid) -> Option<&Tracking> {
        self.live.get(host)
    }

    /// [`Trackings::get`], to change it.
    pub(crate) fn get_mut(&mut self, host: &HostPid) -> Option<&mut Tracking> {
        self.live.get_mut(host)
    }

    /// Whether process `host` is tracked.
    pub(crate) fn contains_key(&self, host: &HostPid) -> bool {
        self.live.contains_key(host)
    }

    /// Track process `host` with `tracking`.
    pub(crate) fn insert(&mut self, host: HostPid, tracking: Tracking) {
        self.live.insert(host, tracking);
    }

    /// Take the tracking of process `host` out (a checkpoint's pass).
    pub(crate) fn remove(&mut self, host: &HostPid) -> Option<Tracking> {
        self.live.remove(host)
    }

    /// Every tracking.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Tracking> {
        self.live.values()
    }

    /// Every tracking, to change.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut Tracking> {
        self.live.values_mut()
    }

    /// End the trackings of the processes not in `kept` (gone, or not
    /// stopped this time): a dead one's userfaultfd is parked until its
    /// memory is gone (`holder_of` its host pid gives its holder's); a
    /// live one's closes on the closer thread (`Tracking`'s drop).
    pub(crate) fn end_all_but(&mut self, kept: &[HostPid], holder_of: impl Fn(HostPid) -> Option<HostPid>) {
        let ended: Vec<HostPid> = self.live.keys().filter(|h| !kept.contains(h)).copied().collect();
        for host in ended {
            match self.live.remove(&host) {
                Some(tracking) if !tracking.tracks(host) => self.park(holder_of(host), tracking),
                Some(tracking) => drop(tracking),
                None => {}
            }
        }
    }

    /// End every tracking: the processes were killed (a rollback).
    pub(crate) fn end_killed(&mut self, holder_of: impl Fn(HostPid) -> Option<HostPid>) {
        for (host, tracking) in std::mem::take(&mut self.live) {
            self.park(holder_of(host), tracking);
        }
    }

    /// Ends `tracking` of a process dead or killed: parked until its
    /// holder (host pid `holder`) is reaped, or (no holder) closed on the
    /// closer thread.
    fn park(&mut self, holder: Option<HostPid>, mut tracking: Tracking) {
        let Some(uffd) = tracking.uffd.take() else { return };
        match holder {
            Some(holder) => self.parked.push(Parked { holder, uffd }),
            None => crate::closer::drop_later(vec![uffd]),
        }
    }

    /// Closes the parked descriptors whose holder is reaped (`alive` says
    /// whether a host pid is still held or dying). Called by the tracer
    /// after each reap.
    pub(crate) fn close_parked(&mut self, alive: impl Fn(HostPid) -> bool) {
        if self.parked.is_empty() {
            return;
        }
        let gone: Vec<OwnedFd> = self.parked.extract_if(.., |p| !alive(p.holder)).map(|p| p.uffd).collect();
        // (Cheap now, but a close is a syscall the tracer need not make.)
        crate::closer::drop_later(gone);
    }
}

impl Tracking {
    /// End it here and now, for a tracking armed anew on the same process
    /// (a userfaultfd still registered on a mapping makes another's
    /// registration fail with `EBUSY`).
    pub(crate) fn end_now(mut self) {
        drop(self.uffd.take());
    }

    /// The userfaultfd.
    fn uffd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.uffd.as_ref().expect("a tracking's userfaultfd is taken only by its drop").as_fd()
    }

    /// Whether this still tracks process `host` (not a process that reused
    /// its pid, nor one that exec'd: its mappings would be others).
    pub(crate) fn tracks(&self, host: HostPid) -> bool {
        sandtree_sys::process::start_time(host.raw()) == Some(self.start_time)
    }

    /// Start tracking stopped process `host` (`orig`, being injected into)
    /// with memory map `maps`: every page counts as unwritten from here.
    pub(crate) fn arm(orig: &mut Tracee, host: HostPid, maps: &[MapImage]) -> Result<Tracking> {
        let start_time =
            sandtree_sys::process::start_time(host.raw()).ok_or(Error::Died { pid: host, how: "is gone".into() })?;
        ptrace::set_options(host.raw(), true, true).map_err(|e| Error::Ptrace {
            pid: host,
            op: "SETOPTIONS",
            source: e,
        })?;
        let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64 | uffd::UFFD_USER_MODE_ONLY;
        let made = orig.call("userfaultfd", libc::SYS_userfaultfd, &[flags]);
        let back = ptrace::set_options(host.raw(), true, false);
        let fd = made? as i32;
        let taken = uffd::take_fd(host.raw(), fd);
        let closed = orig.call("close", libc::SYS_close, &[fd as u64]);
        back.map_err(|e| Error::Ptrace { pid: host, op: "SETOPTIONS", source: e })?;
        closed?;
        let proc_err = |what: &'static str| move |e| Error::Proc { pid: host, what, source: e };
        let uffd = taken.map_err(proc_err("userfaultfd (pidfd_getfd)"))?;
        uffd::enable_async_wp(uffd.as_fd()).map_err(proc_err("userfaultfd API"))?;
        let pagemap = File::open(format!("/proc/{host}/pagemap")).map_err(proc_err("pagemap"))?;
        let mut t = Tracking {
            start_time,
            uffd: Some(uffd),
            pagemap,
            ranges: Vec::new(),
            base: None,
            prev: None,
            behind: false,
        };
        t.cover(maps);
        Ok(t)
    }

    /// Register and protect the private mappings of `maps` not covered
    /// yet (new since the last call). A mapping the kernel refuses is left
    /// out, and [`Tracking::covers`] says so: checkpoints then fork.
    pub(crate) fn cover(&mut self, maps: &[MapImage]) {
        let mut added = false;
        for m in maps.iter().filter(|m| tracked(m)) {
            if self.inside(m.start, m.end) {
                continue;
            }
            match uffd::register_wp(self.uffd(), m.start, m.end)
                .and_then(|()| uffd::protect(self.uffd(), m.start, m.end))
            {
                Ok(()) => {
                    self.ranges.push((m.start, m.end));
                    added = true;
                }
                Err(e) => tracing::debug!(start = m.start, path = ?m.path, "mapping not tracked: {e}"),
            }
        }
        if added {
            merge_runs(&mut self.ranges);
        }
    }

    /// Whether `[s, e)` lies in one registered range (touching ranges are
    /// merged, so a run of adjacent tracked mappings lies in one).
    fn inside(&self, s: u64, e: u64) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= s && e <= b)
    }

    /// Whether every private mapping of `maps` is tracked.
    pub(crate) fn covers(&self, maps: &[MapImage]) -> bool {
        maps.iter().filter(|m| tracked(m)).all(|m| self.inside(m.start, m.end))
    }

    /// The pages written since the last call (or [`Tracking::arm`]), as
    /// runs split by presence; they count as unwritten from here.
    /// Protect again the pages just below stack pointer `sp` of the
    /// stopped process: the checkpoint's own writes dirtied them (results
    /// of injected calls in the dead space below the red zone, the
    /// holder's lists of runs, and what was there put back). Called just
    /// before the process is let go: from the scan (or the fork) on it
    /// ran no code, so its template holds every page as the process has
    /// it but for that dead space, and a page counts as written at the
    /// next checkpoint only if the process wrote it (a process that ran
    /// no code then has none: `incremental.rs`).
    pub(crate) fn protect_own_writes(&self, sp: u64) {
        let lo = sp.saturating_sub(OWN_WRITES) & !0xfff;
        let hi = (sp & !0xfff) + 0x1000;
        for &(s, e) in &self.ranges {
            let (a, b) = (s.max(lo), e.min(hi));
            if a < b
                && let Err(e) = uffd::protect(self.uffd(), a, b)
            {
                tracing::debug!("pages below the stack pointer not protected again: {e}");
            }
        }
    }

    pub(crate) fn take_written(&self, host: HostPid) -> Result<Vec<uffd::PageRegion>> {
        let mut out = Vec::new();
        uffd::take_written(self.pagemap.as_fd(), &self.ranges, &mut out).map_err(|e| Error::Proc {
            pid: host,
            what: "written pages (PAGEMAP_SCAN)",
            source: e,
        })?;
        Ok(out)
    }
}

/// What a template of a tracked process changed over the template before
/// it: the pages the process wrote in between (page runs) and the page
/// runs it dropped.
#[derive(Debug, Default)]
pub(crate) struct Delta {
    pub pages: Vec<(u64, u64)>,
    pub zap: Vec<(u64, u64)>,
}

/// Sort `runs` (start, end) and merge those that overlap or touch.
pub(crate) fn merge_runs(runs: &mut Vec<(u64, u64)>) {
    runs.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for &(s, e) in runs.iter() {
        match merged.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    *runs = merged;
}

/// A process's previous template (checkpoint, host pid) and what the
/// template after it changes over it.
pub(crate) type PreviousTemplate = ((String, HostPid), std::sync::Arc<Delta>);
