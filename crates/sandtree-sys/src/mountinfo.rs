//! `/proc/self/mountinfo`: which filesystems are mounted where, in the
//! calling process's mount namespace. (No `unsafe` here; it lives in this
//! crate because it reads a kernel interface like the other modules.)
//!
//! Line format (proc(5)): `id parent major:minor root mount-point options
//! [optional fields...] - fstype source super-options`. Fields escape space,
//! tab, newline and backslash as `\NNN` octal.
//!
//! # Layer names
//!
//! overlayfs shows its layers as they were named when it was mounted, to
//! anyone who reads a mount table, a sandbox's own processes included. A
//! sandbox's overlays are therefore given *relative* names, resolved from
//! [`LAYER_NAMES`] (the zygote mounts them with its current directory
//! there): `<key>/<label>/<path below>`, where `LAYER_NAMES/<key>/<label>`
//! is a symbolic link to the host directory the label stands for (`key`
//! is one per daemon, `label` one per root: `store`, `lower`). Inside, a
//! sandbox sees `upperdir=3f2a…/store/sandboxes/…/upper`, not the daemon's
//! data directory. [`MountEntry::option`] (for `upperdir` and `workdir`)
//! and [`MountEntry::lower_dirs`] give back host paths ([`layer_path`]).

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
    /// Value of `key=value` among the filesystem options; an overlay's
    /// `upperdir` and `workdir` as host paths (see [`layer_path`]).
    pub fn option(&self, key: &str) -> Option<PathBuf> {
        let value = self.super_options.split(',').find_map(|o| o.strip_prefix(key)?.strip_prefix('=')).map(unescape)?;
        Some(if self.fstype == "overlay" && matches!(key, "upperdir" | "workdir") { layer_path(&value) } else { value })
    }

    /// An overlay's lower layers, topmost first (`lowerdir=a:b` or
    /// repeated `lowerdir+=`), as host paths (see [`layer_path`]).
    pub fn lower_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for o in self.super_options.split(',') {
            if let Some(v) = o.strip_prefix("lowerdir+=") {
                out.push(unescape(v));
            } else if let Some(v) = o.strip_prefix("lowerdir=") {
                out.extend(v.split(':').filter(|p| !p.is_empty()).map(unescape));
            }
        }
        out.iter().map(|p| layer_path(p)).collect()
    }

    /// Its device in the kernel's internal encoding (`major << 20 |
    /// minor`), as `fdinfo` prints it (`sdev:` of an inotify watch).
    pub fn kernel_dev(&self) -> u64 {
        ((self.dev.0 as u64) << 20) | self.dev.1 as u64
    }
}

/// Where sandboxes' overlay layers are named from (see the module docs).
pub const LAYER_NAMES: &str = "/run/sandtree/layers";

/// The host path an overlay layer's name stands for: an absolute name is
/// one already; `<key>/<label>/<rest>` is `<rest>` below the target of the
/// link `LAYER_NAMES/<key>/<label>` (as the link names it: the very path
/// the layer was given as, not a canonical one); anything else is taken
/// relative to [`LAYER_NAMES`].
pub fn layer_path(name: &Path) -> PathBuf {
    if name.is_absolute() {
        return name.to_path_buf();
    }
    let mut parts = name.components();
    if let (Some(key), Some(label)) = (parts.next(), parts.next()) {
        let link = Path::new(LAYER_NAMES).join(key).join(label);
        if let Ok(target) = std::fs::read_link(&link)
            && target.is_absolute()
        {
            let rest = parts.as_path();
            return if rest.as_os_str().is_empty() { target } else { target.join(rest) };
        }
    }
    Path::new(LAYER_NAMES).join(name)
}

/// Every mount, in mount order (the last one on a path is the visible one).
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse(&read_whole("/proc/self/mountinfo")?))
}

/// Detaches every mount below `dir` (not `dir` itself), deepest first, as
/// `umount -l` does; a path mounted twice is detached twice. For clearing
/// a data directory a daemon left (a store, idmapped lower layers,
/// routers' namespaces under `run/net`, whose network namespace and links
/// go with their last mount). Errors of single mounts (one gone meanwhile)
/// are ignored.
pub fn detach_all_under(dir: &Path) -> io::Result<()> {
    // (mountinfo has absolute paths; `dir` may be relative.)
    let root = std::fs::canonicalize(dir)?;
    let mut targets: Vec<PathBuf> =
        mounts()?.into_iter().map(|m| m.target).filter(|t| t.starts_with(&root) && *t != root).collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.components().count()));
    for t in &targets {
        let _ = rustix::mount::unmount(t, rustix::mount::UnmountFlags::DETACH);
    }
    Ok(())
}

/// The mounts seen by process `pid` (its mount namespace and root).
pub fn mounts_of(pid: i32) -> io::Result<Vec<MountEntry>> {
    Ok(parse(&read_whole(&format!("/proc/{pid}/mountinfo"))?))
}

/// The mount table as process `pid` sees it, kept with its `mountinfo`
/// file open: [`Watched::changed`] tells, at the cost of one `poll`,
/// whether any mount of that namespace changed since the file was opened
/// (the kernel keeps an event count per mount namespace; `poll` reports
/// `POLLPRI` once it differs from the count the file was opened at). A
/// checkpoint reads the table twice, for ~0.1-0.2 ms each (an overlay's
/// options are long): with this, it is read again only after a change.
#[derive(Debug)]
pub struct Watched {
    pid: i32,
    /// The namespace the table is of (device and inode of
    /// `/proc/<pid>/ns/mnt`): a pid reused by another process is not
    /// mistaken for it.
    ns: (u64, u64),
    file: std::fs::File,
    entries: Vec<MountEntry>,
}

impl Watched {
    /// Read the table of `pid`.
    pub fn read(pid: i32) -> io::Result<Watched> {
        let ns = ns_of(pid)?;
        let mut file = std::fs::File::open(format!("/proc/{pid}/mountinfo"))?;
        let text = read_all(&mut file)?;
        // (A process that moved to another namespace meanwhile.)
        if ns_of(pid)? != ns {
            return Err(io::Error::other(format!("pid {pid} changed mount namespace while its mounts were read")));
        }
        Ok(Watched { pid, ns, file, entries: parse(&text) })
    }

    /// Whether the table may be out of date for `pid` now: another process
    /// or namespace, or a mount of the namespace changed since the read.
    /// (Reports a change once: read the table again then.)
    pub fn changed(&self, pid: i32) -> bool {
        if pid != self.pid || ns_of(pid).ok() != Some(self.ns) {
            return true;
        }
        let mut fds = [rustix::event::PollFd::new(&self.file, rustix::event::PollFlags::PRI)];
        let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(_) => {
                let bad =
                    rustix::event::PollFlags::PRI | rustix::event::PollFlags::ERR | rustix::event::PollFlags::NVAL;
                fds[0].revents().intersects(bad)
            }
            Err(_) => true,
        }
    }

    /// The mounts, in mount order.
    pub fn entries(&self) -> &[MountEntry] {
        &self.entries
    }
}

fn ns_of(pid: i32) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("/proc/{pid}/ns/mnt"))?;
    Ok((m.dev(), m.ino()))
}

/// A `/proc` file read into a buffer with room for it
/// (`std::fs::read_to_string` has no size to go by there: it starts with
/// 32 bytes and doubles, nine reads for a sandbox's mount table, on a
/// rollback's path).
fn read_whole(path: &str) -> io::Result<String> {
    read_all(&mut std::fs::File::open(path)?)
}

/// The rest of an open `/proc` file (see [`read_whole`]).
fn read_all(file: &mut std::fs::File) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(64 * 1024);
    file.read_to_string(&mut text)?;
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
    fn a_watched_table_sees_a_mount_change() {
        // In a mount namespace of this thread's own: no other test's
        // mounts show there.
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS | nix::sched::CloneFlags::CLONE_NEWNS)
                .expect("unshare");
            rustix::mount::mount_change(
                "/",
                rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC,
            )
            .expect("make / private");
            let tid = rustix::thread::gettid().as_raw_nonzero().get();
            let dir = std::env::temp_dir().join(format!("sandtree-watched-{tid}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            let table = Watched::read(tid).expect("read");
            assert!(!table.changed(tid), "nothing changed yet");
            assert!(table.changed(tid + 1_000_000), "another pid");
            rustix::mount::mount("tmpfs", &dir, "tmpfs", rustix::mount::MountFlags::empty(), None)
                .expect("mount tmpfs");
            assert!(table.changed(tid), "a mount was added");
            let again = Watched::read(tid).expect("read again");
            assert!(again.entries().iter().any(|m| m.target == dir && m.fstype == "tmpfs"));
            assert!(!again.changed(tid));
            let _ = rustix::mount::unmount(&dir, rustix::mount::UnmountFlags::DETACH);
            let _ = std::fs::remove_dir(&dir);
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn layer_names_resolve_through_their_links() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let key = format!("test-{}", std::process::id());
        let dir = Path::new(LAYER_NAMES).join(&key);
        if std::fs::create_dir_all(&dir).is_err() {
            eprintln!("SKIP: cannot create {} (not root?)", dir.display());
            return;
        }
        std::os::unix::fs::symlink(tmp.path(), dir.join("store")).expect("symlink");
        let text = format!(
            "1 0 0:1 / / rw - overlay overlay rw,lowerdir+={key}/store/a,lowerdir+=/abs,upperdir={key}/store/u/v,workdir={key}/store/w\n"
        );
        let m = &parse(&text)[0];
        let store = tmp.path();
        assert_eq!(m.lower_dirs(), vec![store.join("a"), PathBuf::from("/abs")]);
        assert_eq!(m.option("upperdir"), Some(store.join("u/v")));
        assert_eq!(m.option("workdir"), Some(store.join("w")));
        assert_eq!(layer_path(Path::new(&format!("{key}/store"))), store);
        // A name without a link: relative to LAYER_NAMES.
        assert_eq!(layer_path(Path::new("nokey/x")), Path::new(LAYER_NAMES).join("nokey/x"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")));
    }
}
