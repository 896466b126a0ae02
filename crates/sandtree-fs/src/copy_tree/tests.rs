use std::fs::{self, File};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};

use super::*;

fn dir_fd(p: &Path) -> OwnedFd {
    File::open(p).unwrap().into()
}

#[test]
fn copies_contents_attributes_links_and_holes() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::create_dir(&dst).unwrap();
    // A sparse file: 4 KiB of data, a 1 MiB hole, 4 KiB of data, a hole up to 4 MiB.
    let sparse = File::create(src.join("sub/sparse")).unwrap();
    sparse.write_at(&[7u8; 4096], 0).unwrap();
    sparse.write_at(&[9u8; 4096], 1 << 20).unwrap();
    sparse.set_len(4 << 20).unwrap();
    fs::set_permissions(src.join("sub/sparse"), fs::Permissions::from_mode(0o645)).unwrap();
    std::os::unix::fs::chown(src.join("sub/sparse"), Some(1234), Some(5678)).unwrap();
    fs::hard_link(src.join("sub/sparse"), src.join("again")).unwrap();
    symlink("/etc/passwd", src.join("link")).unwrap();
    rustix::fs::mknodat(CWD_FD(), src.join("fifo"), FileType::Fifo, Mode::from_raw_mode(0o640), 0).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    let has_xattr = rustix::fs::setxattr(src.join("sub/sparse"), c"user.note", b"kept", XattrFlags::empty()).is_ok();
    let old = Timestamps {
        last_access: Timespec { tv_sec: 1_000_000, tv_nsec: 5 },
        last_modification: Timespec { tv_sec: 2_000_000, tv_nsec: 7 },
    };
    rustix::fs::utimensat(CWD_FD(), src.join("sub/sparse"), &old, AtFlags::empty()).unwrap();
    rustix::fs::utimensat(CWD_FD(), src.join("sub"), &old, AtFlags::empty()).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o1777)).unwrap();

    // (Asked first through the same descriptor, as `/dev/shm`'s save does.)
    let from = dir_fd(&src);
    assert!(!is_empty_dir(from.as_fd()).unwrap());
    let copied = copy_tree(from.as_fd(), dir_fd(&dst).as_fd(), &dst).unwrap();
    assert_eq!(copied.sockets, 1);
    assert_eq!(copied.bytes, 8192);
    assert_eq!(copied.entries, 5, "sub, sparse, again, link, fifo (sock left out)");

    let m = fs::symlink_metadata(dst.join("sub/sparse")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid(), m.len()), (0o645, 1234, 5678, 4 << 20));
    assert_eq!((m.atime(), m.atime_nsec(), m.mtime(), m.mtime_nsec()), (1_000_000, 5, 2_000_000, 7));
    assert!(m.blocks() * 512 < 1 << 20, "holes stay holes: {} blocks", m.blocks());
    let data = fs::read(dst.join("sub/sparse")).unwrap();
    assert!(data[..4096].iter().all(|b| *b == 7) && data[4096..1 << 20].iter().all(|b| *b == 0));
    assert!(data[1 << 20..(1 << 20) + 4096].iter().all(|b| *b == 9));
    assert_eq!(fs::metadata(dst.join("again")).unwrap().ino(), m.ino(), "one inode, two names");
    assert_eq!(fs::read_link(dst.join("link")).unwrap(), Path::new("/etc/passwd"));
    let fifo = fs::symlink_metadata(dst.join("fifo")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
    assert_eq!(fifo.mode() & 0o7777, 0o640);
    assert!(!dst.join("sock").exists());
    let sub = fs::metadata(dst.join("sub")).unwrap();
    assert_eq!((sub.mtime(), sub.mtime_nsec()), (2_000_000, 7), "a directory's times set after its contents");
    assert_eq!(fs::metadata(&dst).unwrap().mode() & 0o7777, 0o1777, "the root's mode");
    if has_xattr {
        let mut v = [0u8; 16];
        let n = rustix::fs::getxattr(dst.join("sub/sparse"), c"user.note", &mut v[..]).unwrap();
        assert_eq!(&v[..n], b"kept");
    }
}

#[test]
fn source_atimes_untouched_and_links_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    fs::create_dir(&src).unwrap();
    fs::create_dir(&dst).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    let old = Timestamps {
        last_access: Timespec { tv_sec: 1_000_000, tv_nsec: 0 },
        last_modification: Timespec { tv_sec: 1_000_000, tv_nsec: 0 },
    };
    rustix::fs::utimensat(CWD_FD(), src.join("f"), &old, AtFlags::empty()).unwrap();
    // A link out of the tree, named like a directory: copied as a link.
    symlink("/etc", src.join("d")).unwrap();
    copy_tree(dir_fd(&src).as_fd(), dir_fd(&dst).as_fd(), &dst).unwrap();
    assert_eq!(fs::metadata(src.join("f")).unwrap().atime(), 1_000_000, "read with O_NOATIME");
    assert!(fs::symlink_metadata(dst.join("d")).unwrap().file_type().is_symlink());
    assert!(is_empty_dir(dir_fd(&src).as_fd()).is_ok_and(|e| !e));
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert!(is_empty_dir(dir_fd(&empty).as_fd()).unwrap());
}

#[test]
fn open_dir_beneath_refuses_a_symlink() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("real")).unwrap();
    symlink("/etc", tmp.path().join("out")).unwrap();
    let root = dir_fd(tmp.path());
    assert!(open_dir_beneath(root.as_fd(), Path::new("real")).is_ok());
    assert!(open_dir_beneath(root.as_fd(), Path::new("out")).is_err());
}

#[allow(non_snake_case)]
fn CWD_FD() -> BorrowedFd<'static> {
    rustix::fs::CWD
}
