//! Checkpoints, rollback and fork.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ApiError, SandboxInfo};

/// What a checkpoint holds of the sandbox's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// Only the filesystem is captured; a rollback or fork restarts processes.
    NotCaptured,
    /// Every process was captured: a rollback in place restores them all.
    Captured,
    /// Captured with best effort: the processes in `unrestorable` are not
    /// restored by a rollback, those in `reparented` come back as children
    /// of init (the others exactly).
    Partial,
    /// The processes were captured, but their templates were evicted from
    /// the pool (memory budget, daemon restart): a rollback fails with
    /// `processes_lost` unless it passes `allow_restart`.
    Evicted,
}

/// What became of the checkpoint's processes in a rollback or a fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessOutcome {
    /// Every process the checkpoint captured runs again with its pid and
    /// its state (`restored_pids`); processes marked not restorable by a
    /// best-effort checkpoint are not running (the note names them).
    Restored,
    /// The checkpoint holds no process but the sandbox's init (it was
    /// taken of a stopped sandbox, or only init ran): init alone runs, as
    /// at the checkpoint.
    NoneCaptured,
    /// The processes were not copied: a fork asked for the files only
    /// (`files_only`), so each fork runs only its init.
    NotCopied,
    /// The checkpoint's processes could not be restored and the request
    /// allowed a restart (`allow_restart`): the files were restored and
    /// every process but init was killed.
    Restarted,
}

/// A process a checkpoint could not capture, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UnrestorableProcess {
    /// Pid inside the sandbox.
    pub pid: i32,
    /// Its command name.
    pub comm: String,
    /// The resource in question (`threads`, `parent`, `fd 5`, ...).
    pub resource: String,
    /// Why the engine cannot restore it yet.
    pub reason: String,
}

/// `POST /v1/sandboxes/{id}/checkpoints`
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRequest {
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Checkpoint even if some process cannot be captured: those are marked
    /// not restorable (`unrestorable`) instead of failing the checkpoint.
    #[serde(default)]
    pub best_effort: bool,
    /// Answer once the checkpoint's process image is written (durable:
    /// `process_image.state` is `durable` or `failed` in the answer).
    /// Without it the image is written after the answer.
    #[serde(default)]
    pub wait_durable: bool,
}

/// Where a checkpoint's durable process image stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ImageState {
    /// Being written (after the checkpoint answered).
    Writing,
    /// Written and synced: the processes outlive their templates.
    Durable,
    /// Not written (`error` says why).
    Failed,
}

/// A checkpoint's durable process image: written after the checkpoint, from
/// its templates; only the pages changed since the parent checkpoint's
/// image are stored.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessImageInfo {
    pub state: ImageState,
    /// The file's size.
    #[serde(default)]
    pub bytes: Option<u64>,
    /// Pages of the processes' own memory, in all.
    #[serde(default)]
    pub pages: Option<u64>,
    /// Of those, the pages stored in this image (the rest are in the parent
    /// checkpoints' images, or zeros).
    #[serde(default)]
    pub pages_written: Option<u64>,
    /// How long writing it took.
    #[serde(default)]
    pub write_ms: Option<f64>,
    /// Why it failed.
    #[serde(default)]
    pub error: Option<String>,
}

/// A checkpoint as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointInfo {
    pub id: String,
    /// The sandbox it was taken of (may be deleted since).
    pub sandbox_id: String,
    /// The checkpoint the sandbox derived from when this one was taken.
    pub parent: Option<String>,
    pub label: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub image: String,
    pub created_at: String,
    /// Bytes written between the parent checkpoint and this one (what this
    /// checkpoint adds); `null` while still being computed.
    pub size_bytes: Option<u64>,
    pub process_state: ProcessState,
    /// Pids (inside the sandbox) whose live state was captured.
    #[serde(default)]
    pub processes: Vec<i32>,
    /// Processes that were running but could not be captured (best effort).
    #[serde(default)]
    pub unrestorable: Vec<UnrestorableProcess>,
    /// Processes captured with a change (best effort): a child of another
    /// process comes back as a child of the sandbox init.
    #[serde(default)]
    pub reparented: Vec<UnrestorableProcess>,
    /// How long the sandbox's processes were stopped.
    pub frozen_ms: f64,
    pub duration_ms: f64,
    /// Its durable process image (`null`: none, no processes captured).
    #[serde(default)]
    pub process_image: Option<ProcessImageInfo>,
}

/// `POST /v1/sandboxes/{id}/checkpoints` response.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointResponse {
    pub checkpoint: CheckpointInfo,
    /// Explains `process_state` in words.
    pub note: String,
}

/// `GET /v1/checkpoints` and `GET /v1/sandboxes/{id}/checkpoints`: a forest
/// ordered parent-first; `parent` links make the tree.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    pub checkpoints: Vec<CheckpointInfo>,
}

/// `POST /v1/sandboxes/{id}/rollback`
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub checkpoint: String,
    /// When the checkpoint's processes cannot be restored (their copies
    /// were killed, evicted from the pool, or lost in a daemon restart),
    /// roll back the files anyway and restart the sandbox with only its
    /// init (`processes: restarted`). Without it such a rollback fails
    /// with `processes_lost` and changes nothing.
    #[serde(default)]
    pub allow_restart: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct RollbackResponse {
    pub sandbox: SandboxInfo,
    pub checkpoint: String,
    /// What became of the checkpoint's processes.
    pub processes: ProcessOutcome,
    /// True only when `processes` is `restarted`.
    pub processes_restarted: bool,
    /// Pids brought back with their live state (empty when restarted).
    #[serde(default)]
    pub restored_pids: Vec<i32>,
    /// Where the processes were restored from, when they were: the
    /// checkpoint's live templates (the fast path), or its durable process
    /// image (its templates were gone: a daemon restart, killed, evicted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<RestoreSource>,
    /// Connections to the outside the processes find reset (`pid N fd F:
    /// local → remote`; their peers saw a reset): a peer outside is not
    /// part of a checkpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections_reset: Vec<String>,
    pub note: String,
    pub duration_ms: f64,
}

/// Where a rollback restored the checkpoint's processes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestoreSource {
    /// Its templates: stopped copies of the processes the daemon keeps.
    Templates,
    /// Its durable process image (`process-images/<checkpoint>.img`).
    Image,
}

/// `POST /v1/checkpoints/{id}/fork`
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes to create (1..=256).
    pub count: u32,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Limits of the new sandboxes (default: those of the checkpointed sandbox).
    #[serde(default)]
    pub limits: Option<crate::Limits>,
    /// Copy only the filesystem: each fork runs only its init (no wait for
    /// the checkpoint's process image). By default the forks run copies of
    /// the checkpoint's processes, or the fork is refused, naming why.
    #[serde(default)]
    pub files_only: bool,
}

/// One fork's outcome: a sandbox, or why it failed.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ForkResult {
    pub sandbox: Option<SandboxInfo>,
    pub error: Option<ApiError>,
    /// In-sandbox pids of the checkpoint's processes running in this fork
    /// (the pids they had at the checkpoint).
    #[serde(default)]
    pub restored_pids: Vec<i32>,
    /// Connections to the outside its processes find reset (`pid N fd F:
    /// local → remote`): a peer outside is not part of a checkpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections_reset: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ForkResponse {
    pub checkpoint: String,
    pub results: Vec<ForkResult>,
    /// What the forks got of the checkpoint's processes: `restored` (each
    /// runs copies of them, made from the checkpoint's durable process
    /// image), `not_copied` (`files_only`: each runs only its init), or
    /// `none_captured` (it held none).
    pub processes: ProcessOutcome,
    /// Always false: a fork whose processes cannot be copied is refused,
    /// never restarted. Kept for older clients.
    pub processes_restarted: bool,
    pub note: String,
    pub duration_ms: f64,
}

/// `DELETE /v1/checkpoints/{id}` response.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct DeleteCheckpointResponse {
    /// Every checkpoint removed (more than one with `?force=true`).
    pub deleted: Vec<String>,
}

/// `POST /v1/gc` response.
///
/// GC deletes what no metadata row names; it never deletes a checkpoint
/// (a row): checkpoints of deleted sandboxes are counted, not removed
/// (`DELETE /v1/checkpoints/{id}` removes them).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct GcReport {
    /// Subvolumes on disk that no metadata referenced, now deleted.
    pub orphans_removed: Vec<String>,
    /// Run directories and cgroups of sandboxes that no longer exist.
    pub stale_runtime_removed: Vec<String>,
    /// Space the volume gained: its used bytes before the deletions minus
    /// after them, once btrfs has dropped the deleted subvolumes (waited
    /// for up to 10 s; writes by running sandboxes meanwhile blur it).
    #[serde(default)]
    pub bytes_freed: u64,
    /// Checkpoints whose sandbox was deleted, still stored (they can seed
    /// forks), oldest first.
    #[serde(default)]
    pub checkpoints_of_deleted_sandboxes: Vec<String>,
    /// What those checkpoints add over their parents (`size_bytes`; ones
    /// still being measured count 0).
    #[serde(default)]
    pub checkpoints_of_deleted_sandboxes_bytes: u64,
    pub duration_ms: f64,
}
