#![forbid(unsafe_code)]
//! Sandtree sandbox processes.
//!
//! | module     | role |
//! |------------|------|
//! | `config`   | saved state: host config, sandbox spec, limits |
//! | `protocol` | daemon <-> zygote <-> init messages |
//! | `zygote`   | the single-threaded forking helper |
//! | `spawn`    | creating a sandbox (namespaces, overlays, pivot_root) |
//! | `overlay`  | overlay and idmapped lower mounts |
//! | `init`     | the in-sandbox pid 1 |
//! | `reroot`   | rollback in place: init swaps its filesystem tree |
//! | `seccomp`  | the syscall filter |
//! | `cgroup`   | cgroup v1/v2 limits, freeze, kill, usage |
//! | `sandbox`  | daemon-side live handle |
//! | `exec`     | running commands and background processes |
//! | `session`  | pty-backed interactive shells |
//! | `users`    | the sandbox's accounts, for a command run as one (`exec`'s `user`) |

pub mod cgroup;
pub mod config;
pub mod init;
pub mod overlay;
pub mod protocol;
pub mod reroot;
pub mod seccomp;
pub mod spawn;
pub mod users;
pub mod zygote;

pub use cgroup::{Backend, Cgroup, StuckTask, Usage};
pub use config::{HostConfig, Limits, LowerDir, OverlayLayer, SandboxSpec};
pub use spawn::INIT_NAME;
pub use zygote::{SpawnedInit, Zygote};
pub mod exec;
pub mod sandbox;
pub mod session;

pub use exec::{
    ExecEvent, ExecOutput, ExecRequest, ExecStream, ExitInfo, ProcessInfo, StdinSender, StdinStream, stdin_channel,
};
pub use sandbox::{Error, Result, Sandbox};
pub use session::{SessionId, SessionInfo, SessionIo, SessionOptions, SessionRunOutput};
