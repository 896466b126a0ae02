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
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct DeleteSandboxResponse {
    pub id: String,
    /// Checkpoints of this sandbox are kept (they can seed forks) unless
    /// `?checkpoints=true` was given; this lists the ones deleted.
    pub checkpoints_deleted: Vec<String>,
    pub duration_ms: f64,
}
