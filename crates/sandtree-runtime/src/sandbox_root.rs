//! A sandbox's root as the daemon reaches it: paths resolved inside the
//! sandbox, never out of it, for the files API ([`crate::sandbox_files`]).
//!
//! The root is `/proc/<init>/root`, the `/` of the sandbox's init in its
//! own mount namespace: the overlay of its layers and every mount made in
//! it. Each path is opened with `openat2(RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS)` from that root, so `..`, absolute symlinks and
//! `/proc/self/...` links stay in the sandbox (a symlink to `/etc` is the
//! sandbox's `/etc`, never the host's).
//!
//! Owners: the sandbox's uid and gid `n` are the host's `uid_base + n`
//! (`uid_range.rs`). Files made here are given the owner the request names,
//! in host numbers; a host id outside the range shows as 65534, as the
//! sandbox sees it.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sandtree_api::{FileInfo, FileKind};
use sandtree_sandbox::users::Account;

use crate::util;

/// The id a host id outside the sandbox's range shows as.
const OVERFLOW_ID: u32 = 65534;

/// How large `/etc/passwd` and `/etc/group` may be to be read for a user.
const ACCOUNTS_MAX_BYTES: u64 = 4 << 20;

/// The open root of a running sandbox.
pub(crate) struct SandboxRoot {
    root: OwnedFd,
    uid_base: u32,
    /// The names of the sandbox's users and groups by id (its
    /// `/etc/passwd` and `/etc/group`), read at the first file described.
    names: std::sync::OnceLock<Names>,
}

/// Users' and groups' names by id.
#[derive(Default)]
struct Names {
    users: std::collections::HashMap<u32, String>,
    groups: std::collections::HashMap<u32, String>,
}

impl Names {
    /// From `passwd` and `group` (`name:x:id:...` lines; the first name
    /// of an id wins).
    fn parse(passwd: &str, group: &str) -> Names {
        let by_id = |text: &str| {
            let mut out = std::collections::HashMap::new();
            for line in text.lines() {
                let mut f = line.split(':');
                if let (Some(name), Some(_), Some(Ok(id))) = (f.next(), f.next(), f.next().map(str::parse::<u32>)) {
                    out.entry(id).or_insert_with(|| name.to_string());
                }
            }
            out
        };
        Names { users: by_id(passwd), groups: by_id(group) }
    }
}

/// A path of the sandbox, cleaned: absolute, without `.`, `..` or empty
/// components (`..` is taken lexically; the kernel resolves the rest in
/// the root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SandboxPath(String);

impl SandboxPath {
    /// `path` as the sandbox names it: absolute, or relative to `home`.
    pub(crate) fn parse(path: &str, home: &str) -> Result<SandboxPath, String> {
        if path.is_empty() {
            return Err("the path is empty: give an absolute path, or one relative to the user's home".into());
        }
        if path.contains('\0') {
            return Err(format!("path {path:?} contains a NUL byte"));
        }
        let joined = if path.starts_with('/') { path.to_string() } else { format!("{home}/{path}") };
        let mut parts: Vec<&str> = Vec::new();
        for c in Path::new(&joined).components() {
            match c {
                Component::Normal(s) => parts.push(s.to_str().unwrap_or_default()),
                Component::ParentDir => {
                    parts.pop();
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        Ok(SandboxPath(format!("/{}", parts.join("/"))))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The parent directory and the last component (`None` for `/`).
    pub(crate) fn split(&self) -> Option<(SandboxPath, &str)> {
        if self.is_root() {
            return None;
        }
        let (dir, name) = self.0.rsplit_once('/').expect("absolute");
        Some((SandboxPath(if dir.is_empty() { "/".into() } else { dir.to_string() }), name))
    }

    pub(crate) fn join(&self, name: &str) -> SandboxPath {
        if self.is_root() { SandboxPath(format!("/{name}")) } else { SandboxPath(format!("{}/{name}", self.0)) }
    }

    /// The last component (`/` for the root).
    pub(crate) fn name(&self) -> &str {
        self.split().map_or("/", |(_, n)| n)
    }

    /// The ancestors from `/` down, the path itself included.
    pub(crate) fn prefixes(&self) -> Vec<SandboxPath> {
        let mut out = vec![SandboxPath("/".into())];
        let mut cur = SandboxPath("/".into());
        for part in self.0.split('/').filter(|p| !p.is_empty()) {
            cur = cur.join(part);
            out.push(cur.clone());
        }
        out
    }
}

impl SandboxRoot {
    /// The root of the sandbox whose init has host pid `init`.
    pub(crate) fn open(init: i32, uid_base: u32) -> std::io::Result<SandboxRoot> {
        let root = rustix::fs::open(
            format!("/proc/{init}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(SandboxRoot { root, uid_base, names: std::sync::OnceLock::new() })
    }

    /// Opens `path` in the sandbox (symlinks followed, inside it).
    pub(crate) fn open_path(&self, path: &SandboxPath, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            &self.root,
            path.as_str(),
            flags | OFlags::CLOEXEC,
            mode,
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// The directory `path`, for `*at` calls on its entries.
    pub(crate) fn open_dir(&self, path: &SandboxPath) -> Result<OwnedFd, Errno> {
        self.open_path(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
    }

    /// The host ids of the sandbox's `uid` and `gid`.
    pub(crate) fn host_ids(&self, uid: u32, gid: u32) -> (rustix::fs::Uid, rustix::fs::Gid) {
        (rustix::fs::Uid::from_raw(self.uid_base + uid), rustix::fs::Gid::from_raw(self.uid_base + gid))
    }

    fn sandbox_id(&self, host: u32) -> u32 {
        match host.checked_sub(self.uid_base) {
            Some(n) if n < 65536 => n,
            _ => OVERFLOW_ID,
        }
    }

    /// The account `user` (default root) in the sandbox's `/etc/passwd`
    /// and `/etc/group`.
    pub(crate) fn account(&self, user: Option<&str>) -> Result<Account, String> {
        match user {
            None => Ok(Account { name: "root".into(), uid: 0, gid: 0, groups: Vec::new(), home: "/root".into() }),
            Some(u) => {
                sandtree_sandbox::users::find(u, &self.read_accounts("/etc/passwd"), &self.read_accounts("/etc/group"))
            }
        }
    }

    /// The sandbox's `/etc/passwd` or `/etc/group` (empty when unreadable).
    fn read_accounts(&self, p: &str) -> String {
        let Ok(fd) = self.open_path(&SandboxPath(p.into()), OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()) else {
            return String::new();
        };
        use std::io::Read;
        let mut text = String::new();
        let _ = std::fs::File::from(fd).take(ACCOUNTS_MAX_BYTES).read_to_string(&mut text);
        text
    }

    /// `lstat` of `path`: a symlink is described, not followed.
    pub(crate) fn stat(&self, path: &SandboxPath) -> Result<FileInfo, Errno> {
        match path.split() {
            None => self.stat_fd(&self.root, path),
            Some((dir, name)) => {
                let dir = self.open_dir(&dir)?;
                self.stat_at(&dir, name, path)
            }
        }
    }

    /// `lstat` of entry `name` of the open directory `dir`, whose path is `path`.
    pub(crate) fn stat_at<P: rustix::path::Arg + Copy>(
        &self,
        dir: impl AsFd,
        name: P,
        path: &SandboxPath,
    ) -> Result<FileInfo, Errno> {
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        let mut info = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            let target = rustix::fs::readlinkat(&dir, name, Vec::new()).ok();
            self.info(path, &st, target.map(|t| t.to_string_lossy().into_owned()))
        } else {
            self.info(path, &st, None)
        };
        if has_metadata(&info) {
            // (`name` is one name, never `..`: the path stays in `dir`. As
            // bytes: a name need not be UTF-8.)
            let mut at = format!("/proc/self/fd/{}/", dir.as_fd().as_raw_fd()).into_bytes();
            at.extend_from_slice(name.into_c_str()?.to_bytes());
            info.metadata = read_metadata(at.as_slice())?;
        }
        Ok(info)
    }

    /// The description of an open file (which may be an `O_PATH` one).
    pub(crate) fn stat_fd(&self, fd: impl AsFd, path: &SandboxPath) -> Result<FileInfo, Errno> {
        let mut info = self.info(path, &rustix::fs::fstat(&fd)?, None);
        if has_metadata(&info) {
            info.metadata = read_metadata(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()).as_str())?;
        }
        Ok(info)
    }

    fn info(&self, path: &SandboxPath, st: &rustix::fs::Stat, symlink_target: Option<String>) -> FileInfo {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            _ => FileKind::Other,
        };
        let modified = std::time::UNIX_EPOCH
            + std::time::Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec.clamp(0, 999_999_999) as u32);
        let names = self
            .names
            .get_or_init(|| Names::parse(&self.read_accounts("/etc/passwd"), &self.read_accounts("/etc/group")));
        let (uid, gid) = (self.sandbox_id(st.st_uid), self.sandbox_id(st.st_gid));
        FileInfo {
            path: path.as_str().to_string(),
            name: path.name().to_string(),
            kind,
            size: st.st_size.max(0) as u64,
            mode: format!("{:o}", st.st_mode & 0o7777),
            uid,
            gid,
            owner: names.users.get(&uid).cloned(),
            group: names.groups.get(&gid).cloned(),
            modified_at: util::rfc3339(modified),
            symlink_target,
            metadata: Default::default(),
        }
    }
}

/// The prefix of the extended attributes that hold a file's metadata
/// (E2B's convention: `user.e2b.<key>`).
pub(crate) const METADATA_XATTR_PREFIX: &str = "user.e2b.";

/// Whether a file of `info`'s kind can carry metadata (`user.*`
/// attributes: regular files and directories only).
fn has_metadata(info: &FileInfo) -> bool {
    matches!(info.kind, FileKind::File | FileKind::Dir)
}

/// The metadata of the file at `path` (a `/proc/self/fd` path: its last
/// component is not followed), by key. Most files have none: their list of
/// attribute names is read into a small buffer, a larger one only when
/// that is too small (a listing reads one for every entry).
fn read_metadata<P: rustix::path::Arg + Copy>(path: P) -> Result<BTreeMap<String, String>, Errno> {
    let mut small = [0u8; 256];
    let mut large = Vec::new();
    let names: &[u8] = match rustix::fs::llistxattr(path, &mut small[..]) {
        Ok(n) => &small[..n],
        Err(Errno::RANGE) => {
            large.resize(rustix::fs::llistxattr_query(path)?, 0);
            let n = rustix::fs::llistxattr(path, &mut large[..])?;
            &large[..n]
        }
        // (A file system without extended attributes has no metadata.)
        Err(Errno::NOTSUP) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut out = BTreeMap::new();
    for name in metadata_names(names) {
        let len = match rustix::fs::lgetxattr_query(path, name) {
            Ok(len) => len,
            Err(Errno::NODATA) => continue, // (removed meanwhile)
            Err(e) => return Err(e),
        };
        let mut value = vec![0u8; len];
        let len = match rustix::fs::lgetxattr(path, name, &mut value[..]) {
            Ok(len) => len,
            Err(Errno::NODATA) => continue,
            Err(e) => return Err(e),
        };
        let key = name[METADATA_XATTR_PREFIX.len()..].to_string();
        out.insert(key, String::from_utf8_lossy(&value[..len]).into_owned());
    }
    Ok(out)
}

/// The metadata attributes (`user.e2b.*`) of a list of attribute names
/// (`listxattr`'s: NUL-terminated).
fn metadata_names(list: &[u8]) -> impl Iterator<Item = &str> {
    list.split(|b| *b == 0)
        .filter(|n| n.starts_with(METADATA_XATTR_PREFIX.as_bytes()))
        .filter_map(|n| std::str::from_utf8(n).ok())
}

/// Gives the open file `fd` exactly `metadata` (its other `user.e2b.*`
/// attributes are removed).
pub(crate) fn write_metadata(fd: impl AsFd, metadata: &BTreeMap<String, String>) -> Result<(), Errno> {
    let mut names = vec![0u8; rustix::fs::flistxattr_query(&fd)?];
    let n = rustix::fs::flistxattr(&fd, &mut names[..])?;
    for name in metadata_names(&names[..n]) {
        if !metadata.contains_key(&name[METADATA_XATTR_PREFIX.len()..]) {
            rustix::fs::fremovexattr(&fd, name)?;
        }
    }
    for (key, value) in metadata {
        let name = format!("{METADATA_XATTR_PREFIX}{key}");
        rustix::fs::fsetxattr(&fd, name.as_str(), value.as_bytes(), rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}

/// The permission bits of an octal text (`"644"`, `"0755"`).
pub(crate) fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 && !digits.is_empty() => Ok(m),
        _ => Err(format!("mode {text:?} is not octal permission bits such as \"644\" or \"755\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned_and_relative_ones_start_at_home() {
        let p = |s: &str| SandboxPath::parse(s, "/root").map(|p| p.0);
        assert_eq!(p("/a/b/../c/./d/").unwrap(), "/a/c/d");
        assert_eq!(p("notes.txt").unwrap(), "/root/notes.txt");
        assert_eq!(p("../../../../etc/passwd").unwrap(), "/etc/passwd");
        assert_eq!(p("/..").unwrap(), "/");
        assert!(p("").is_err());
        assert!(p("a\0b").is_err());
        let q = SandboxPath::parse("/a/b", "/").unwrap();
        assert_eq!(q.split().map(|(d, n)| (d.0, n.to_string())), Some(("/a".into(), "b".into())));
        assert_eq!(q.prefixes().into_iter().map(|p| p.0).collect::<Vec<_>>(), ["/", "/a", "/a/b"]);
        assert_eq!(SandboxPath::parse("/", "/").unwrap().split(), None);
    }

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(parse_mode("644"), Ok(0o644));
        assert_eq!(parse_mode("0755"), Ok(0o755));
        assert_eq!(parse_mode("4755"), Ok(0o4755));
        assert!(parse_mode("999").is_err());
        assert!(parse_mode("").is_err());
        assert!(parse_mode("17777").is_err());
    }
}
