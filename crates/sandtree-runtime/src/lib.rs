#![forbid(unsafe_code)]
//! `sandtree-runtime`: the engine that owns sandboxes and their state tree.
//!
//! It composes the three lower crates:
//! - `sandtree-fs`: the btrfs volume (images, writable layers, checkpoints);
//! - `sandtree-meta`: the durable record, the commit point of every operation;
//! - `sandtree-sandbox`: the processes (zygote, namespaces, cgroups, init).
//!
//! [`uid_range`]: the host uid range a data dir's sandboxes map to, its own
//! (recorded in the data dir, claimed host-wide while its daemon runs).
//!
//! One verb per file: [`Engine::create_sandbox`] in `sandbox_create.rs`,
//! [`Engine::checkpoint`] in `sandbox_checkpoint.rs`, and so on. The order of
//! operations of each verb is documented on the verb and in ARCHITECTURE.md.
//!
//! # Locking
//! - a per-sandbox lifecycle lock serialises checkpoint, rollback, start and
//!   delete of one sandbox (two rollbacks of one sandbox run one after the other);
//! - a store-wide read/write lock lets every mutating verb run concurrently
//!   (read side) while GC, which deletes unreferenced subvolumes, runs alone
//!   (write side) so it never mistakes a half-made operation for an orphan.

mod checkpoint_delete;
mod checkpoint_fork;
mod checkpoint_image;
mod checkpoint_live;
mod config;
mod dev_shm;
mod engine;
mod error;
mod flusher;
mod gc;
mod images;
mod info;
mod layer_squash;
mod layers;
mod next_layers;
mod reaper;
mod recover;
mod sandbox_checkpoint;
mod sandbox_create;
mod sandbox_delete;
mod sandbox_exec;
mod sandbox_files;
mod sandbox_network;
mod sandbox_ports;
mod sandbox_rollback;
mod sandbox_root;
mod sandbox_session;
mod sandbox_watch;
mod shutdown;
mod spares;
mod sysv_ipc;
pub mod uid_range;
mod util;

pub use config::{Config, NetworkConfig};
pub use engine::Engine;
pub use error::{Error, Result};
pub use sandbox_exec::{ExecIo, encode_output};
pub use sandbox_files::{OpenedFile, WriteFile, checked_metadata};
pub use sandbox_network::host_table_name;
pub use sandbox_watch::{DirEvent, DirEventKind, DirWatch};
pub use sandtree_proc::{ProcessStats, TestSwitches};
pub use sandtree_sandbox::session::SessionIo;
pub use sandtree_sandbox::{
    Backend, Cgroup, HostConfig, INIT_NAME, Limits as CgroupLimits, StdinSender, StdinStream, Zygote, cgroup,
    stdin_channel,
};
pub use shutdown::{SHUTDOWN_STEP, ShutdownReport};
pub use util::rfc3339;
