//! Written-page tracking of another process, and copying its pages.
//!
//! A userfaultfd made inside the process (by an injected call: it binds to
//! the caller's address space) and taken out with `pidfd_getfd` is set to
//! *asynchronous write-protect* mode (`UFFD_FEATURE_WP_ASYNC`, with
//! `UFFD_FEATURE_WP_UNPOPULATED` so that pages never touched are covered
//! too). Its ranges are registered and write-protected; from then on the
//! process's first write to a page clears that page's protection in the
//! kernel (no fault reaches us, nothing waits). `PAGEMAP_SCAN` on
//! `/proc/<pid>/pagemap` lists the pages whose protection is gone
//! (`PAGE_IS_WRITTEN`) and, with `PM_SCAN_WP_MATCHING`, protects them again
//! in the same walk: "what was written since the last scan".
//!
//! A page dropped with `MADV_DONTNEED` reads as written and not present.
//!
//! [`read_pages`] then reads the written pages, and [`PageWriter`] writes
//! them into another process.
//!
//! The structures mirror `<linux/userfaultfd.h>` and `<linux/fs.h>` of
//! Linux 6.7+ (Debian 12's headers predate `PAGEMAP_SCAN`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};

/// `PAGE_IS_WRITTEN`: written since it was last protected.
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// `PAGE_IS_FILE`: a page of a file (or of shared memory).
pub const PAGE_IS_FILE: u64 = 1 << 2;
/// `PAGE_IS_PRESENT`: mapped in memory.
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
/// `PAGE_IS_SWAPPED`: swapped out (or a migration entry, or a marker).
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// `PAGE_IS_PFNZERO`: the shared zero page (a read of memory never written).
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// `PAGE_IS_GUARD`: a guard region's page (`MADV_GUARD_INSTALL`, 6.15+).
pub const PAGE_IS_GUARD: u64 = 1 << 8;

const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// `UFFD_USER_MODE_ONLY`: what an unprivileged process may create (the
/// asynchronous mode never delivers a fault, kernel-mode or not).
pub const UFFD_USER_MODE_ONLY: u64 = 1;

/// `_IOWR(type, nr, size)` on x86_64.
const fn iowr(ty: u64, nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (ty << 8) | nr
}
const UFFDIO_API: u64 = iowr(0xAA, 0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0xAA, 0x00, 32);
const UFFDIO_WRITEPROTECT: u64 = iowr(0xAA, 0x06, 24);
const PAGEMAP_SCAN: u64 = iowr(b'f' as u64, 16, 96);
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// One run of pages of the same categories (`struct page_region`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageRegion {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// `PAGE_IS_*` bits (of those asked for).
    pub categories: u64,
}

#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// # Safety
/// `arg` must point to the structure request `req` takes, live and
/// writable for the call.
unsafe fn ioctl(fd: BorrowedFd<'_>, req: u64, arg: *mut libc::c_void) -> io::Result<libc::c_int> {
    // SAFETY: the caller's contract above.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as libc::c_ulong, arg) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// A duplicate of descriptor `fd` of process `pid` (`pidfd_getfd`).
pub fn take_fd(pid: i32, fd: i32) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid).ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number and flags by
    // value; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: r is a descriptor the kernel just installed for us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// `UFFDIO_API` for asynchronous write-protect tracking.
pub fn enable_async_wp(uffd: BorrowedFd<'_>) -> io::Result<()> {
    let mut api = [UFFD_API, UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED, 0u64];
    // SAFETY: struct uffdio_api is three u64s: `api`, live and writable.
    unsafe { ioctl(uffd, UFFDIO_API, api.as_mut_ptr().cast()) }.map(|_| ())
}

/// Register `[start, end)` (whole mappings) for write-protect tracking.
pub fn register_wp(uffd: BorrowedFd<'_>, start: u64, end: u64) -> io::Result<()> {
    // struct uffdio_register { range { start, len }, mode, ioctls }.
    let mut reg = [start, end - start, UFFDIO_REGISTER_MODE_WP, 0u64];
    // SAFETY: struct uffdio_register is four u64s: `reg`, live and writable.
    unsafe { ioctl(uffd, UFFDIO_REGISTER, reg.as_mut_ptr().cast()) }.map(|_| ())
}

/// Write-protect every page of `[start, end)` (registered).
pub fn protect(uffd: BorrowedFd<'_>, start: u64, end: u64) -> io::Result<()> {
    // struct uffdio_writeprotect { range { start, len }, mode }.
    let mut wp = [start, end - start, UFFDIO_WRITEPROTECT_MODE_WP];
    // SAFETY: struct uffdio_writeprotect is three u64s: `wp`, live and
    // writable.
    unsafe { ioctl(uffd, UFFDIO_WRITEPROTECT, wp.as_mut_ptr().cast()) }.map(|_| ())
}

/// The pages of each range `[start, end)` of `ranges` written since they
/// were protected, as runs split by `PAGE_IS_PRESENT`, `PAGE_IS_SWAPPED`
/// and `PAGE_IS_GUARD` (a guard installed replaced the page), appended to
/// `out`; they are protected again in the
/// same walk. `pagemap` is the process's `/proc/<pid>/pagemap`. (One
/// buffer of 24 KiB for the kernel's answers, not one made and zeroed per
/// range.)
pub fn take_written(pagemap: BorrowedFd<'_>, ranges: &[(u64, u64)], out: &mut Vec<PageRegion>) -> io::Result<()> {
    let mut buf = vec![PageRegion::default(); 1024];
    for &(start, end) in ranges {
        take_written_in(pagemap, (start, end), &mut buf, out)?;
    }
    Ok(())
}

/// [`take_written`] of one range, the kernel's answers in `buf`.
fn take_written_in(
    pagemap: BorrowedFd<'_>,
    (start, end): (u64, u64),
    buf: &mut [PageRegion],
    out: &mut Vec<PageRegion>,
) -> io::Result<()> {
    let mut at = start;
    while at < end {
        let flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC;
        let wanted = PAGE_IS_WRITTEN | PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_GUARD;
        let (n, walk_end) = scan(pagemap, (at, end), buf, 0, (flags, 0, PAGE_IS_WRITTEN, 0, wanted))?;
        out.extend_from_slice(&buf[..n]);
        if walk_end <= at {
            return Err(io::Error::other("PAGEMAP_SCAN made no progress"));
        }
        at = walk_end;
    }
    Ok(())
}

/// What a `PAGEMAP_SCAN` asks: its flags, then the categories inverted,
/// required, any of which is required, and returned.
type Ask = (u64, u64, u64, u64, u64);

/// A process's own pages ([`own_pages`]): neither a file's page nor the
/// zero page, and any of `anyof` (present, swapped).
fn own(anyof: u64) -> Ask {
    (0, PAGE_IS_FILE | PAGE_IS_PFNZERO, PAGE_IS_FILE | PAGE_IS_PFNZERO, anyof, anyof)
}

/// One `PAGEMAP_SCAN` of `[start, end)` answering into `buf` (at most
/// `max_pages` pages, 0 for no bound): how many regions it wrote, and
/// where its walk ended.
fn scan(
    pagemap: BorrowedFd<'_>,
    (start, end): (u64, u64),
    buf: &mut [PageRegion],
    max_pages: u64,
    (flags, inverted, required, anyof, returned): Ask,
) -> io::Result<(usize, u64)> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        flags,
        start,
        end,
        walk_end: 0,
        vec: buf.as_mut_ptr() as u64,
        vec_len: buf.len() as u64,
        max_pages,
        category_inverted: inverted,
        category_mask: required,
        category_anyof_mask: anyof,
        return_mask: returned,
    };
    // SAFETY: `arg` is a live struct pm_scan_arg; the kernel writes at most
    // `vec_len` page_regions into `buf`, which has that many.
    let n = unsafe { ioctl(pagemap, PAGEMAP_SCAN, (&mut arg as *mut PmScanArg).cast()) }? as usize;
    Ok((n.min(buf.len()), arg.walk_end))
}

/// Whether range `[start, end)` of the process whose `/proc/<pid>/pagemap`
/// is `pagemap` holds a page of its own: an anonymous page present (or,
/// with `swapped`, swapped out), not the zero page. Stops at the first one
/// found (a few microseconds, even over gigabytes of memory). (A process
/// whose memory a userfaultfd write-protects with `WP_UNPOPULATED` has a
/// marker in each page never written, which counts as swapped.)
pub fn has_own_page(pagemap: BorrowedFd<'_>, (start, end): (u64, u64), swapped: bool) -> io::Result<bool> {
    let anyof = if swapped { PAGE_IS_PRESENT | PAGE_IS_SWAPPED } else { PAGE_IS_PRESENT };
    let mut found = [PageRegion::default(); 1];
    let (n, _) = scan(pagemap, (start, end), &mut found, 1, own(anyof))?;
    Ok(n > 0)
}

/// The pages of range `[start, end)` that the process whose
/// `/proc/<pid>/pagemap` is `pagemap` holds of its own: anonymous pages
/// present or swapped out (a private file mapping's pages written since it
/// was mapped among them), neither a file's page nor the zero page; as
/// runs appended to `out`. What a copy of that memory must carry: the
/// rest reads as zeros, or from the mapped file.
pub fn own_pages(pagemap: BorrowedFd<'_>, range: (u64, u64), out: &mut Vec<(u64, u64)>) -> io::Result<()> {
    runs_of(pagemap, range, own(PAGE_IS_PRESENT | PAGE_IS_SWAPPED), out)
}

/// The pages of guard regions (`MADV_GUARD_INSTALL`) in `[start, end)`
/// of the process whose `/proc/<pid>/pagemap` is `pagemap`, as runs
/// appended to `out` (none on a kernel without them).
pub fn guard_pages(pagemap: BorrowedFd<'_>, range: (u64, u64), out: &mut Vec<(u64, u64)>) -> io::Result<()> {
    runs_of(pagemap, range, (0, 0, 0, PAGE_IS_GUARD, PAGE_IS_GUARD), out)
}

/// The runs of pages `ask` selects in `[start, end)`, appended to `out`.
fn runs_of(pagemap: BorrowedFd<'_>, (start, end): (u64, u64), ask: Ask, out: &mut Vec<(u64, u64)>) -> io::Result<()> {
    let mut buf = vec![PageRegion::default(); 1024];
    let mut at = start;
    while at < end {
        let (n, walk_end) = scan(pagemap, (at, end), &mut buf, 0, ask)?;
        for r in &buf[..n] {
            match out.last_mut() {
                // (Past what is known already: never twice.)
                Some(last) if r.end <= last.1 => {}
                Some(last) if r.start <= last.1 => last.1 = r.end,
                _ => out.push((r.start, r.end)),
            }
        }
        // A walk that did not fill the buffer went to the end (its
        // `walk_end` then may lie before the end: measured on 6.18).
        if n < buf.len() {
            break;
        }
        if walk_end <= at {
            return Err(io::Error::other("PAGEMAP_SCAN made no progress"));
        }
        at = walk_end;
    }
    Ok(())
}

/// Most ranges one `process_vm_readv` takes (`IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// Read the bytes of `ranges` (start, end) of process `pid`'s memory into
/// `out`, one range after the other (`out` is at least their total
/// length). `process_vm_readv`, up to [`IOV_MAX`] ranges a call: for
/// scattered single pages about half the cost of a `pread` of
/// `/proc/<pid>/mem` each. A range that cannot be read whole is an error.
pub fn read_pages(pid: i32, ranges: &[(u64, u64)], out: &mut [u8]) -> io::Result<()> {
    let mut at = 0usize;
    for batch in ranges.chunks(IOV_MAX) {
        let len: usize = batch.iter().map(|(s, e)| (e - s) as usize).sum();
        let dst = out.get_mut(at..at + len).ok_or_else(|| io::Error::other("read_pages: buffer too small"))?;
        let mut local = Vec::with_capacity(batch.len());
        let mut rest = dst;
        for &(s, e) in batch {
            let (one, more) = rest.split_at_mut((e - s) as usize);
            local.push(io::IoSliceMut::new(one));
            rest = more;
        }
        let remote: Vec<RemoteIoVec> =
            batch.iter().map(|&(s, e)| RemoteIoVec { base: s as usize, len: (e - s) as usize }).collect();
        let pid = nix::unistd::Pid::from_raw(pid);
        let r = process_vm_readv(pid, &mut local, &remote).map_err(io::Error::from)?;
        if r != len {
            return Err(io::Error::other(format!("process_vm_readv read {r} of {len} bytes")));
        }
        at += len;
    }
    Ok(())
}

/// Writes bytes into another process's memory at given addresses:
/// `process_vm_writev`, up to [`IOV_MAX`] ranges a call (one copy a page;
/// through `/proc/<pid>/mem` each page is copied twice, via a kernel
/// bounce page, and a call is made per range: 1,168 scattered pages took
/// 3.4-3.6 ms that way against 2.7-2.8 here, alone; in bench runs, where
/// this write delays the next standby's fork, 4.9 ms p50 against 4.1,
/// alternating). A batch that call cannot write whole (a private mapping
/// that is read-only now: the call honours protections) is written
/// through `/proc/<pid>/mem`, which writes those too.
pub struct PageWriter {
    pid: i32,
    to: std::fs::File,
}

impl PageWriter {
    /// Into process `to`.
    pub fn open(to: i32) -> io::Result<PageWriter> {
        Ok(PageWriter { pid: to, to: std::fs::OpenOptions::new().write(true).open(format!("/proc/{to}/mem"))? })
    }

    /// Write `data` to `ranges` (start, end), one range after the other
    /// (as [`read_pages`] reads them).
    pub fn write(&self, ranges: &[(u64, u64)], data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut at = 0usize;
        for batch in ranges.chunks(IOV_MAX) {
            let len: usize = batch.iter().map(|(s, e)| (e - s) as usize).sum();
            let src = data.get(at..at + len).ok_or_else(|| io::Error::other("PageWriter: data too short"))?;
            let remote: Vec<RemoteIoVec> =
                batch.iter().map(|&(s, e)| RemoteIoVec { base: s as usize, len: (e - s) as usize }).collect();
            let pid = nix::unistd::Pid::from_raw(self.pid);
            let written = process_vm_writev(pid, &[io::IoSlice::new(src)], &remote).unwrap_or(0);
            if written != len {
                // (From the range the call stopped in; what it wrote is
                // written again, the same bytes.)
                let mut off = 0usize;
                for &(s, e) in batch {
                    let n = (e - s) as usize;
                    if off + n > written {
                        self.to.write_all_at(&src[off..off + n], s)?;
                    }
                    off += n;
                }
            }
            at += len;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first private mapping of `pid` whose permissions start with
    /// `perms` (from `/proc/<pid>/maps`): its start.
    fn private_map(pid: i32, perms: &str) -> Option<u64> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let line = maps.lines().find(|l| l.split_whitespace().nth(1).is_some_and(|p| p.starts_with(perms)))?;
        u64::from_str_radix(line.split('-').next()?, 16).ok()
    }

    /// Pages written into another process read back as written, in a
    /// writable mapping (`process_vm_writev`) and in a read-only private
    /// one, which that call refuses (`/proc/<pid>/mem` then).
    #[test]
    fn page_writer_writes_writable_and_read_only_pages() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: writing another process's memory needs root here");
            return;
        }
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        // (Once it sleeps: its loader is done with the pages we overwrite.)
        let t = std::time::Instant::now();
        let (rw, ro) = loop {
            let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
            let nr = syscall.split_whitespace().next().and_then(|n| n.parse::<i64>().ok());
            let exec = nr == Some(libc::SYS_clock_nanosleep) || nr == Some(libc::SYS_nanosleep);
            if let (true, Some(rw), Some(ro)) = (exec, private_map(pid, "rw-p"), private_map(pid, "r--p")) {
                break (rw, ro);
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "sleep did not start");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let ranges = [(rw, rw + 4096), (ro, ro + 4096)];
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        PageWriter::open(pid).unwrap().write(&ranges, &data).unwrap();
        let mut back = vec![0u8; 8192];
        read_pages(pid, &ranges, &mut back).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(back == data, "the pages read back differ from those written");
    }
}
