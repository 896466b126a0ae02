//! Squash a run of read-only overlay layers into one layer with the same
//! merged view.
//!
//! A layered sandbox stacks one read-only layer per checkpoint (see the
//! runtime's `layers.rs`); lookups of names that exist in no layer cost one
//! step per layer, and overlayfs stacks at most 500. This module turns a run
//! of layers (each a subvolume holding `layers/<i>/upper` per overlay) into
//! one subvolume that, stacked at the run's place over the same layers
//! below it (the image), shows exactly the same files.
//!
//! Method: a new empty subvolume, onto which each layer of the run, bottom
//! to top, is applied with overlayfs' rules for an upper layer over a lower
//! one. No snapshot: a btrfs snapshot is made inside a transaction commit,
//! which stalls every other writer of the volume (a sandbox's checkpoint
//! that creates its next subvolume meanwhile waited 40 ms). The cost is a
//! walk of the run's entries, with file data reflinked, so callers squash
//! runs of small layers:
//!
//! | entry in the layer applied         | result in the copy                                   |
//! |------------------------------------|------------------------------------------------------|
//! | whiteout (char device 0:0)         | whatever was there removed; the whiteout kept where its directory exists below the run, else dropped |
//! | opaque dir (`trusted.overlay.opaque=y`) | whatever was there replaced by the directory, still opaque |
//! | dir over a dir                     | metadata taken, entries applied recursively          |
//! | dir over a whiteout or a non-dir   | replaced by the directory, made opaque (the image's dir must stay hidden) |
//! | dir over nothing                   | copied as it is (it merges with the image below)     |
//! | any other file                     | replaced by a copy: regular files over 256 KiB are reflinked (`FICLONE`, no data copied), hard links within the layer stay links |
//!
//! Regular files are copied with their mode, owner, times and extended
//! attributes; overlayfs' own `trusted.overlay.*` attributes are dropped
//! except `opaque` (origin handles and "impure" marks only mean something
//! in an upper layer). A layer holding a redirected directory
//! (`trusted.overlay.redirect`: a directory renamed over a lower layer) is
//! refused (its lower contents come from another path, which this module
//! does not follow): the caller squashes a run above it instead
//! ([`scan`] tells).
//!
//! The run may sit anywhere in a stack: `below` names the directories under
//! it. A whiteout is dropped where its directory exists in none of them
//! (nothing below it to hide, and overlayfs lists a directory found in one
//! layer only as it is, whiteouts included).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, Timespec, Timestamps};

use crate::{Error, Result};

const OPAQUE: &str = "trusted.overlay.opaque";
const REDIRECT: &str = "trusted.overlay.redirect";
const OVERLAY_PREFIX: &[u8] = b"trusted.overlay.";

/// Files up to this size are copied, larger ones reflinked.
const SMALL_FILE: u64 = 256 << 10;

/// Overlay attributes a squashed layer keeps.
fn kept(name: &[u8]) -> bool {
    !name.starts_with(OVERLAY_PREFIX) || name == OPAQUE.as_bytes()
}

/// Squashes `run` (layer subvolumes, top first, each with `layers/<i>/upper`
/// for each overlay `i`) into the new subvolume `dst`. `below[i]` are the
/// lower directories of overlay `i` under the run, top first; when one of
/// them may redirect a directory elsewhere (an overlay redirect under the
/// run), `below` cannot tell what a whiteout hides: `Below::Unknown` keeps
/// every whiteout.
pub fn squash(run: &[PathBuf], below: &Below, dst: &Path) -> Result<()> {
    let (below, keep_all) = match below {
        Below::Dirs(dirs) => (dirs.clone(), false),
        Below::Unknown(overlays) => (vec![Vec::new(); *overlays], true),
    };
    if run.is_empty() {
        return Err(Error::io("squash", dst, io::Error::other("no layers to squash")));
    }
    if let Some(layer) = run.iter().find(|l| scan(l).redirect) {
        return Err(Error::io(
            "squash (a renamed lower directory, an overlay redirect, is not squashed)",
            layer,
            io::Error::other("overlay redirect"),
        ));
    }
    let t0 = std::time::Instant::now();
    crate::create_subvolume(dst)?;
    let created = t0.elapsed();
    let applied = (|| {
        for layer in run.iter().rev() {
            for (i, below) in below.iter().enumerate() {
                let (src, to) = (upper_of(layer, i), upper_of(dst, i));
                if !src.exists() {
                    continue;
                }
                if !to.exists() {
                    fs::create_dir_all(&to).map_err(|e| Error::io("create", &to, e))?;
                }
                let mut links = HashMap::new();
                let mut at = Applying { below, keep_all, rel: PathBuf::new(), links: &mut links };
                at.dir(&src, &to).map_err(|(path, e)| Error::io("squash", &path, e))?;
                // The root's metadata too: the topmost layer's wins.
                let meta = fs::symlink_metadata(&src).map_err(|e| Error::io("stat", &src, e))?;
                copy_meta(&src, &to, &meta).map_err(|(path, e)| Error::io("squash", &path, e))?;
            }
        }
        Ok(())
    })();
    if applied.is_err() {
        let _ = crate::delete_subvolume(dst);
    }
    tracing::debug!(layers = run.len(), ?created, total = ?t0.elapsed(), "squashed");
    applied
}

/// What [`scan`] finds in a layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerScan {
    /// Entries (files, directories, whiteouts) in all its overlay uppers.
    pub entries: u64,
    /// Whether one holds a redirected directory (it cannot be squashed).
    pub redirect: bool,
}

/// Counts a layer subvolume's entries and looks for redirects (an
/// unreadable layer counts as holding one: it is not squashed).
pub fn scan(layer: &Path) -> LayerScan {
    fn walk(dir: &Path, scan: &mut LayerScan) -> io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            scan.entries += 1;
            if entry.file_type()?.is_dir() {
                let path = entry.path();
                if xattr(&path, REDIRECT)?.is_some() {
                    scan.redirect = true;
                    return Ok(());
                }
                walk(&path, scan)?;
                if scan.redirect {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
    let mut scan = LayerScan::default();
    let Ok(entries) = fs::read_dir(layer.join("layers")) else { return scan };
    for e in entries.flatten() {
        let upper = e.path().join("upper");
        if upper.exists() && walk(&upper, &mut scan).is_err() {
            scan.redirect = true;
        }
        if scan.redirect {
            break;
        }
    }
    scan
}

fn upper_of(layer: &Path, i: usize) -> PathBuf {
    layer.join("layers").join(i.to_string()).join("upper")
}

type Failed = (PathBuf, io::Error);

fn at(path: &Path) -> impl FnOnce(io::Error) -> Failed + '_ {
    move |e| (path.to_path_buf(), e)
}

fn rx(path: &Path) -> impl FnOnce(rustix::io::Errno) -> Failed + '_ {
    move |e| (path.to_path_buf(), e.into())
}

/// What lies under a squashed run, per overlay.
#[derive(Clone, Debug)]
pub enum Below {
    /// These directories, top first.
    Dirs(Vec<Vec<PathBuf>>),
    /// Not known exactly (a redirect under the run), for this many overlays.
    Unknown(usize),
}

/// One upper directory being applied onto the copy.
struct Applying<'a> {
    /// The lower directories under the run.
    below: &'a [PathBuf],
    /// Keep every whiteout (what lies below is not known exactly).
    keep_all: bool,
    /// Where the walk is, relative to the layer's root.
    rel: PathBuf,
    /// Source inodes copied so far, to their copies (hard links).
    links: &'a mut HashMap<u64, PathBuf>,
}

impl Applying<'_> {
    /// Applies the upper directory `src` onto `dst` (see the module docs).
    fn dir(&mut self, src: &Path, dst: &Path) -> std::result::Result<(), Failed> {
        for entry in fs::read_dir(src).map_err(at(src))? {
            let entry = entry.map_err(at(src))?;
            let (s, d) = (entry.path(), dst.join(entry.file_name()));
            let meta = fs::symlink_metadata(&s).map_err(at(&s))?;
            let below = fs::symlink_metadata(&d).ok();
            let rel = self.rel.join(entry.file_name());
            if is_whiteout(&meta) {
                remove_all(&d)?;
                if self.keep_all
                    || self.below.iter().any(|b| fs::symlink_metadata(b.join(&self.rel)).is_ok_and(|m| m.is_dir()))
                {
                    copy_node(&s, &d, &meta, self.links)?;
                }
            } else if meta.is_dir() {
                let opaque = xattr(&s, OPAQUE).map_err(at(&s))?.is_some_and(|v| v == b"y");
                match below {
                    Some(b) if b.is_dir() && !opaque => {
                        // Entries first: they change the directory's times.
                        let outer = std::mem::replace(&mut self.rel, rel);
                        let applied = self.dir(&s, &d);
                        self.rel = outer;
                        applied?;
                        copy_meta(&s, &d, &meta)?;
                    }
                    _ => {
                        // Over a whiteout or a non-directory, the image's
                        // directory was hidden: it must stay hidden.
                        let hid = below.is_some();
                        remove_all(&d)?;
                        copy_tree(&s, &d, self.links)?;
                        if hid && !opaque {
                            rustix::fs::lsetxattr(&d, OPAQUE, b"y", rustix::fs::XattrFlags::empty()).map_err(rx(&d))?;
                        }
                    }
                }
            } else {
                remove_all(&d)?;
                copy_node(&s, &d, &meta, self.links)?;
            }
        }
        Ok(())
    }
}

fn is_whiteout(meta: &fs::Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

fn remove_all(path: &Path) -> std::result::Result<(), Failed> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err((path.to_path_buf(), e)),
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(at(path)),
        Ok(_) => fs::remove_file(path).map_err(at(path)),
    }
}

/// Copies the directory tree `src` to the new path `dst`.
fn copy_tree(src: &Path, dst: &Path, links: &mut HashMap<u64, PathBuf>) -> std::result::Result<(), Failed> {
    let meta = fs::symlink_metadata(src).map_err(at(src))?;
    fs::create_dir(dst).map_err(at(dst))?;
    for entry in fs::read_dir(src).map_err(at(src))? {
        let entry = entry.map_err(at(src))?;
        let (s, d) = (entry.path(), dst.join(entry.file_name()));
        let m = fs::symlink_metadata(&s).map_err(at(&s))?;
        if m.is_dir() {
            copy_tree(&s, &d, links)?;
        } else {
            copy_node(&s, &d, &m, links)?;
        }
    }
    copy_meta(src, dst, &meta)
}

/// Copies one non-directory (a hard link to an inode copied before).
fn copy_node(
    src: &Path,
    dst: &Path,
    meta: &fs::Metadata,
    links: &mut HashMap<u64, PathBuf>,
) -> std::result::Result<(), Failed> {
    if meta.nlink() > 1
        && let Some(first) = links.get(&meta.ino())
    {
        return fs::hard_link(first, dst).map_err(at(dst));
    }
    let ft = meta.file_type();
    if ft.is_file() {
        let mut from = fs::File::open(src).map_err(at(src))?;
        let mut to = fs::OpenOptions::new().write(true).create_new(true).open(dst).map_err(at(dst))?;
        if meta.len() <= SMALL_FILE {
            // A reflink first writes the source's dirty pages out (the
            // layers were just written): copying a small file from the
            // page cache is cheaper.
            io::copy(&mut from, &mut to).map_err(at(dst))?;
        } else {
            rustix::fs::ioctl_ficlone(&to, &from).map_err(rx(dst))?;
        }
    } else if ft.is_symlink() {
        let target = fs::read_link(src).map_err(at(src))?;
        std::os::unix::fs::symlink(&target, dst).map_err(at(dst))?;
    } else {
        let kind = FileType::from_raw_mode(meta.mode());
        rustix::fs::mknodat(CWD, dst, kind, Mode::from_raw_mode(meta.mode() & 0o7777), meta.rdev()).map_err(rx(dst))?;
    }
    if meta.nlink() > 1 {
        links.insert(meta.ino(), dst.to_path_buf());
    }
    copy_meta(src, dst, meta)
}

/// Owner, mode, extended attributes (but overlayfs' own, except `opaque`)
/// and times of `src` onto `dst`.
fn copy_meta(src: &Path, dst: &Path, meta: &fs::Metadata) -> std::result::Result<(), Failed> {
    let symlink = meta.file_type().is_symlink();
    rustix::fs::chownat(
        CWD,
        dst,
        Some(rustix::fs::Uid::from_raw(meta.uid())),
        Some(rustix::fs::Gid::from_raw(meta.gid())),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(rx(dst))?;
    if !symlink {
        rustix::fs::chmodat(CWD, dst, Mode::from_raw_mode(meta.mode() & 0o7777), AtFlags::empty()).map_err(rx(dst))?;
    }
    // Attributes the destination carries from below go when the source
    // lacks them (or they are overlayfs' own), but `opaque`: a directory
    // merged over an opaque one hides what is under the run as that one did.
    let from = list_xattrs(src).map_err(at(src))?;
    for name in list_xattrs(dst).map_err(at(dst))? {
        // (A directory merged over an opaque one stays opaque.)
        if name.as_bytes() != OPAQUE.as_bytes() && (!kept(name.as_bytes()) || !from.contains(&name)) {
            let _ = rustix::fs::lremovexattr(dst, name.as_os_str());
        }
    }
    for name in from {
        if !kept(name.as_bytes()) {
            continue;
        }
        if let Some(value) = xattr(src, &name).map_err(at(src))? {
            rustix::fs::lsetxattr(dst, name.as_os_str(), &value, rustix::fs::XattrFlags::empty()).map_err(rx(dst))?;
        }
    }
    let ts = |s: i64, ns: i64| Timespec { tv_sec: s, tv_nsec: ns as _ };
    let times = Timestamps {
        last_access: ts(meta.atime(), meta.atime_nsec()),
        last_modification: ts(meta.mtime(), meta.mtime_nsec()),
    };
    rustix::fs::utimensat(CWD, dst, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(rx(dst))
}

fn list_xattrs(path: &Path) -> io::Result<Vec<OsString>> {
    let mut buf = vec![0u8; 1024];
    loop {
        match rustix::fs::llistxattr(path, &mut buf) {
            Ok(n) => {
                return Ok(buf[..n]
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| OsStr::from_bytes(s).to_os_string())
                    .collect());
            }
            Err(rustix::io::Errno::RANGE) => buf.resize(buf.len() * 4, 0),
            Err(e) => return Err(e.into()),
        }
    }
}

/// One extended attribute of `path` (not following a symlink), if set.
fn xattr(path: &Path, name: impl AsRef<OsStr>) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; 256];
    loop {
        match rustix::fs::lgetxattr(path, name.as_ref(), &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Err(rustix::io::Errno::NODATA) => return Ok(None),
            Err(rustix::io::Errno::RANGE) => buf.resize(buf.len() * 16, 0),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TestVolume;
    use std::collections::BTreeMap;
    use std::process::Command;

    fn sh(dir: &Path, script: &str) {
        let out = Command::new("sh").arg("-ec").arg(script).current_dir(dir).output().unwrap();
        assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn mount_overlay(lowers: &[PathBuf], upper: Option<&Path>, at: &Path) {
        fs::create_dir_all(at).unwrap();
        let lowerdir: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
        let mut opts = format!("lowerdir={},redirect_dir=off,index=off,xino=off", lowerdir.join(":"));
        if let Some(u) = upper {
            let work = u.parent().unwrap().join("work");
            fs::create_dir_all(&work).unwrap();
            opts.push_str(&format!(",upperdir={},workdir={}", u.display(), work.display()));
        }
        let st = Command::new("mount").args(["-t", "overlay", "overlay", "-o", &opts]).arg(at).status().unwrap();
        assert!(st.success(), "mount {opts}");
    }

    fn umount(at: &Path) {
        assert!(Command::new("umount").arg(at).status().unwrap().success());
    }

    /// Everything observable of a tree: type, mode, owner, size, mtime of
    /// non-directories, contents, link targets, user xattrs, link groups.
    fn view(root: &Path) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut inodes: HashMap<u64, String> = HashMap::new();
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>, inodes: &mut HashMap<u64, String>) {
            let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
            entries.sort();
            for p in entries {
                let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                let mut desc = format!("{:o} {}:{}", m.mode(), m.uid(), m.gid());
                let ft = m.file_type();
                if ft.is_file() {
                    desc += &format!(" {} {}.{} {:?}", m.len(), m.mtime(), m.mtime_nsec(), fs::read(&p).unwrap());
                    if m.nlink() > 1 {
                        let first = inodes.entry(m.ino()).or_insert_with(|| rel.clone());
                        desc += &format!(" link-of {first}");
                    }
                } else if ft.is_symlink() {
                    desc += &format!(" -> {}", fs::read_link(&p).unwrap().display());
                }
                for name in list_xattrs(&p).unwrap() {
                    if name.as_bytes().starts_with(b"user.") {
                        desc += &format!(" {name:?}={:?}", xattr(&p, &name).unwrap());
                    }
                }
                out.insert(rel, desc);
                if ft.is_dir() {
                    walk(root, &p, out, inodes);
                }
            }
        }
        walk(root, root, &mut out, &mut inodes);
        out
    }

    #[test]
    fn squashed_run_shows_the_same_tree() {
        let Some(tv) = TestVolume::new(1 << 30) else { return };
        let root = tv.root().to_path_buf();
        let img = root.join("img");
        fs::create_dir_all(&img).unwrap();
        sh(
            &img,
            "echo a > a; echo b > b; mkdir -p d1 d2 d3 keep; echo x > d1/x; echo y > d1/y; echo z > d2/z; \
             echo w > d3/w; echo k > keep/k; ln -s a sym",
        );
        let mnt = root.join("mnt");
        let steps = [
            // whiteouts, an opaque directory, hard links, xattrs, a fifo
            "echo A >> a; rm b; rm -r d2; mkdir d2; echo new > d2/n; echo c > c; ln c c2; \
             chmod 600 keep/k; ln -s nowhere dangling; mkfifo fifo; mkdir e; \
             echo e > e/f; touch -d 2020-01-01 a",
            // copy-up of a layer-1 file, a whiteout in a merged dir, a file over a whiteout
            "echo C >> c; rm d1/x; rm -r d3; echo file > d3; mkdir -p e/g/h; echo deep > e/g/h/i",
            // a whiteout over a lower layer's file, a dir over a file, a removed-and-remade merged dir
            "rm c2; rm d3; mkdir d3; echo again > d3/q; rm -r d1; mkdir d1; echo only > d1/only; rm e/f",
            // a big file, a mode change of an image file, a hard link pair made here
            "head -c 3000000 /dev/urandom > big; chmod 700 keep; ln big big2; rm -r e/g/h; echo top > e/g/t",
        ];
        let mut layers: Vec<PathBuf> = Vec::new(); // bottom first here
        for (i, step) in steps.iter().enumerate() {
            let layer = root.join(format!("l{i}"));
            crate::create_subvolume(&layer).unwrap();
            let upper = upper_of(&layer, 0);
            fs::create_dir_all(&upper).unwrap();
            let mut lowers: Vec<PathBuf> = layers.iter().rev().map(|l| upper_of(l, 0)).collect();
            lowers.push(img.clone());
            mount_overlay(&lowers, Some(&upper), &mnt);
            sh(&mnt, step);
            let (file, value): (&str, &[u8]) = if i == 0 { ("keep/k", b"one") } else { ("c", b"two") };
            if mnt.join(file).exists() {
                rustix::fs::lsetxattr(mnt.join(file), "user.t", value, rustix::fs::XattrFlags::empty()).unwrap();
            }
            // An attribute of a merged directory, set in one layer and
            // removed in the next.
            match i {
                0 => rustix::fs::lsetxattr(mnt.join("keep"), "user.d", b"x", rustix::fs::XattrFlags::empty()).unwrap(),
                1 => rustix::fs::lremovexattr(mnt.join("keep"), "user.d").unwrap(),
                _ => {}
            }
            umount(&mnt);
            layers.push(layer);
        }
        let run: Vec<PathBuf> = layers.iter().rev().cloned().collect();
        let squashed = root.join("sq");
        squash(&run, &Below::Dirs(vec![vec![img.clone()]]), &squashed).unwrap();

        let mut lowers: Vec<PathBuf> = run.iter().map(|l| upper_of(l, 0)).collect();
        lowers.push(img.clone());
        mount_overlay(&lowers, None, &mnt);
        let want = view(&mnt);
        umount(&mnt);
        mount_overlay(&[upper_of(&squashed, 0), img.clone()], None, &mnt);
        let got = view(&mnt);
        umount(&mnt);
        for (k, v) in &want {
            assert_eq!(got.get(k), Some(v), "{k}");
        }
        for k in got.keys() {
            assert!(want.contains_key(k), "{k} only in the squashed layer");
        }
        assert!(want.contains_key("d1/only") && !want.contains_key("d1/y") && !want.contains_key("c2"));

        // A run above the bottom layer, whose directory `e` (made in the
        // bottom layer, absent from the image) holds a whiteout of the run:
        // what lies below includes the bottom layer.
        let above = &run[..run.len() - 1];
        let squashed = root.join("sq-above");
        let below = Below::Dirs(vec![vec![upper_of(&layers[0], 0), img.clone()]]);
        squash(above, &below, &squashed).unwrap();
        mount_overlay(&[upper_of(&squashed, 0), upper_of(&layers[0], 0), img.clone()], None, &mnt);
        let got = view(&mnt);
        umount(&mnt);
        assert_eq!(got, want);
        assert!(!want.contains_key("e/f"));

        // A renamed lower directory (a redirect) is refused, and nothing is left.
        let layer = root.join("lr");
        crate::create_subvolume(&layer).unwrap();
        let upper = upper_of(&layer, 0);
        fs::create_dir_all(&upper).unwrap();
        fs::create_dir(upper.join("moved")).unwrap();
        rustix::fs::lsetxattr(upper.join("moved"), REDIRECT, b"/keep", rustix::fs::XattrFlags::empty()).unwrap();
        assert!(scan(&layer).redirect && !scan(&run[0]).redirect);
        // Every name in the layer counts, whiteouts included.
        let listed = Command::new("find").arg(upper_of(&run[0], 0)).arg("-mindepth").arg("1").output().unwrap().stdout;
        assert_eq!(scan(&run[0]).entries, listed.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count() as u64);
        let err = squash(&[layer, run[0].clone()], &Below::Unknown(1), &root.join("sq2")).unwrap_err();
        assert!(err.to_string().contains("redirect"), "{err}");
        assert!(!root.join("sq2").exists());
    }
}
