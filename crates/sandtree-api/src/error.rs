//! Errors on the wire: `{"error": {"code": "...", "message": "..."}}`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Stable machine-readable error codes. Never renamed once released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request body or a parameter is malformed.
    InvalidArgument,
    /// No sandbox has that id.
    SandboxNotFound,
    /// No checkpoint has that id.
    CheckpointNotFound,
    /// No image has that name.
    ImageNotFound,
    /// No session has that id.
    SessionNotFound,
    /// No process with that pid was started through the API.
    ProcessNotFound,
    /// No file or directory at that path in the sandbox.
    FileNotFound,
    /// A resource with that name exists already.
    AlreadyExists,
    /// The checkpoint belongs to another sandbox's tree.
    CheckpointNotInTree,
    /// The checkpoint still has children or sandboxes that depend on it.
    CheckpointInUse,
    /// The image is still used by sandboxes or checkpoints.
    ImageInUse,
    /// The sandbox is not running (it was stopped or its init exited).
    SandboxNotRunning,
    /// The state store has no space left; nothing was changed.
    NoSpace,
    /// The host has not the memory the request needs (a fork of many
    /// copies of large processes); nothing was changed.
    NotEnoughMemory,
    /// The sandbox's processes did not freeze in time (tasks stuck in the kernel).
    FreezeTimeout,
    /// A process holds state the engine cannot capture yet; nothing was
    /// changed (retry with `best_effort` to checkpoint without it).
    ProcessNotRestorable,
    /// A rollback cannot restore the checkpoint's processes (their copies
    /// were killed, evicted or lost in a daemon restart); nothing was
    /// changed (retry with `allow_restart` to restore the files alone).
    ProcessesLost,
    /// A rollback restored the files but failed to restore the processes;
    /// the sandbox was restarted with only its init.
    RollbackIncomplete,
    /// The sandbox reached its limit of tasks (`limits.pids`): no process
    /// could be started.
    PidLimitReached,
    /// A bounded wait expired.
    Timeout,
    /// The request needs a bearer token (TCP listener).
    Unauthorized,
    /// The host cannot do this (missing kernel feature, wrong filesystem).
    Unsupported,
    /// An unexpected internal failure; the message has the details.
    Internal,
    /// No API route has that path (check the `/v1` prefix and the id's place).
    RouteNotFound,
    /// The route exists but not with this HTTP method.
    MethodNotAllowed,
    /// The request body is over the limit of buffered (JSON) bodies; the
    /// message names the limit and the streaming alternative.
    PayloadTooLarge,
}

impl ErrorCode {
    /// The HTTP status this code is served with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument | ErrorCode::CheckpointNotInTree => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::SandboxNotFound
            | ErrorCode::CheckpointNotFound
            | ErrorCode::ImageNotFound
            | ErrorCode::SessionNotFound
            | ErrorCode::ProcessNotFound
            | ErrorCode::FileNotFound => 404,
            ErrorCode::AlreadyExists
            | ErrorCode::CheckpointInUse
            | ErrorCode::ImageInUse
            | ErrorCode::SandboxNotRunning
            | ErrorCode::ProcessNotRestorable
            | ErrorCode::ProcessesLost => 409,
            ErrorCode::PidLimitReached => 429,
            ErrorCode::RollbackIncomplete => 500,
            ErrorCode::NoSpace | ErrorCode::NotEnoughMemory => 507,
            ErrorCode::FreezeTimeout | ErrorCode::Timeout => 504,
            ErrorCode::Unsupported => 501,
            ErrorCode::Internal => 500,
            ErrorCode::RouteNotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::PayloadTooLarge => 413,
        }
    }

    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::SandboxNotFound => "sandbox_not_found",
            ErrorCode::CheckpointNotFound => "checkpoint_not_found",
            ErrorCode::ImageNotFound => "image_not_found",
            ErrorCode::SessionNotFound => "session_not_found",
            ErrorCode::ProcessNotFound => "process_not_found",
            ErrorCode::FileNotFound => "file_not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::CheckpointNotInTree => "checkpoint_not_in_tree",
            ErrorCode::CheckpointInUse => "checkpoint_in_use",
            ErrorCode::ImageInUse => "image_in_use",
            ErrorCode::SandboxNotRunning => "sandbox_not_running",
            ErrorCode::NoSpace => "no_space",
            ErrorCode::NotEnoughMemory => "not_enough_memory",
            ErrorCode::FreezeTimeout => "freeze_timeout",
            ErrorCode::ProcessNotRestorable => "process_not_restorable",
            ErrorCode::ProcessesLost => "processes_lost",
            ErrorCode::RollbackIncomplete => "rollback_incomplete",
            ErrorCode::PidLimitReached => "pid_limit_reached",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Internal => "internal",
            ErrorCode::RouteNotFound => "route_not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::PayloadTooLarge => "payload_too_large",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as served: a stable code and a message that says what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// An option that changes the outcome a refusal names, as each interface
/// spells it. Engine messages use the HTTP spelling ([`Remedy::http`]);
/// the CLI shows its own ([`ApiError::for_cli`]), so an error always names
/// the option of the interface that was used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remedy {
    /// The API's spelling (a request field or a query parameter).
    pub http: &'static str,
    /// The CLI's spelling (a flag).
    pub cli: &'static str,
}

/// Checkpoint though a process cannot be captured.
pub const BEST_EFFORT: Remedy = Remedy { http: "\"best_effort\": true", cli: "--best-effort" };
/// Roll back the files though the processes cannot be restored.
pub const ALLOW_RESTART: Remedy = Remedy { http: "\"allow_restart\": true", cli: "--allow-restart" };
/// Fork the files alone though the processes cannot be copied.
pub const FILES_ONLY: Remedy = Remedy { http: "\"files_only\": true", cli: "--files-only" };
/// Delete a checkpoint that others depend on.
pub const FORCE: Remedy = Remedy { http: "?force=true", cli: "--force" };

const REMEDIES: [Remedy; 4] = [BEST_EFFORT, ALLOW_RESTART, FILES_ONLY, FORCE];

impl ApiError {
    /// The message with each option spelled as the CLI's flag.
    pub fn for_cli(&self) -> String {
        REMEDIES.iter().fold(self.message.clone(), |m, r| m.replace(r.http, r.cli))
    }
}

/// The JSON body of every error response.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ApiError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_message_names_the_cli_flag_instead_of_the_request_field() {
        let e = ApiError::new(
            ErrorCode::ProcessNotRestorable,
            format!("refused: stop that process, or pass {} to checkpoint anyway", BEST_EFFORT.http),
        );
        assert_eq!(e.for_cli(), "refused: stop that process, or pass --best-effort to checkpoint anyway");
        assert!(!e.for_cli().contains("best_effort"));
    }
}
