//! btrfs ioctls: subvolume create / snapshot / destroy, subvolume info,
//! read-only flag, and a tree search that sums the bytes written in a
//! subvolume since a transaction id.
//!
//! Everything here talks to the kernel directly (`ioctl(2)` on a directory
//! fd); the `btrfs` CLI is never run. All functions return [`io::Error`]
//! built from the raw errno, so callers can recognise `ENOSPC`, `EEXIST`,
//! `ENOENT`, ... with `raw_os_error()`.
//!
//! ```text
//!  parent dir fd ──ioctl(SUBVOL_CREATE_V2, {name})──▶ <parent>/<name>   (new empty subvolume)
//!  dst dir fd    ──ioctl(SNAP_CREATE_V2, {fd: src, name, flags})──▶ <dst>/<name>
//!  parent dir fd ──ioctl(SNAP_DESTROY_V2, {name})──▶ removes <parent>/<name>
//!  subvol fd     ──ioctl(GET_SUBVOL_INFO)──▶ treeid, generation, otransid, otime …
//!  subvol fd     ──ioctl(TREE_SEARCH_V2, tree_id 0 = fd's own tree)──▶ file extent items
//!  any fd        ──ioctl(SYNC)──▶ commits, and wakes the cleaner (which drops deleted subvolumes)
//!  any fd        ──ioctl(SUBVOL_SYNC_WAIT, {id, mode: FOR_ONE})──▶ returns once deleted
//!                  subvolume `id` is dropped and that committed (Linux 6.8+)
//! ```
//!
//! Kernel quirks worked around:
//! - `BTRFS_IOC_GET_SUBVOL_INFO` has been observed to return `1` (not `0`) on
//!   success; every ioctl here treats any non-negative return as success.
//! - The tree search key range is a range over the *compound* key
//!   `(objectid, type, offset)`, not a per-field filter: items of other types
//!   inside the range are returned too and are filtered here.
//! - `min_transid` in the search key prunes whole subtrees whose generation is
//!   older, but does not filter items inside a leaf that was rewritten; items
//!   are filtered on the file extent item's own `generation` field.
//! - The search reads the live tree, so data still in the page cache
//!   (delalloc) is not yet visible: call [`syncfs`] first for exact numbers.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{Mode, OFlags};

/// `statfs.f_type` of a btrfs filesystem.
pub const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// Inode number of the root directory of every btrfs subvolume.
pub const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
/// Subvolume flag: read-only.
pub const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;
/// Key type of a file extent item.
pub const BTRFS_EXTENT_DATA_KEY: u8 = 108;

const BTRFS_IOCTL_MAGIC: u8 = 0x94;
const BTRFS_SUBVOL_NAME_MAX: usize = 4039;
const BTRFS_VOL_NAME_MAX: usize = 255;
const BTRFS_UUID_SIZE: usize = 16;

const BTRFS_FILE_EXTENT_INLINE: u8 = 0;
const BTRFS_FILE_EXTENT_REG: u8 = 1;
const BTRFS_FILE_EXTENT_PREALLOC: u8 = 2;

#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; BTRFS_SUBVOL_NAME_MAX + 1],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct IoctlTimespec {
    sec: u64,
    nsec: u32,
}

#[repr(C)]
struct GetSubvolInfoArgs {
    treeid: u64,
    name: [u8; BTRFS_VOL_NAME_MAX + 1],
    parent_id: u64,
    dirid: u64,
    generation: u64,
    flags: u64,
    uuid: [u8; BTRFS_UUID_SIZE],
    parent_uuid: [u8; BTRFS_UUID_SIZE],
    received_uuid: [u8; BTRFS_UUID_SIZE],
    ctransid: u64,
    otransid: u64,
    stransid: u64,
    rtransid: u64,
    ctime: IoctlTimespec,
    otime: IoctlTimespec,
    stime: IoctlTimespec,
    rtime: IoctlTimespec,
    reserved: [u64; 8],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: u32,
    unused1: u64,
    unused2: u64,
    unused3: u64,
    unused4: u64,
}

/// Header of `struct btrfs_ioctl_search_args_v2`; the result buffer follows.
#[repr(C)]
struct SearchArgsV2Header {
    key: SearchKey,
    buf_size: u64,
}

const SEARCH_HEADER_LEN: usize = 32;
const SEARCH_BUF_SIZE: usize = 64 * 1024;

// Layouts checked against <linux/btrfs.h> on x86_64.
const _: () = assert!(size_of::<VolArgsV2>() == 4096);
const _: () = assert!(size_of::<GetSubvolInfoArgs>() == 504);
const _: () = assert!(size_of::<SearchKey>() == 104);
const _: () = assert!(size_of::<SearchArgsV2Header>() == 112);
const _: () = assert!(size_of::<SubvolWaitArgs>() == 16);

const IOC_SNAP_CREATE_V2: libc::c_ulong =
    nix::request_code_write!(BTRFS_IOCTL_MAGIC, 23, size_of::<VolArgsV2>()) as libc::c_ulong;
const IOC_SUBVOL_CREATE_V2: libc::c_ulong =
    nix::request_code_write!(BTRFS_IOCTL_MAGIC, 24, size_of::<VolArgsV2>()) as libc::c_ulong;
const IOC_SNAP_DESTROY_V2: libc::c_ulong =
    nix::request_code_write!(BTRFS_IOCTL_MAGIC, 63, size_of::<VolArgsV2>()) as libc::c_ulong;
const IOC_GET_SUBVOL_INFO: libc::c_ulong =
    nix::request_code_read!(BTRFS_IOCTL_MAGIC, 60, size_of::<GetSubvolInfoArgs>()) as libc::c_ulong;
const IOC_TREE_SEARCH_V2: libc::c_ulong =
    nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 17, size_of::<SearchArgsV2Header>()) as libc::c_ulong;
const IOC_SUBVOL_GETFLAGS: libc::c_ulong =
    nix::request_code_read!(BTRFS_IOCTL_MAGIC, 25, size_of::<u64>()) as libc::c_ulong;
const IOC_SUBVOL_SETFLAGS: libc::c_ulong =
    nix::request_code_write!(BTRFS_IOCTL_MAGIC, 26, size_of::<u64>()) as libc::c_ulong;
const IOC_SYNC: libc::c_ulong = nix::request_code_none!(BTRFS_IOCTL_MAGIC, 8) as libc::c_ulong;
const IOC_SUBVOL_SYNC_WAIT: libc::c_ulong =
    nix::request_code_write!(BTRFS_IOCTL_MAGIC, 65, size_of::<SubvolWaitArgs>()) as libc::c_ulong;
/// `BTRFS_SUBVOL_SYNC_WAIT_FOR_ONE`: wait until the deleted subvolume
/// `subvolid` is gone.
const SUBVOL_SYNC_WAIT_FOR_ONE: u32 = 0;

/// `struct btrfs_ioctl_subvol_wait`.
#[repr(C)]
struct SubvolWaitArgs {
    subvolid: u64,
    mode: u32,
    count: u32,
}

/// Facts about one subvolume, from `BTRFS_IOC_GET_SUBVOL_INFO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubvolInfo {
    /// Tree id (the subvolume id).
    pub id: u64,
    /// Tree id of the subvolume containing this one.
    pub parent_id: u64,
    /// Generation (last transaction that modified the subvolume's root).
    pub generation: u64,
    /// Transaction in which the subvolume was created.
    pub otransid: u64,
    /// Transaction of the last change to the subvolume's contents.
    pub ctransid: u64,
    /// Raw root flags (`BTRFS_ROOT_SUBVOL_RDONLY` = 1 << 0 in root item flags).
    pub flags: u64,
    /// Whether the subvolume is read-only.
    pub readonly: bool,
    /// Creation time.
    pub otime: SystemTime,
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).map_err(io::Error::from)
}

fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.len() > BTRFS_VOL_NAME_MAX
    {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid subvolume name {name:?}")));
    }
    Ok(())
}

fn vol_args(name: &str) -> io::Result<Box<VolArgsV2>> {
    check_name(name)?;
    let mut args =
        Box::new(VolArgsV2 { fd: 0, transid: 0, flags: 0, unused: [0; 4], name: [0; BTRFS_SUBVOL_NAME_MAX + 1] });
    args.name[..name.len()].copy_from_slice(name.as_bytes());
    Ok(args)
}

/// Runs `ioctl(fd, req, arg)`; any return >= 0 is success.
///
/// # Safety
/// `arg` must point to a live, properly initialised value of exactly the type
/// and size that the kernel expects for `req`, writable if `req` writes back.
unsafe fn ioctl_ptr<T>(fd: &OwnedFd, req: libc::c_ulong, arg: *mut T) -> io::Result<libc::c_int> {
    // SAFETY: the caller guarantees `arg` matches `req`; `fd` is an open
    // descriptor borrowed for the duration of the call.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// Creates an empty subvolume `<parent>/<name>` (`BTRFS_IOC_SUBVOL_CREATE_V2`).
pub fn create_subvolume(parent: &Path, name: &str) -> io::Result<()> {
    let dir = open_dir(parent)?;
    let mut args = vol_args(name)?;
    // SAFETY: `args` is a boxed, zero-initialised `btrfs_ioctl_vol_args_v2`
    // (layout asserted above) that outlives the call.
    unsafe { ioctl_ptr(&dir, IOC_SUBVOL_CREATE_V2, &mut *args as *mut VolArgsV2) }?;
    Ok(())
}

/// Snapshots the subvolume `src` as `<dst_dir>/<name>`
/// (`BTRFS_IOC_SNAP_CREATE_V2`), read-only if `readonly`.
pub fn snapshot(src: &Path, dst_dir: &Path, name: &str, readonly: bool) -> io::Result<()> {
    let src_fd = open_dir(src)?;
    let dir = open_dir(dst_dir)?;
    let mut args = vol_args(name)?;
    args.fd = i64::from(src_fd.as_raw_fd());
    if readonly {
        args.flags |= BTRFS_SUBVOL_RDONLY;
    }
    // SAFETY: `args` is a boxed `btrfs_ioctl_vol_args_v2` whose `fd` is the
    // open `src_fd`, alive until after the call.
    unsafe { ioctl_ptr(&dir, IOC_SNAP_CREATE_V2, &mut *args as *mut VolArgsV2) }?;
    Ok(())
}

/// Deletes the subvolume `<dir>/<name>` (`BTRFS_IOC_SNAP_DESTROY_V2`); works on
/// read-only snapshots when the caller has `CAP_SYS_ADMIN`.
pub fn destroy_subvolume(dir: &Path, name: &str) -> io::Result<()> {
    let dir = open_dir(dir)?;
    let mut args = vol_args(name)?;
    // SAFETY: `args` is a boxed `btrfs_ioctl_vol_args_v2` naming a child of
    // `dir` (flags 0: name-based lookup), alive for the call.
    unsafe { ioctl_ptr(&dir, IOC_SNAP_DESTROY_V2, &mut *args as *mut VolArgsV2) }?;
    Ok(())
}

/// Reads the subvolume facts for the subvolume containing `path`.
pub fn subvolume_info(path: &Path) -> io::Result<SubvolInfo> {
    let fd = open_dir(path)?;
    // SAFETY: `GetSubvolInfoArgs` is plain old data (integers and byte
    // arrays), for which all-zero is a valid value.
    let mut args: Box<GetSubvolInfoArgs> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `args` is a boxed `btrfs_ioctl_get_subvol_info_args` (504
    // bytes, layout asserted above) that the kernel fills in.
    unsafe { ioctl_ptr(&fd, IOC_GET_SUBVOL_INFO, &mut *args as *mut GetSubvolInfoArgs) }?;
    // Root item flag BTRFS_ROOT_SUBVOL_RDONLY is bit 0.
    let readonly = args.flags & 1 != 0;
    let otime = UNIX_EPOCH + Duration::new(args.otime.sec, args.otime.nsec.min(999_999_999));
    Ok(SubvolInfo {
        id: args.treeid,
        parent_id: args.parent_id,
        generation: args.generation,
        otransid: args.otransid,
        ctransid: args.ctransid,
        flags: args.flags,
        readonly,
        otime,
    })
}

fn get_flags(fd: &OwnedFd) -> io::Result<u64> {
    let mut flags: u64 = 0;
    // SAFETY: SUBVOL_GETFLAGS writes one u64 into `flags`, which lives on the
    // stack for the whole call.
    unsafe { ioctl_ptr(fd, IOC_SUBVOL_GETFLAGS, &mut flags as *mut u64) }?;
    Ok(flags)
}

/// Whether the subvolume whose root is `path` is read-only.
pub fn is_readonly(path: &Path) -> io::Result<bool> {
    let fd = open_dir(path)?;
    Ok(get_flags(&fd)? & BTRFS_SUBVOL_RDONLY != 0)
}

/// Sets or clears the read-only flag of the subvolume whose root is `path`.
pub fn set_readonly(path: &Path, readonly: bool) -> io::Result<()> {
    let fd = open_dir(path)?;
    let old = get_flags(&fd)?;
    let mut new = if readonly { old | BTRFS_SUBVOL_RDONLY } else { old & !BTRFS_SUBVOL_RDONLY };
    if new == old {
        return Ok(());
    }
    // SAFETY: SUBVOL_SETFLAGS reads one u64 from `new`, alive for the call.
    unsafe { ioctl_ptr(&fd, IOC_SUBVOL_SETFLAGS, &mut new as *mut u64) }?;
    Ok(())
}

/// `statfs(2)` filesystem magic of the filesystem holding `path`.
pub fn fs_magic(path: &Path) -> io::Result<i64> {
    let st = rustix::fs::statfs(path).map_err(io::Error::from)?;
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

/// Whether `path` is on btrfs.
pub fn is_btrfs(path: &Path) -> io::Result<bool> {
    Ok(fs_magic(path)? == BTRFS_SUPER_MAGIC)
}

/// Whether `path` is the root of a btrfs subvolume (inode 256 on btrfs).
/// Does not follow a final symlink.
pub fn is_subvolume(path: &Path) -> io::Result<bool> {
    let md = std::fs::symlink_metadata(path)?;
    if !md.is_dir() || md.ino() != BTRFS_FIRST_FREE_OBJECTID {
        return Ok(false);
    }
    is_btrfs(path)
}

/// `BTRFS_IOC_SYNC`: commits the transaction like `syncfs`, and wakes
/// btrfs's cleaner thread, which drops deleted subvolumes (otherwise it
/// runs at the next periodic commit, up to 30 s later).
pub fn sync_and_clean(path: &Path) -> io::Result<()> {
    let fd = open_dir(path)?;
    // SAFETY: `BTRFS_IOC_SYNC` takes no argument; the null pointer is not read.
    unsafe { ioctl_ptr(&fd, IOC_SYNC, std::ptr::null_mut::<u8>()) }?;
    Ok(())
}

/// Waits until the deleted subvolume `id` of the filesystem holding `path`
/// is gone: dropped by btrfs's cleaner, and that committed (the kernel
/// checks once a second; nothing commits sooner unless someone does, e.g.
/// [`sync_and_clean`]). `Ok(())` at once when no such subvolume exists;
/// `EEXIST` when it is not deleted; `ENOTTY` before Linux 6.8.
pub fn wait_for_deleted_subvolume(path: &Path, id: u64) -> io::Result<()> {
    let fd = open_dir(path)?;
    let mut args = SubvolWaitArgs { subvolid: id, mode: SUBVOL_SYNC_WAIT_FOR_ONE, count: 0 };
    // SAFETY: `args` is a live `btrfs_ioctl_subvol_wait` (16 bytes, checked
    // above) that the kernel reads and may write back.
    match unsafe { ioctl_ptr(&fd, IOC_SUBVOL_SYNC_WAIT, &mut args as *mut SubvolWaitArgs) } {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `syncfs(2)` on the filesystem holding `path` (commits the btrfs transaction).
pub fn syncfs(path: &Path) -> io::Result<()> {
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    rustix::fs::syncfs(&fd).map_err(io::Error::from)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Bytes a file extent item contributes if it is newer than `min_transid`.
///
/// `struct btrfs_file_extent_item` (packed, little-endian):
/// ```text
///  0 generation u64 | 8 ram_bytes u64 | 16 compression u8 | 17 encryption u8
/// 18 other_encoding u16 | 20 type u8 | 21 disk_bytenr u64 | 29 disk_num_bytes u64
/// 37 offset u64 | 45 num_bytes u64            (inline: data starts at 21)
/// ```
fn extent_item_bytes(item: &[u8], min_transid: u64) -> u64 {
    if item.len() < 21 {
        return 0;
    }
    let generation = le_u64(item, 0);
    if generation <= min_transid {
        return 0;
    }
    match item[20] {
        BTRFS_FILE_EXTENT_INLINE => le_u64(item, 8),
        BTRFS_FILE_EXTENT_REG | BTRFS_FILE_EXTENT_PREALLOC if item.len() >= 53 => {
            let disk_bytenr = le_u64(item, 21);
            if disk_bytenr == 0 {
                0 // hole
            } else {
                le_u64(item, 45)
            }
        }
        _ => 0,
    }
}

/// Sums the bytes of file extents written in the subvolume holding `path`
/// in transactions after `min_transid` (`BTRFS_IOC_TREE_SEARCH_V2` over the
/// subvolume's own tree with `min_transid` pruning, so the cost is
/// proportional to what changed, not to the subvolume size).
///
/// Regular and preallocated extents count `num_bytes` (holes, i.e.
/// `disk_bytenr == 0`, count nothing); inline extents count `ram_bytes`.
/// Overwritten ranges count again, so this is "bytes written", an upper
/// bound of the growth. Call [`syncfs`] first to include dirty page cache.
pub fn tree_search_extent_bytes(path: &Path, min_transid: u64) -> io::Result<u64> {
    let fd = open_dir(path)?;
    // u64 buffer keeps the header 8-aligned.
    let words = (size_of::<SearchArgsV2Header>() + SEARCH_BUF_SIZE) / 8;
    let mut buf = vec![0u64; words];
    let mut key = SearchKey {
        tree_id: 0, // the tree of the subvolume `fd` is in
        min_objectid: 0,
        max_objectid: u64::MAX,
        min_offset: 0,
        max_offset: u64::MAX,
        min_transid: min_transid.saturating_add(1),
        max_transid: u64::MAX,
        min_type: u32::from(BTRFS_EXTENT_DATA_KEY),
        max_type: u32::from(BTRFS_EXTENT_DATA_KEY),
        ..SearchKey::default()
    };
    let mut total: u64 = 0;
    loop {
        key.nr_items = u32::MAX;
        let hdr_ptr = buf.as_mut_ptr().cast::<SearchArgsV2Header>();
        // SAFETY: `buf` is 8-aligned and at least `size_of::<SearchArgsV2Header>()`
        // bytes long, so writing the header in place is in bounds and aligned.
        unsafe { hdr_ptr.write(SearchArgsV2Header { key, buf_size: SEARCH_BUF_SIZE as u64 }) };
        // SAFETY: the kernel reads the header and writes at most `buf_size`
        // bytes after it; `buf` holds header + SEARCH_BUF_SIZE bytes.
        unsafe { ioctl_ptr(&fd, IOC_TREE_SEARCH_V2, hdr_ptr) }?;
        // SAFETY: the header was initialised above and updated by the kernel.
        let out = unsafe { hdr_ptr.read() };
        let nr = out.key.nr_items;
        if nr == 0 {
            break;
        }
        // SAFETY: `buf` is a live Vec<u64>; viewing its bytes as u8 is valid
        // for any bit pattern and the length is its exact byte size.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) };
        let data = &bytes[size_of::<SearchArgsV2Header>()..];
        let mut pos = 0usize;
        let (mut last_obj, mut last_type, mut last_off) = (0u64, 0u32, 0u64);
        for _ in 0..nr {
            if pos + SEARCH_HEADER_LEN > data.len() {
                break;
            }
            let objectid = ne_u64(data, pos + 8);
            let offset = ne_u64(data, pos + 16);
            let typ = ne_u32(data, pos + 24);
            let len = ne_u32(data, pos + 28) as usize;
            let item_start = pos + SEARCH_HEADER_LEN;
            let item_end = (item_start + len).min(data.len());
            if typ == u32::from(BTRFS_EXTENT_DATA_KEY) {
                total = total.saturating_add(extent_item_bytes(&data[item_start..item_end], min_transid));
            }
            (last_obj, last_type, last_off) = (objectid, typ, offset);
            pos = item_start + len;
        }
        // Advance the compound key just past the last item returned.
        if last_off < u64::MAX {
            key.min_objectid = last_obj;
            key.min_type = last_type;
            key.min_offset = last_off + 1;
        } else if last_type < u32::from(u8::MAX) {
            key.min_objectid = last_obj;
            key.min_type = last_type + 1;
            key.min_offset = 0;
        } else if last_obj < u64::MAX {
            key.min_objectid = last_obj + 1;
            key.min_type = 0;
            key.min_offset = 0;
        } else {
            break;
        }
        // Keep the upper bound of the compound key at (MAX, 108, MAX).
        key.max_type = u32::from(BTRFS_EXTENT_DATA_KEY);
    }
    Ok(total)
}

// The search header (`struct btrfs_ioctl_search_header`) is filled in CPU
// byte order by the kernel, unlike the item bytes that follow it.
fn ne_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(a)
}

fn ne_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux_headers() {
        assert_eq!(IOC_SNAP_CREATE_V2, 0x5000_9417);
        assert_eq!(IOC_SUBVOL_CREATE_V2, 0x5000_9418);
        assert_eq!(IOC_SNAP_DESTROY_V2, 0x5000_943f);
        assert_eq!(IOC_GET_SUBVOL_INFO, 0x81f8_943c);
        assert_eq!(IOC_TREE_SEARCH_V2, 0xc070_9411);
        assert_eq!(IOC_SUBVOL_GETFLAGS, 0x8008_9419);
        assert_eq!(IOC_SUBVOL_SETFLAGS, 0x4008_941a);
    }

    #[test]
    fn subvolume_names_with_slashes_or_dots_are_rejected() {
        for bad in ["", ".", "..", "a/b", "x\0y"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("ok-name_1").is_ok());
    }

    #[test]
    fn extent_item_counts_regular_inline_and_skips_holes_and_old() {
        let mut reg = vec![0u8; 53];
        reg[0..8].copy_from_slice(&10u64.to_le_bytes());
        reg[20] = BTRFS_FILE_EXTENT_REG;
        reg[21..29].copy_from_slice(&4096u64.to_le_bytes());
        reg[45..53].copy_from_slice(&8192u64.to_le_bytes());
        assert_eq!(extent_item_bytes(&reg, 9), 8192);
        assert_eq!(extent_item_bytes(&reg, 10), 0, "generation not newer");
        let mut hole = reg.clone();
        hole[21..29].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(extent_item_bytes(&hole, 0), 0);
        let mut inline = vec![0u8; 21 + 5];
        inline[0..8].copy_from_slice(&10u64.to_le_bytes());
        inline[8..16].copy_from_slice(&5u64.to_le_bytes());
        inline[20] = BTRFS_FILE_EXTENT_INLINE;
        assert_eq!(extent_item_bytes(&inline, 0), 5);
    }

    #[test]
    fn non_btrfs_path_is_not_a_subvolume() {
        // /proc is never btrfs.
        assert!(!is_subvolume(Path::new("/proc")).unwrap());
    }
}
