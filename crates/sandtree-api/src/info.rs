//! Daemon-wide information.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct VolumeInfo {
    /// Mount point of the btrfs state store.
    pub path: String,
    /// `image` (loop-mounted sparse file) or `mount` (an existing btrfs).
    pub backing: String,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
}

/// `GET /v1/info`
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct DaemonInfo {
    pub version: String,
    pub data_dir: String,
    pub volume: VolumeInfo,
    /// `v1` or `v2`.
    pub cgroup: String,
    /// First host uid/gid of this daemon's range: sandboxes' ids
    /// `0..uid_count` are the host's `uid_base..uid_base + uid_count`.
    pub uid_base: u32,
    /// Ids in the range.
    #[serde(default = "default_uid_count")]
    pub uid_count: u32,
    /// The host-wide claim file of the range (held while the daemon runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid_claim: Option<String>,
    pub sandboxes: u64,
    pub running: u64,
    pub checkpoints: u64,
    pub images: u64,
    /// Metadata database size in bytes.
    pub metadata_bytes: u64,
    /// Prepared rollback targets ready (writable copies of recent checkpoints
    /// with their overlays mounted: a rollback to one needs no btrfs commit).
    pub spare_layers: u64,
    /// Checkpoints whose live processes can be restored in place (their
    /// templates are in the pool), over all sandboxes.
    #[serde(default)]
    pub process_checkpoints: u64,
    /// Memory the process templates hold (pages their originals changed
    /// since their checkpoints).
    #[serde(default)]
    pub template_bytes: u64,
}

fn default_uid_count() -> u32 {
    65536
}
