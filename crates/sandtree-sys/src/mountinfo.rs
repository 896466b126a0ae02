//! `/proc/self/mountinfo`: which filesystems are mounted where, in the
//! calling process's mount namespace. (No `unsafe` here; it lives in this
//! crate because it reads a kernel interface like the other modules.)
//!
//! Line format (proc(5)): `id parent major:minor root mount-point options
//! [optional fields...] - fstype source super-options`. Fields escape space,
//! tab, newline and backslash as `\NNN` octal.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount id (what `fdinfo`'s `mnt_id` refers to).
    pub id: i32,
    /// Device of its filesystem (`major:minor`).
    pub dev: (u32, u32),
    pub target: PathBuf,
    pub fstype: String,
    /// Filesystem options (`rw,upperdir=...`), still escaped.
    pub super_options: String,
}

impl MountEntry {
    /// Value of `key=value` among the filesystem options.
    pub fn option(&self, key: &str) -> Option<PathBuf> {
        self.super_options.split(',').find_map(|o| o.strip_prefix(key)?.strip_prefix('=')).map(unescape)
    }

    /// An overlay's lower layers, topmost first (`lowerdir=a:b` or
    /// repeated `lowerdir+=`).
    pub fn lower_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for o in self.super_options.split(',') {
            if let Some(v) = o.strip_prefix("lowerdir+=") {
                out.push(unescape(v));
            } else if let Some(v) = o.strip_prefix("lowerdir=") {
                out.extend(v.split(':').filter(|p| !p.is_empty()).map(unescape));
            }
        }
        out
    }

    /// Its device in the kernel's internal encoding (`major << 20 |
    /// minor`), as `fdinfo` prints it (`sdev:` of an inotify watch).
    pub fn kernel_dev(&self) -> u64 {
        ((self.dev.0 as u64) << 20) | self.dev.1 as u64
    }
}

/// Every mount, in mount order (the last one on a path is the visible one).
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse(&read_whole("/proc/self/mountinfo")?))
}

/// The mounts seen by process `pid` (its mount namespace and root).
pub fn mounts_of(pid: i32) -> io::Result<Vec<MountEntry>> {
    Ok(parse(&read_whole(&format!("/proc/{pid}/mountinfo"))?))
}

/// A `/proc` file read into a buffer with room for it
/// (`std::fs::read_to_string` has no size to go by there: it starts with
/// 32 bytes and doubles, nine reads for a sandbox's mount table, on a
/// rollback's path).
fn read_whole(path: &str) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(64 * 1024);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let id = pre.split(' ').next()?.parse().ok()?;
            let (major, minor) = pre.split(' ').nth(2)?.split_once(':')?;
            let dev = (major.parse().ok()?, minor.parse().ok()?);
            let target = pre.split(' ').nth(4)?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let super_options = post.nth(1).unwrap_or_default();
            Some(MountEntry {
                id,
                dev,
                target: unescape(target),
                fstype: fstype.to_string(),
                super_options: super_options.to_string(),
            })
        })
        .collect()
}

/// Whether `path` is a mount point (false when mountinfo cannot be read).
pub fn is_mount_point(path: &Path) -> bool {
    mounts().map(|m| m.iter().any(|e| e.target == path)).unwrap_or(false)
}

/// Decodes the `\NNN` octal escapes of a mountinfo field.
pub fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push(((b[i + 1] - b'0') << 6) | ((b[i + 2] - b'0') << 3) | (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
    }

    #[test]
    fn lines_parse_with_optional_fields() {
        let text = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - btrfs /dev/loop0 rw\n\
                    37 35 98:0 / /proc rw - proc proc rw\n";
        let m = parse(text);
        assert_eq!(
            m[0],
            MountEntry {
                id: 36,
                dev: (98, 0),
                target: "/mnt/a b".into(),
                fstype: "btrfs".into(),
                super_options: "rw".into()
            }
        );
        assert_eq!((m[1].id, m[1].fstype.as_str()), (37, "proc"));
    }

    #[test]
    fn overlay_options_are_found() {
        let text = r"40 1 0:50 / / rw - overlay overlay rw,lowerdir=/l,upperdir=/v/s\0541/upper,workdir=/w,volatile";
        let m = parse(text);
        assert_eq!(m[0].option("upperdir"), Some(PathBuf::from("/v/s,1/upper")));
        assert_eq!(m[0].option("workdir"), Some(PathBuf::from("/w")));
        assert_eq!(m[0].option("volatile"), None);
        assert_eq!(m[0].option("upper"), None);
        assert_eq!(m[0].lower_dirs(), vec![PathBuf::from("/l")]);
        assert_eq!(m[0].dev, (0, 50));
        let text = r"41 1 0:51 / / rw - overlay none rw,lowerdir+=/a\0542,lowerdir+=/b,upperdir=/u";
        assert_eq!(parse(text)[0].lower_dirs(), vec![PathBuf::from("/a,2"), PathBuf::from("/b")]);
    }

    #[test]
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")));
    }
}
