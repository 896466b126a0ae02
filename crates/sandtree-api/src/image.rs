//! Images: the read-only root filesystems sandboxes start from.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ImageInfo {
    pub name: String,
    /// `default` (embedded host userland) or `imported`.
    pub kind: String,
    /// Where it was imported from.
    pub source: Option<String>,
    pub created_at: String,
    pub size_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<ImageInfo>,
}

/// `POST /v1/images`: import a rootfs from a directory or a tarball on the
/// daemon's host. Streams [`ImportEvent`] lines (`application/x-ndjson`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportImageRequest {
    pub name: String,
    /// Absolute path of a directory, `.tar`, `.tar.gz` or `.tgz` on the host.
    pub source: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImportEvent {
    Progress { phase: String, done_bytes: u64, total_bytes: u64, files: u64 },
    Done(ImageInfo),
    Error(crate::ApiError),
}
