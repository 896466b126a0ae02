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
    pub target: PathBuf,
    pub fstype: String,
}

/// Every mount, in mount order (the last one on a path is the visible one).
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse(&text))
}

fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let target = pre.split(' ').nth(4)?;
            let fstype = post.split(' ').next()?;
            Some(MountEntry { target: unescape(target), fstype: fstype.to_string() })
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
        assert_eq!(m[0], MountEntry { target: "/mnt/a b".into(), fstype: "btrfs".into() });
        assert_eq!(m[1].fstype, "proc");
    }

    #[test]
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")));
    }
}
