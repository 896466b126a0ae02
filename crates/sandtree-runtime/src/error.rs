//! Engine errors, and how each maps to a stable API error code.

use sandtree_api::{ApiError, ErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sandbox {0} not found: list sandboxes with `sandtree ls`")]
    SandboxNotFound(String),
    #[error("checkpoint {0} not found: list checkpoints with `sandtree tree`")]
    CheckpointNotFound(String),
    #[error("image {0} not found: list images with `sandtree images`")]
    ImageNotFound(String),
    #[error("session {0} not found in sandbox {1}")]
    SessionNotFound(String, String),
    #[error("no process {pid} {detail} in sandbox {sandbox}")]
    ProcessNotFound { sandbox: String, pid: i32, detail: String },
    #[error("no file or directory {path} in sandbox {sandbox}")]
    FileNotFound { sandbox: String, path: String },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error(
        "checkpoint {checkpoint} belongs to the tree of {checkpoint_tree}, not to that of sandbox {sandbox}: fork it instead (`sandtree fork {checkpoint}`)"
    )]
    CheckpointNotInTree { checkpoint: String, checkpoint_tree: String, sandbox: String },
    #[error(
        "checkpoint {checkpoint} is still needed by {dependents}: delete those first, or pass {} to delete it anyway (its children are then linked to its parent)",
        sandtree_api::FORCE.http
    )]
    CheckpointInUse { checkpoint: String, dependents: String },
    #[error("image {image} is used by {sandboxes} sandbox(es) and {checkpoints} checkpoint(s): delete those first")]
    ImageInUse { image: String, sandboxes: u64, checkpoints: u64 },
    #[error(
        "{op} failed: the state store is full ({detail}); nothing was changed — delete checkpoints or sandboxes, run `sandtree gc`, or grow the volume"
    )]
    NoSpace { op: &'static str, detail: String },
    #[error(
        "the processes of sandbox {sandbox} did not freeze within {timeout_ms} ms ({stuck}); they were thawed and nothing was changed"
    )]
    FreezeTimeout { sandbox: String, timeout_ms: u64, stuck: String },
    #[error(
        "checkpoint of sandbox {sandbox} refused: {detail}; nothing was changed — stop that process, or pass {} to checkpoint anyway with it marked not restorable",
        sandtree_api::BEST_EFFORT.http
    )]
    ProcessNotRestorable { sandbox: String, detail: String },
    #[error(
        "rollback of sandbox {sandbox} to {checkpoint} refused: the checkpoint's processes cannot be restored: {processes}: {reason}; nothing was changed — pass {} to restore its files alone and restart the sandbox with only its init",
        sandtree_api::ALLOW_RESTART.http
    )]
    ProcessesLost { sandbox: String, checkpoint: String, processes: String, reason: String },
    #[error(
        "fork of {checkpoint} refused: its processes cannot be copied: {processes}: {reason}; nothing was created — pass {} to fork its files alone, each fork running only its init",
        sandtree_api::FILES_ONLY.http
    )]
    ForkProcessesLost { checkpoint: String, processes: String, reason: String },
    #[error(
        "fork of {checkpoint} refused: {count} copies of its processes need about {need_mb} MB of memory ({each_mb} MB each), and the host has {available_mb} MB available; nothing was created — fork fewer at once, or pass {} to fork the files alone",
        sandtree_api::FILES_ONLY.http
    )]
    ForkNeedsMemory { checkpoint: String, count: u32, need_mb: u64, each_mb: u64, available_mb: u64 },
    #[error(
        "rollback of sandbox {sandbox} to {checkpoint} restored the files but not the processes {processes}: {reason}; the sandbox was restarted with only its init, on the checkpoint's files"
    )]
    RollbackIncomplete { sandbox: String, checkpoint: String, processes: String, reason: String },

    #[error("process state: {0}")]
    Process(sandtree_proc::Error),
    #[error("sandbox {0} is not running: start it with `sandtree start {0}`")]
    NotRunning(String),
    #[error("state store: {0}")]
    Fs(#[from] sandtree_fs::Error),
    #[error("metadata: {0}")]
    Meta(#[from] sandtree_meta::Error),
    #[error("sandbox processes: {0}")]
    Sandbox(sandtree_sandbox::Error),
    #[error("network: {0}")]
    Network(#[from] sandtree_net::Error),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<sandtree_sandbox::Error> for Error {
    fn from(e: sandtree_sandbox::Error) -> Error {
        Error::Sandbox(e)
    }
}

impl From<sandtree_sandbox::zygote::Error> for Error {
    fn from(e: sandtree_sandbox::zygote::Error) -> Error {
        Error::Internal(format!("starting the sandbox's processes: {e}"))
    }
}

impl From<sandtree_proc::Error> for Error {
    fn from(e: sandtree_proc::Error) -> Error {
        Error::Process(e)
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Error {
        Error::Internal(format!("background task failed: {e}"))
    }
}

/// The code of a sandbox error: each foreseeable cause its own, the rest
/// (I/O on init's socket, a protocol mismatch, a cgroup write) internal.
fn sandbox_code(e: &sandtree_sandbox::Error) -> ErrorCode {
    use sandtree_sandbox::Error as E;
    match e {
        E::TaskLimit => ErrorCode::PidLimitReached,
        E::Gone { .. } => ErrorCode::SandboxNotRunning,
        E::FreezeTimeout { .. } => ErrorCode::FreezeTimeout,
        E::NoSession(_) => ErrorCode::SessionNotFound,
        E::SessionTimeout => ErrorCode::Timeout,
        // A program that does not exist, a working directory that does not
        // (shell-style codes 127, 126); without a code it failed in init
        // (a fork, a pipe), not in the request.
        E::CommandNotFound { .. } | E::SpawnFailed { code: Some(_), .. } => ErrorCode::InvalidArgument,
        E::SpawnFailed { code: None, .. } => ErrorCode::Internal,
        E::Io { .. } | E::Protocol(_) | E::Busy(_) | E::Cgroup(_) => ErrorCode::Internal,
    }
}

impl Error {
    /// Wraps a state-store error of operation `op`, lifting ENOSPC to [`Error::NoSpace`].
    pub fn fs(op: &'static str, e: sandtree_fs::Error) -> Error {
        if e.is_no_space() { Error::NoSpace { op, detail: e.to_string() } } else { Error::Fs(e) }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Error::SandboxNotFound(_) => ErrorCode::SandboxNotFound,
            Error::CheckpointNotFound(_) => ErrorCode::CheckpointNotFound,
            Error::ImageNotFound(_) => ErrorCode::ImageNotFound,
            Error::SessionNotFound(..) => ErrorCode::SessionNotFound,
            Error::FileNotFound { .. } => ErrorCode::FileNotFound,
            Error::ProcessNotFound { .. } => ErrorCode::ProcessNotFound,
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::AlreadyExists(_) => ErrorCode::AlreadyExists,
            Error::CheckpointNotInTree { .. } => ErrorCode::CheckpointNotInTree,
            Error::CheckpointInUse { .. } => ErrorCode::CheckpointInUse,
            Error::ImageInUse { .. } => ErrorCode::ImageInUse,
            Error::NoSpace { .. } => ErrorCode::NoSpace,
            Error::FreezeTimeout { .. } => ErrorCode::FreezeTimeout,
            Error::NotRunning(_) => ErrorCode::SandboxNotRunning,
            Error::ProcessNotRestorable { .. } => ErrorCode::ProcessNotRestorable,
            Error::ProcessesLost { .. } | Error::ForkProcessesLost { .. } => ErrorCode::ProcessesLost,
            Error::ForkNeedsMemory { .. } => ErrorCode::NotEnoughMemory,
            Error::RollbackIncomplete { .. } => ErrorCode::RollbackIncomplete,

            Error::Process(_) => ErrorCode::Internal,
            Error::Fs(e) if e.is_no_space() => ErrorCode::NoSpace,
            Error::Network(sandtree_net::Error::Policy(_)) => ErrorCode::InvalidArgument,
            Error::Fs(_) | Error::Meta(_) | Error::Internal(_) | Error::Network(_) => ErrorCode::Internal,
            Error::Sandbox(e) => sandbox_code(e),
        }
    }

    pub fn to_api(&self) -> ApiError {
        // Include the source chain so an operator sees the errno.
        let mut message = self.to_string();
        let mut src = std::error::Error::source(self);
        while let Some(s) = src {
            let text = s.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            src = s.source();
        }
        ApiError::new(self.code(), message)
    }
}
