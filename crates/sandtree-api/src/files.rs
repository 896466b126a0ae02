//! Files of a sandbox, read and written by the daemon without running a
//! program in it: what an SDK's `files.read` / `files.write` and an agent's
//! "read this file" tool need.
//!
//! Paths are the sandbox's own: absolute, or relative to the home directory
//! of `user` (default root, `/root`). They resolve inside the sandbox's
//! root as its processes see it (its mounts included); `..` and symlinks
//! never leave it (a symlink to `/etc` is the sandbox's `/etc`).
//!
//! | method | path | body → response |
//! |--------|------|-----------------|
//! | GET    | `/v1/sandboxes/{id}/files?path=P` | → the file's bytes (`application/octet-stream`) |
//! | PUT    | `/v1/sandboxes/{id}/files?path=P[&user=U][&mode=644]` | the bytes, of any length (`Content-Encoding: gzip` accepted) → 200 `FileInfo` |
//! | DELETE | `/v1/sandboxes/{id}/files?path=P[&recursive=true]` | → 204 |
//! | GET    | `/v1/sandboxes/{id}/files/stat?path=P[&follow=true]` | → `FileInfo` |
//! | GET    | `/v1/sandboxes/{id}/files/list?path=P[&depth=1]` | → `FileList` |
//! | POST   | `/v1/sandboxes/{id}/files/mkdir` | `MakeDirRequest` → 201 `FileInfo` |
//! | POST   | `/v1/sandboxes/{id}/files/move` | `MoveRequest` → `FileInfo` |
//!
//! A write replaces the file at once, never half: the bytes go to an
//! unnamed file first, which takes the path's place when the body has
//! ended (a checkpoint taken meanwhile sees the old file, or none). The
//! missing parent directories are made. A file created is owned by `user`
//! (default root) with `mode` (default `644`); a file replaced keeps its
//! owner and mode unless they are given.
//!
//! **Metadata**: a write's `X-Metadata-<key>: <value>` headers become the
//! file's metadata, which every description of it carries (`metadata`).
//! They are stored on the file as extended attributes `user.e2b.<key>`,
//! E2B's convention (so files written through either door agree, and the
//! sandbox's programs can read them with `getfattr`); keys are lowercased.
//! A write replaces the file's whole metadata, as it replaces its bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One file or directory of a sandbox (`lstat`: a symlink is described,
/// not followed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileInfo {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Its last component (`/` for the root).
    pub name: String,
    pub kind: FileKind,
    /// Size in bytes (a symlink: its target's length).
    pub size: u64,
    /// Permission bits, as octal text (`"644"`, `"4755"`).
    pub mode: String,
    /// Owner and group as the sandbox numbers them.
    pub uid: u32,
    pub gid: u32,
    /// Their names in the sandbox's `/etc/passwd` and `/etc/group`, when
    /// those name them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Last modification, RFC 3339 UTC.
    pub modified_at: String,
    /// Where a symlink points (as written in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// User-defined metadata: the file's `user.e2b.<key>` extended
    /// attributes, by key (see the module docs). Absent when it has none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// `GET /v1/sandboxes/{id}/files/list`: a directory's entries, sorted by
/// path; with `depth` > 1 the entries of subdirectories follow their own
/// entry (symlinked directories are not entered).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    /// The listed directory (absolute).
    pub path: String,
    pub entries: Vec<FileInfo>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDirRequest {
    pub path: String,
    /// Owner of the directories made (default root).
    #[serde(default)]
    pub user: Option<String>,
    /// Permission bits as octal text (default `"755"`).
    #[serde(default)]
    pub mode: Option<String>,
    /// Make missing parents too, and accept an existing directory (as
    /// `mkdir -p`). Default true; false makes exactly one directory and
    /// answers `already_exists` when the path exists.
    #[serde(default = "yes")]
    pub parents: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/sandboxes/{id}/files/move`: a rename within the sandbox
/// (across its mounts it is refused, as `rename(2)` refuses).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub from: String,
    pub to: String,
    /// Resolve relative paths against this user's home (default root).
    #[serde(default)]
    pub user: Option<String>,
    /// Replace `to` when it exists (default false: `already_exists`).
    #[serde(default)]
    pub overwrite: bool,
}
