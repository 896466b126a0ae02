//! Sandboxes: create, describe, delete.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Resource limits of a sandbox's cgroup. `None` means the daemon default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    /// Memory limit in bytes (RAM, page cache included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks (processes + threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// CPU quota in thousandths of a core (1000 = one full core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millicores: Option<u64>,
}

/// `POST /v1/sandboxes`
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Image name; `default` (the embedded host userland) when absent.
    #[serde(default)]
    pub image: Option<String>,
    /// Free-form metadata kept with the sandbox.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: Limits,
    /// Egress (the default) or none, and the egress policy.
    #[serde(default)]
    pub network: crate::NetworkSpec,
}

/// Lifecycle state of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxStatus {
    /// Its init runs; exec, checkpoint and rollback are possible.
    Running,
    /// Its processes are gone (killed, out of memory, or the host restarted);
    /// the filesystem is intact. Any exec or `POST /start` starts it again.
    Stopped,
}

/// Resource usage of a sandbox, read from its cgroup and its btrfs layer.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    pub pids: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
    pub cpu_usec: u64,
    /// Bytes written to the sandbox's writable layer since its base (image or
    /// the checkpoint it was forked or rolled back from).
    pub disk_bytes: u64,
}

/// A sandbox as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SandboxInfo {
    pub id: String,
    pub image: String,
    pub status: SandboxStatus,
    /// Why the sandbox is not running, or what happened to its processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    pub created_at: String,
    pub labels: BTreeMap<String, String>,
    pub limits: Limits,
    pub network: crate::NetworkInfo,
    /// The checkpoint this sandbox's filesystem currently derives from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_checkpoint: Option<String>,
    /// Host pid of the sandbox's init (for operators; not meaningful inside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `POST /v1/sandboxes` response.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CreateSandboxResponse {
    pub sandbox: SandboxInfo,
    pub duration_ms: f64,
}

/// `GET /v1/sandboxes`
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxInfo>,
}

/// `DELETE /v1/sandboxes/{id}` response.
///
/// The rule: a sandbox's checkpoints outlive it (each can still seed forks)
/// unless `?checkpoints=true` asks to delete them with it. Even then a
/// checkpoint that another sandbox stands on (a fork's base) or that a
/// kept checkpoint descends from is kept, and `checkpoints_kept` says which
/// and why. Sizes are what each checkpoint adds over its parent
/// (`CheckpointInfo::size_bytes`; ones still being measured count 0).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct DeleteSandboxResponse {
    pub id: String,
    /// Checkpoints of this sandbox deleted with it (`?checkpoints=true`),
    /// children first.
    pub checkpoints_deleted: Vec<String>,
    /// What the deleted checkpoints added over their parents.
    #[serde(default)]
    pub checkpoints_deleted_bytes: u64,
    /// Checkpoints of this sandbox still stored, children first (the order
    /// in which `sandtree rm ck-…` deletes them without `--force`).
    #[serde(default)]
    pub checkpoints_kept: Vec<KeptCheckpoint>,
    /// What the kept checkpoints add over their parents.
    #[serde(default)]
    pub checkpoints_kept_bytes: u64,
    /// The above in words, with what to do.
    #[serde(default)]
    pub note: String,
    pub duration_ms: f64,
}

/// A checkpoint that outlives its deleted sandbox.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct KeptCheckpoint {
    pub id: String,
    /// What it adds over its parent (`None`: still being measured).
    pub size_bytes: Option<u64>,
    /// What still needs it: sandboxes standing on it (`sb-…`) and child
    /// checkpoints (`ck-…`). With `checkpoints=true` a checkpoint is kept
    /// only when this is not empty.
    pub needed_by: Vec<String>,
}
