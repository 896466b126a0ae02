//! The files API: read, write, stat, list, make directories, move and
//! remove files of a sandbox, done by the daemon in the sandbox's root
//! ([`crate::sandbox_root`]) without running a program in it (so it works
//! on any image, and costs no process).
//!
//! Every call takes the sandbox's lock while it touches the sandbox, so it
//! falls wholly before or after a checkpoint or a rollback. Two stream:
//! - a **read** opens the file under the lock, then streams it without;
//! - a **write** streams the body into an unnamed file (`O_TMPFILE`) in the
//!   nearest existing directory of the path, without the lock, then under
//!   it makes the missing directories, links the file under a temporary
//!   name and renames it over the path. A checkpoint taken during an
//!   upload sees the old file (or none), never half of the new one. A
//!   checkpoint or a rollback during the upload moves the sandbox to
//!   another layer (another mount, where the file cannot be linked:
//!   `EXDEV`): the bytes are then copied there under the lock, and the
//!   write lands, whole, after the checkpoint or rollback.
//!
//! A write may give the file metadata (key → value), stored on it as
//! extended attributes `user.e2b.<key>` (E2B's convention); every
//! description of a file (stat, list, move, write) carries its metadata.
//!
//! A stopped sandbox is started first, as an exec starts it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};

use futures_util::{Stream, StreamExt};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use sandtree_api::{FileInfo, FileKind, FileList, MakeDirRequest, MoveRequest};
use sandtree_sandbox::users::Account;
use tokio::io::AsyncWriteExt;

use crate::engine::{Engine, block};
use crate::error::{Error, Result};
use crate::sandbox_root::{METADATA_XATTR_PREFIX, SandboxPath, SandboxRoot, parse_mode, write_metadata};

/// Most entries one listing answers.
const LIST_MAX_ENTRIES: usize = 100_000;
/// Deepest listing.
const LIST_MAX_DEPTH: u32 = 64;
const DEFAULT_FILE_MODE: u32 = 0o644;
/// The temporary name a write links its file under before the rename.
pub(crate) const TEMP_PREFIX: &str = ".sandtree-write-";
const DEFAULT_DIR_MODE: u32 = 0o755;

/// Who writes a file, and its mode (`PUT …/files`).
#[derive(Clone, Debug, Default)]
pub struct WriteFile {
    /// Owner of a file created, and of the directories made (default root).
    pub user: Option<String>,
    /// Permission bits as octal text (default `644`, or the replaced file's).
    pub mode: Option<String>,
    /// The file's metadata, by key (stored as `user.e2b.<key>` extended
    /// attributes; keys are lowercased). It replaces the replaced file's.
    pub metadata: BTreeMap<String, String>,
}

/// Longest metadata key (the attribute's name is at most 255 bytes).
const METADATA_KEY_MAX: usize = 255 - METADATA_XATTR_PREFIX.len();
/// Longest metadata value, and most keys, of a file.
const METADATA_VALUE_MAX: usize = 4096;
const METADATA_MAX_KEYS: usize = 64;

/// `metadata` with its keys lowercased, or why it cannot be stored: keys
/// are HTTP header tokens (they travel as `X-Metadata-<key>`), values
/// printable ASCII.
pub fn checked_metadata(metadata: BTreeMap<String, String>) -> Result<BTreeMap<String, String>> {
    if metadata.len() > METADATA_MAX_KEYS {
        return Err(Error::InvalidArgument(format!(
            "file metadata: {} keys, more than {METADATA_MAX_KEYS}",
            metadata.len()
        )));
    }
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    let mut out = BTreeMap::new();
    for (key, value) in metadata {
        if key.is_empty() || key.len() > METADATA_KEY_MAX || !key.chars().all(token) {
            return Err(Error::InvalidArgument(format!(
                "file metadata key {key:?}: 1 to {METADATA_KEY_MAX} letters, digits or !#$%&'*+-.^_`|~"
            )));
        }
        if value.len() > METADATA_VALUE_MAX || !value.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
            return Err(Error::InvalidArgument(format!(
                "file metadata value of {key:?}: at most {METADATA_VALUE_MAX} printable ASCII characters"
            )));
        }
        out.insert(key.to_ascii_lowercase(), value);
    }
    Ok(out)
}

/// A file opened for reading: its description and the open file.
pub struct OpenedFile {
    pub info: FileInfo,
    pub file: std::fs::File,
}

/// What went wrong with `path` of sandbox `id`, as the API says it.
pub(crate) fn file_error(id: &str, path: &SandboxPath, op: &'static str, e: Errno) -> Error {
    let p = path.as_str();
    match e {
        Errno::NOENT => Error::FileNotFound { sandbox: id.to_string(), path: p.to_string() },
        Errno::NOTDIR => Error::InvalidArgument(format!("{op} {p}: a component of the path is not a directory")),
        Errno::ISDIR => Error::InvalidArgument(format!("{op} {p}: it is a directory")),
        Errno::EXIST => Error::AlreadyExists(format!("{p} in sandbox {id}")),
        Errno::NOTEMPTY => Error::InvalidArgument(format!(
            "{op} {p}: the directory is not empty (pass recursive=true to remove it with its contents)"
        )),
        Errno::LOOP => Error::InvalidArgument(format!("{op} {p}: too many levels of symbolic links")),
        Errno::XDEV => Error::InvalidArgument(format!(
            "{op} {p}: the source and the destination are on different mounts of the sandbox (copy, then remove)"
        )),
        Errno::ROFS => Error::InvalidArgument(format!("{op} {p}: the file system there is read-only")),
        Errno::BUSY => Error::InvalidArgument(format!("{op} {p}: it is a mount point or in use")),
        Errno::NAMETOOLONG => Error::InvalidArgument(format!("{op} {p}: a name in the path is too long")),
        Errno::NOSPC | Errno::DQUOT => Error::NoSpace { op, detail: format!("{p} in sandbox {id}: {e}") },
        Errno::ACCESS | Errno::PERM => Error::InvalidArgument(format!("{op} {p}: permission denied ({e})")),
        e => Error::Internal(format!("{op} {p} in sandbox {id}: {e}")),
    }
}

impl Engine {
    /// The account `user` (default root) of sandbox `id`, started if
    /// stopped, read from its `/etc/passwd` and `/etc/group`.
    pub(crate) async fn files_account(&self, id: &str, user: Option<&str>) -> Result<Account> {
        self.record(id)?;
        let user = crate::sandbox_exec::user_name(user)?;
        self.running(id).await?;
        let root = self.current_root(id)?;
        block(|| root.account(user.as_deref())).map_err(Error::InvalidArgument)
    }

    /// `stat` of a path: a symlink is described, or with `follow`, what
    /// it leads to (inside the sandbox).
    pub async fn stat_file(&self, id: &str, path: &str, follow: bool, user: Option<&str>) -> Result<FileInfo> {
        let account = self.files_account(id, user).await?;
        let path = SandboxPath::parse(path, &account.home).map_err(Error::InvalidArgument)?;
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        block(|| match follow {
            false => root.stat(&path),
            true => root.open_path(&path, OFlags::PATH, Mode::empty()).and_then(|fd| root.stat_fd(&fd, &path)),
        })
        .map_err(|e| file_error(id, &path, "stat", e))
    }

    /// Opens a regular file for reading.
    pub async fn read_file(&self, id: &str, path: &str, user: Option<&str>) -> Result<OpenedFile> {
        let account = self.files_account(id, user).await?;
        let path = SandboxPath::parse(path, &account.home).map_err(Error::InvalidArgument)?;
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        block(|| {
            // (Non-blocking: a FIFO must not hang the open.)
            let fd = root
                .open_path(&path, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
                .map_err(|e| file_error(id, &path, "read", e))?;
            let info = root.stat_fd(&fd, &path).map_err(|e| file_error(id, &path, "read", e))?;
            match info.kind {
                FileKind::File => {}
                FileKind::Dir => {
                    return Err(Error::InvalidArgument(format!(
                        "read {}: it is a directory (list it with GET /v1/sandboxes/{id}/files/list?path=…)",
                        path.as_str()
                    )));
                }
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "read {}: not a regular file (a FIFO, socket or device), whose reading could block",
                        path.as_str()
                    )));
                }
            }
            Ok(OpenedFile { info, file: std::fs::File::from(fd) })
        })
    }

    /// Writes `body` to `path`, replacing it whole when the body has ended
    /// (see the module docs).
    pub async fn write_file<S, B, E>(&self, id: &str, path: &str, opts: WriteFile, mut body: S) -> Result<FileInfo>
    where
        S: Stream<Item = std::result::Result<B, E>> + Unpin,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        let mode = opts.mode.as_deref().map(parse_mode).transpose().map_err(Error::InvalidArgument)?;
        let metadata = checked_metadata(opts.metadata)?;
        let account = self.files_account(id, opts.user.as_deref()).await?;
        let path = SandboxPath::parse(path, &account.home).map_err(Error::InvalidArgument)?;
        let Some((parent, name)) = path.split() else {
            return Err(Error::InvalidArgument("write /: the root is a directory".into()));
        };
        let name = name.to_string();
        // The unnamed file, in the nearest directory that exists.
        let tmp = {
            let _lock = self.lock_sandbox(id).await;
            let root = self.current_root(id)?;
            block(|| {
                let dir = nearest_dir(&root, &parent).map_err(|e| file_error(id, &parent, "write", e))?;
                rustix::fs::openat(&dir, ".", OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, Mode::from(0o600))
                    .map_err(|e| file_error(id, &path, "write", e))
            })?
        };
        let mut file = tokio::fs::File::from_std(std::fs::File::from(tmp));
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                Error::InvalidArgument(format!(
                    "write {}: the upload broke off ({e}); nothing was written",
                    path.as_str()
                ))
            })?;
            file.write_all(chunk.as_ref()).await.map_err(|e| io_error(id, &path, e))?;
        }
        file.flush().await.map_err(|e| io_error(id, &path, e))?;
        let tmp = OwnedFd::from(file.into_std().await);
        // Into place, under the lock.
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        let info = block(|| -> Result<FileInfo> {
            make_dirs(&root, &parent, &account, DEFAULT_DIR_MODE).map_err(|e| file_error(id, &parent, "write", e))?;
            let dir = root.open_dir(&parent).map_err(|e| file_error(id, &parent, "write", e))?;
            let (uid, gid, bits) = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    return Err(file_error(id, &path, "write", Errno::ISDIR));
                }
                // A file replaced keeps its owner and mode unless given.
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && opts.user.is_none() => {
                    let ids = (rustix::fs::Uid::from_raw(st.st_uid), rustix::fs::Gid::from_raw(st.st_gid));
                    (ids.0, ids.1, mode.unwrap_or(st.st_mode & 0o7777))
                }
                _ => {
                    let (u, g) = root.host_ids(account.uid, account.gid);
                    (u, g, mode.unwrap_or(DEFAULT_FILE_MODE))
                }
            };
            let e = |e| file_error(id, &path, "write", e);
            let temp_name = format!("{TEMP_PREFIX}{:016x}", rand::random::<u64>());
            // A checkpoint or a rollback during the upload put the sandbox
            // on another layer (another mount): the bytes are copied there.
            let copy;
            let placed = match rustix::fs::linkat(&tmp, "", &dir, temp_name.as_str(), AtFlags::EMPTY_PATH) {
                Ok(()) => &tmp,
                Err(Errno::XDEV) => {
                    copy = rustix::fs::openat(
                        &dir,
                        ".",
                        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
                        Mode::from(0o600),
                    )
                    .map_err(e)?;
                    copy_whole(&tmp, &copy).map_err(|err| io_error(id, &path, err))?;
                    rustix::fs::linkat(&copy, "", &dir, temp_name.as_str(), AtFlags::EMPTY_PATH).map_err(e)?;
                    &copy
                }
                Err(err) => return Err(e(err)),
            };
            let owned = rustix::fs::fchown(placed, Some(uid), Some(gid))
                .and_then(|()| rustix::fs::fchmod(placed, Mode::from(bits)))
                .and_then(|()| write_metadata(placed, &metadata));
            if let Err(err) = owned {
                let _ = rustix::fs::unlinkat(&dir, temp_name.as_str(), AtFlags::empty());
                return Err(e(err));
            }
            if let Err(err) = rustix::fs::renameat(&dir, temp_name.as_str(), &dir, name.as_str()) {
                let _ = rustix::fs::unlinkat(&dir, temp_name.as_str(), AtFlags::empty());
                return Err(e(err));
            }
            root.stat_at(&dir, &name, &path).map_err(e)
        })?;
        self.flusher.poke();
        Ok(info)
    }

    /// The entries of a directory, `depth` levels down (1: its own).
    pub async fn list_files(&self, id: &str, path: &str, depth: u32, user: Option<&str>) -> Result<FileList> {
        if depth == 0 || depth > LIST_MAX_DEPTH {
            return Err(Error::InvalidArgument(format!("depth {depth} is not between 1 and {LIST_MAX_DEPTH}")));
        }
        let account = self.files_account(id, user).await?;
        let path = SandboxPath::parse(path, &account.home).map_err(Error::InvalidArgument)?;
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        let mut entries = Vec::new();
        block(|| list_into(&root, &path, depth, &mut entries)).map_err(|(p, e)| match e {
            ListError::Errno(e) => file_error(id, &p, "list", e),
            ListError::TooMany => Error::InvalidArgument(format!(
                "list {}: more than {LIST_MAX_ENTRIES} entries; list a smaller depth or a subdirectory",
                path.as_str()
            )),
        })?;
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(FileList { path: path.as_str().to_string(), entries })
    }

    /// Makes a directory (with `parents`, its missing parents too).
    pub async fn make_dir(&self, id: &str, req: MakeDirRequest) -> Result<FileInfo> {
        let mode = req.mode.as_deref().map(parse_mode).transpose().map_err(Error::InvalidArgument)?;
        let mode = mode.unwrap_or(DEFAULT_DIR_MODE);
        let account = self.files_account(id, req.user.as_deref()).await?;
        let path = SandboxPath::parse(&req.path, &account.home).map_err(Error::InvalidArgument)?;
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        let info = block(|| -> std::result::Result<FileInfo, Errno> {
            if req.parents {
                make_dirs(&root, &path, &account, mode)?;
            } else {
                let (parent, name) = path.split().ok_or(Errno::EXIST)?;
                let dir = root.open_dir(&parent)?;
                make_dir_at(&root, &dir, name, &account, mode)?;
            }
            root.stat(&path)
        })
        .map_err(|e| file_error(id, &path, "mkdir", e))?;
        self.flusher.poke();
        Ok(info)
    }

    /// Renames a file or directory.
    pub async fn move_file(&self, id: &str, req: MoveRequest) -> Result<FileInfo> {
        let account = self.files_account(id, req.user.as_deref()).await?;
        let from = SandboxPath::parse(&req.from, &account.home).map_err(Error::InvalidArgument)?;
        let to = SandboxPath::parse(&req.to, &account.home).map_err(Error::InvalidArgument)?;
        let (Some((from_dir, from_name)), Some((to_dir, to_name))) = (from.split(), to.split()) else {
            return Err(Error::InvalidArgument("move: the root cannot be moved, nor replaced".into()));
        };
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        let info = block(|| -> Result<FileInfo> {
            let fd = root.open_dir(&from_dir).map_err(|e| file_error(id, &from, "move", e))?;
            let td = root.open_dir(&to_dir).map_err(|e| file_error(id, &to, "move", e))?;
            let flags = if req.overwrite { RenameFlags::empty() } else { RenameFlags::NOREPLACE };
            rustix::fs::renameat_with(&fd, from_name, &td, to_name, flags).map_err(|e| match e {
                Errno::EXIST => {
                    Error::AlreadyExists(format!("{} in sandbox {id} (pass overwrite=true to replace it)", to.as_str()))
                }
                Errno::NOENT => file_error(id, &from, "move", e),
                e => file_error(id, &to, "move", e),
            })?;
            root.stat_at(&td, to_name, &to).map_err(|e| file_error(id, &to, "move", e))
        })?;
        self.flusher.poke();
        Ok(info)
    }

    /// Removes a file, a symlink (not its target) or a directory (with
    /// `recursive`, with its contents; mounts inside it are not crossed).
    pub async fn remove_file(&self, id: &str, path: &str, recursive: bool, user: Option<&str>) -> Result<()> {
        let account = self.files_account(id, user).await?;
        let path = SandboxPath::parse(path, &account.home).map_err(Error::InvalidArgument)?;
        let Some((parent, name)) = path.split() else {
            return Err(Error::InvalidArgument("remove /: the root cannot be removed".into()));
        };
        let _lock = self.lock_sandbox(id).await;
        let root = self.current_root(id)?;
        block(|| -> std::result::Result<(), Errno> {
            let dir = root.open_dir(&parent)?;
            let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                return rustix::fs::unlinkat(&dir, name, AtFlags::empty());
            }
            if recursive { remove_tree(&dir, name) } else { rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR) }
        })
        .map_err(|e| file_error(id, &path, "remove", e))?;
        self.flusher.poke();
        Ok(())
    }

    /// The root of running sandbox `id` as it is now: opened again at each
    /// call, under the sandbox's lock (a rollback swaps the root of the
    /// same init, and a root opened before it would be the old layer's).
    pub(crate) fn current_root(&self, id: &str) -> Result<SandboxRoot> {
        let live = self.live_get(id).filter(|s| s.is_alive()).ok_or_else(|| Error::NotRunning(id.to_string()))?;
        SandboxRoot::open(live.init_pid(), self.cfg.uid_base)
            .map_err(|e| Error::Internal(format!("opening the root of sandbox {id}: {e}")))
    }
}

/// Copies the whole of `from` (read from its start) into `to`.
fn copy_whole(from: &OwnedFd, to: &OwnedFd) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut src = std::fs::File::from(from.try_clone()?);
    src.seek(SeekFrom::Start(0))?;
    let mut dst = std::fs::File::from(to.try_clone()?);
    std::io::copy(&mut src, &mut dst)
}

fn io_error(id: &str, path: &SandboxPath, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(n) => file_error(id, path, "write", Errno::from_raw_os_error(n)),
        None => Error::Internal(format!("write {} in sandbox {id}: {e}", path.as_str())),
    }
}

/// The deepest existing directory on the way to `dir` (the root at worst).
fn nearest_dir(root: &SandboxRoot, dir: &SandboxPath) -> std::result::Result<OwnedFd, Errno> {
    for p in dir.prefixes().iter().rev() {
        match root.open_dir(p) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::NOENT)
}

/// `mkdir -p`: each missing directory on the way to `path` is made, owned
/// by `account`, with `mode`; an existing one must be a directory.
fn make_dirs(root: &SandboxRoot, path: &SandboxPath, account: &Account, mode: u32) -> std::result::Result<(), Errno> {
    for p in path.prefixes() {
        let Some((parent, name)) = p.split() else { continue };
        match root.open_dir(&p) {
            Ok(_) => continue,
            Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
        let dir = root.open_dir(&parent)?;
        match make_dir_at(root, &dir, name, account, mode) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One directory `name` in `dir`, owned by `account`, with `mode`.
fn make_dir_at(
    root: &SandboxRoot,
    dir: impl AsFd,
    name: &str,
    account: &Account,
    mode: u32,
) -> std::result::Result<(), Errno> {
    rustix::fs::mkdirat(&dir, name, Mode::from(0o700))?;
    let (uid, gid) = root.host_ids(account.uid, account.gid);
    rustix::fs::chownat(&dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)?;
    rustix::fs::chmodat(&dir, name, Mode::from(mode), AtFlags::empty())
}

enum ListError {
    Errno(Errno),
    TooMany,
}

/// Appends the entries of directory `path`, and `depth - 1` levels below.
fn list_into(
    root: &SandboxRoot,
    path: &SandboxPath,
    depth: u32,
    out: &mut Vec<FileInfo>,
) -> std::result::Result<(), (SandboxPath, ListError)> {
    let fail = |e| (path.clone(), ListError::Errno(e));
    let dir = root.open_dir(path).map_err(fail)?;
    let names = entry_names(&dir).map_err(fail)?;
    for name in names {
        let entry = path.join(&name.to_string_lossy());
        let info = match root.stat_at(&dir, name.as_c_str(), &entry) {
            Ok(info) => info,
            Err(Errno::NOENT) => continue, // (removed meanwhile)
            Err(e) => return Err(fail(e)),
        };
        let is_dir = info.kind == FileKind::Dir;
        out.push(info);
        if out.len() > LIST_MAX_ENTRIES {
            return Err((path.clone(), ListError::TooMany));
        }
        if is_dir && depth > 1 {
            match list_into(root, &entry, depth - 1, out) {
                Ok(()) | Err((_, ListError::Errno(Errno::NOENT | Errno::ACCESS))) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Removes directory `name` of `parent` with its contents, never following
/// a symlink (each step opens one component of an open directory).
fn remove_tree<P: rustix::path::Arg + Copy>(parent: impl AsFd, name: P) -> std::result::Result<(), Errno> {
    let dir = rustix::fs::openat(
        &parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for n in entry_names(&dir)? {
        let st = match rustix::fs::statat(&dir, n.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e),
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            remove_tree(&dir, n.as_c_str())?;
        } else {
            match rustix::fs::unlinkat(&dir, n.as_c_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR)
}

/// The names in an open directory, without `.` and `..` (as bytes: a name
/// need not be UTF-8).
pub(crate) fn entry_names(dir: impl AsFd) -> std::result::Result<Vec<CString>, Errno> {
    Ok(rustix::fs::Dir::read_from(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn metadata_keys_are_lowercased_tokens_and_values_printable_ascii() {
        let ok = checked_metadata(meta(&[("Run-Id", "run 7"), ("a.b_c~", "")])).unwrap();
        assert_eq!(ok, meta(&[("a.b_c~", ""), ("run-id", "run 7")]));
        for bad in [("", "v"), ("a b", "v"), ("a/b", "v"), ("é", "v"), ("k", "line\nbreak"), ("k", "é")] {
            assert!(checked_metadata(meta(&[bad])).is_err(), "{bad:?}");
        }
        assert!(checked_metadata(meta(&[("k", &"v".repeat(METADATA_VALUE_MAX + 1))])).is_err());
        assert!(checked_metadata(meta(&[(&"k".repeat(METADATA_KEY_MAX + 1), "v")])).is_err());
        let many: BTreeMap<String, String> = (0..=METADATA_MAX_KEYS).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(checked_metadata(many).is_err());
    }
}
