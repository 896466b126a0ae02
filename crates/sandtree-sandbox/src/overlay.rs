//! Building the overlay mounts of a sandbox (runs in the zygote: real root,
//! initial user namespace).
//!
//! Kernel quirks worked around:
//! * An overlay mounted *inside* the sandbox user namespace cannot use `/`
//!   as lower and uses `user.*` xattrs; mounting it as real root with the
//!   new mount API gives a detached mount fd whose copy-ups run with root's
//!   credentials (`trusted.*` xattrs) and which init later attaches with
//!   `move_mount` inside its own mount namespace.
//! * Overlay layers do not cross mount points, so every host directory is
//!   its own layer set (`/`, `/usr`, ...).
//! * Host directories owned by real root (host `/usr`) would show up as
//!   `nobody` inside; they are used through an idmapped clone
//!   (`open_tree(OPEN_TREE_CLONE)` + `mount_setattr(MOUNT_ATTR_IDMAP)` with a
//!   user namespace mapping `0 uid_base 65536`) attached under
//!   `<run_dir>/lower/<escaped path>`. Overlay accepts idmapped lowers, and
//!   the attached clone survives daemon restarts (reused via mountinfo).
//! * overlayfs shows its layers, in every mount table (`/proc/mounts`
//!   inside the sandbox too), by the names it was given. [`LayerNames`]:
//!   layers are given relative names, `<key>/store/<path below the store
//!   root>` and `<key>/lower/<escaped host path>`, with the zygote's
//!   current directory at `/run/sandtree/layers`, where
//!   `<key>/store` and `<key>/lower` are symbolic links to the store root
//!   and `<run_dir>/lower` (`key`: a hash of the run directory, one per
//!   daemon). A sandbox sees `upperdir=<key>/store/sandboxes/<id>/...`,
//!   nothing of the data directory; the daemon turns the names back into
//!   host paths through the links (`sandtree_sys::mountinfo::layer_path`).
//!   The mount's source is `overlay`.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, chown};
use std::path::{Path, PathBuf};

use rustix::fs::{CWD, Mode, OFlags};
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags, fsconfig_create, fsconfig_set_flag,
    fsconfig_set_string, fsmount, fsopen, move_mount, open_tree,
};
use sandtree_sys::process::{Forked, clone_namespaces, exit_now};

use crate::config::{HostConfig, ID_RANGE, OverlayLayer};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The step.
        op: &'static str,
        /// Path involved.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Creating the mapping user namespace failed.
    #[error("create idmap user namespace: {0}")]
    Userns(String),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

fn io_err<E: Into<io::Error>>(op: &'static str, path: &Path) -> impl FnOnce(E) -> Error {
    let path = path.to_path_buf();
    move |e| Error::Io { op, path, source: e.into() }
}

/// Zygote-side cache of idmapped host directories.
pub struct Idmapper {
    cfg: HostConfig,
    userns: Option<OwnedFd>,
    attached: HashMap<PathBuf, PathBuf>,
}

impl Idmapper {
    /// New, empty cache.
    pub fn new(cfg: HostConfig) -> Self {
        Idmapper { cfg, userns: None, attached: HashMap::new() }
    }

    /// Path of the idmapped clone of `host`, creating and attaching it if
    /// needed.
    pub fn get(&mut self, host: &Path) -> Result<PathBuf> {
        if let Some(p) = self.attached.get(host) {
            return Ok(p.clone());
        }
        let target = self.cfg.idmapped_path(host);
        // Several zygote workers may reach here at once: one creates the
        // mount, the others find it (the check and the mount under a lock).
        let lock_path = self.cfg.run_dir.join("lower.lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err("open", &lock_path))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io_err("flock", &lock_path)(std::io::Error::from(e)))?;
        if !is_mount_point(&target) {
            let userns = self.userns()?;
            let tree = open_tree(CWD, host, OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC)
                .map_err(io_err("open_tree", host))?;
            sandtree_sys::mount::set_idmap(tree.as_fd(), userns.as_fd(), true).map_err(io_err("idmap", host))?;
            fs::DirBuilder::new().recursive(true).mode(0o755).create(&target).map_err(io_err("mkdir", &target))?;
            move_mount(tree.as_fd(), "", CWD, &target, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
                .map_err(io_err("move_mount", &target))?;
        }
        self.attached.insert(host.to_path_buf(), target.clone());
        Ok(target)
    }

    fn userns(&mut self) -> Result<&OwnedFd> {
        if self.userns.is_none() {
            self.userns = Some(make_userns(self.cfg.uid_base)?);
        }
        Ok(self.userns.as_ref().expect("set above"))
    }
}

/// A user namespace with map `0 uid_base 65536`: fork a child into a new
/// user namespace, write its maps, open `/proc/<pid>/ns/user`, kill it.
fn make_userns(uid_base: u32) -> Result<OwnedFd> {
    let (rx, tx) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| Error::Userns(e.to_string()))?;
    match clone_namespaces(nix::libc::CLONE_NEWUSER).map_err(|e| Error::Userns(e.to_string()))? {
        Forked::Child => {
            drop(tx);
            let mut f = fs::File::from(rx);
            let mut b = [0u8; 1];
            let _ = f.read(&mut b);
            exit_now(0);
        }
        Forked::Parent(pid) => {
            drop(rx);
            let map = format!("0 {uid_base} {ID_RANGE}\n");
            let res = (|| -> io::Result<OwnedFd> {
                fs::write(format!("/proc/{pid}/uid_map"), &map)?;
                fs::write(format!("/proc/{pid}/gid_map"), &map)?;
                let fd =
                    rustix::fs::open(format!("/proc/{pid}/ns/user"), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
                Ok(fd)
            })();
            let mut tx = fs::File::from(tx);
            let _ = tx.write_all(b"x");
            drop(tx); // child exits; SIGCHLD is ignored so it is auto-reaped
            res.map_err(|e| Error::Userns(e.to_string()))
        }
    }
}

/// How overlays name their layers (see the module docs).
#[derive(Clone, Debug)]
pub struct LayerNames {
    /// `LAYER_NAMES/<key>`.
    dir: PathBuf,
    key: String,
    /// Label → host directory, the more specific first.
    roots: Vec<(&'static str, PathBuf)>,
}

impl LayerNames {
    /// The names of the daemon with configuration `cfg`.
    pub fn new(cfg: &HostConfig) -> LayerNames {
        use std::os::unix::ffi::OsStrExt;
        // FNV-1a: stable across builds (the names outlive a daemon: a
        // restarted one reads its sandboxes' mount tables).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in cfg.run_dir.as_os_str().as_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        let key = format!("{h:016x}");
        let mut roots = vec![("lower", cfg.lower_dir())];
        roots.extend(cfg.store_root.clone().map(|r| ("store", r)));
        LayerNames { dir: Path::new(sandtree_sys::mountinfo::LAYER_NAMES).join(&key), key, roots }
    }

    /// The name layer directory `path` is given: `<key>/<label>/<rest>`,
    /// or `path` itself outside every root.
    pub fn name(&self, path: &Path) -> PathBuf {
        for (label, root) in &self.roots {
            if let Ok(rest) = path.strip_prefix(root) {
                return Path::new(&self.key).join(label).join(rest);
            }
        }
        path.to_path_buf()
    }

    /// Create the links (daemon side, when the zygote starts), and remove
    /// other daemons' whose data directory is gone.
    pub fn install(&self) -> Result<()> {
        let base = Path::new(sandtree_sys::mountinfo::LAYER_NAMES);
        fs::DirBuilder::new().recursive(true).mode(0o755).create(&self.dir).map_err(io_err("mkdir", &self.dir))?;
        // `lower` exists from now on: a daemon starting meanwhile does not
        // take these links for stale.
        let lower = &self.roots[0].1;
        if let Some(run_dir) = lower.parent() {
            fs::DirBuilder::new().recursive(true).mode(0o711).create(run_dir).map_err(io_err("mkdir", run_dir))?;
        }
        fs::DirBuilder::new().recursive(true).mode(0o755).create(lower).map_err(io_err("mkdir", lower))?;
        for (label, target) in &self.roots {
            let link = self.dir.join(label);
            if fs::read_link(&link).is_ok_and(|t| t == *target) {
                continue;
            }
            let tmp = self.dir.join(format!(".{label}.{}", std::process::id()));
            let _ = fs::remove_file(&tmp);
            std::os::unix::fs::symlink(target, &tmp).map_err(io_err("symlink", &tmp))?;
            fs::rename(&tmp, &link).map_err(io_err("rename", &tmp))?;
        }
        for entry in fs::read_dir(base).map_err(io_err("read", base))?.flatten() {
            let dir = entry.path();
            // Gone: no data directory holds its `lower` any more.
            if dir != self.dir && fs::read_link(dir.join("lower")).is_ok_and(|t| !t.exists()) {
                let _ = fs::remove_dir_all(&dir);
            }
        }
        Ok(())
    }

    /// Make the names resolvable (the current directory
    /// `LAYER_NAMES`) until the guard is dropped (back to `/`).
    fn enter(&self) -> Result<impl Drop> {
        struct Back;
        impl Drop for Back {
            fn drop(&mut self) {
                let _ = rustix::process::chdir("/");
            }
        }
        // (Made again if something removed them since the zygote started.)
        if fs::symlink_metadata(self.dir.join(self.roots[0].0)).is_err() {
            self.install()?;
        }
        let base = Path::new(sandtree_sys::mountinfo::LAYER_NAMES);
        rustix::process::chdir(base).map_err(io_err("chdir", base))?;
        Ok(Back)
    }
}

/// Whether `path` is a mount point in the current mount namespace.
pub fn is_mount_point(path: &Path) -> bool {
    sandtree_sys::mountinfo::is_mount_point(path)
}

/// Create `dir` (and parents) if missing, owned by `uid_base:uid_base`.
pub fn ensure_shifted_dir(dir: &Path, uid_base: u32, mode: u32) -> Result<()> {
    if !dir.exists() {
        fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(io_err("mkdir", dir))?;
        chown(dir, Some(uid_base), Some(uid_base)).map_err(io_err("chown", dir))?;
    }
    Ok(())
}

/// Build one overlay as a detached mount.
///
/// The overlay is `volatile`: it never syncs the upper filesystem. Without
/// it, unmounting a sandbox's overlay (every kill, rollback and delete)
/// syncs the *whole* btrfs volume — a transaction commit of every
/// sandbox's dirty data, 5-15 ms, on the critical path. Durability comes
/// from btrfs instead: each checkpoint is a committed snapshot, and btrfs
/// commits the rest every 30 s, always crash-consistent (copy-on-write).
/// The price: `fsync` inside a sandbox does not force data to disk before
/// the next commit. A volatile overlay leaves `work/work/incompat/volatile`
/// behind and refuses to mount over it; the work dir holds nothing else of
/// value, so it is cleared before each mount.
pub fn build(layer: &OverlayLayer, cfg: &HostConfig, idmap: &mut Idmapper, names: &LayerNames) -> Result<OwnedFd> {
    ensure_shifted_dir(&layer.upper, cfg.uid_base, 0o755)?;
    ensure_shifted_dir(&layer.work, cfg.uid_base, 0o700)?;
    let incompat = layer.work.join("work").join("incompat");
    match fs::remove_dir_all(&incompat) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("clear overlay work dir", &incompat)(e)),
    }
    let fs_fd = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC).map_err(io_err("fsopen overlay", &layer.upper))?;
    let lowers = layer
        .lower
        .iter()
        .map(|l| if l.idmap { idmap.get(&l.path) } else { Ok(l.path.clone()) })
        .collect::<Result<Vec<_>>>()?;
    // (Relative names resolve from the current directory, at each call.)
    let _back = names.enter()?;
    for path in &lowers {
        fsconfig_set_string(fs_fd.as_fd(), "lowerdir+", names.name(path))
            .map_err(io_err("fsconfig lowerdir+", path))?;
    }
    fsconfig_set_string(fs_fd.as_fd(), "upperdir", names.name(&layer.upper))
        .map_err(io_err("fsconfig upperdir", &layer.upper))?;
    fsconfig_set_string(fs_fd.as_fd(), "workdir", names.name(&layer.work))
        .map_err(io_err("fsconfig workdir", &layer.work))?;
    fsconfig_set_string(fs_fd.as_fd(), "source", "overlay").map_err(io_err("fsconfig source", &layer.upper))?;
    // `redirect_dir=on`: a directory of a lower layer can be renamed (else
    // EXDEV). With layered checkpoints every directory made before the last
    // checkpoint lies in a lower layer.
    for (k, v) in [("index", "off"), ("xino", "off"), ("redirect_dir", "on")] {
        fsconfig_set_string(fs_fd.as_fd(), k, v).map_err(io_err("fsconfig option", Path::new(k)))?;
    }
    fsconfig_set_flag(fs_fd.as_fd(), "volatile").map_err(io_err("fsconfig option", Path::new("volatile")))?;
    fsconfig_create(fs_fd.as_fd()).map_err(io_err("fsconfig create overlay", &layer.upper))?;
    let mnt = fsmount(fs_fd.as_fd(), FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())
        .map_err(io_err("fsmount overlay", &layer.upper))?;
    Ok(mnt)
}
