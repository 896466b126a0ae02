//! Engine configuration.

use std::path::PathBuf;

use sandtree_api::Limits;

/// Everything the engine needs to know about its host.
#[derive(Clone, Debug)]
pub struct Config {
    /// Root of Sandtree's state (`/var/lib/sandtree`).
    pub data_dir: PathBuf,
    /// Use this existing btrfs mount instead of a loop-mounted image file.
    pub btrfs_mount: Option<PathBuf>,
    /// Size of the sparse image file created on first start.
    pub image_size: u64,
    /// First host uid/gid of the range that sandboxes' ids 0..65536 map to
    /// (the daemon's own: see [`crate::uid_range`]).
    pub uid_base: u32,
    /// The host-wide claim of that range (`uid_range`), if one is held.
    pub uid_claim: Option<PathBuf>,
    /// Name of the cgroup (under each hierarchy) that holds sandboxes' cgroups.
    pub cgroup_name: String,
    /// Limits applied when a request leaves one unset.
    pub default_limits: Limits,
    /// How long a checkpoint waits for the sandbox's tasks to freeze.
    pub freeze_timeout_ms: u64,
    /// Flush the writable layer (syncfs) before freezing, so the frozen
    /// window holds only the snapshot of what was dirtied meanwhile.
    pub pre_sync: bool,
    /// How many prepared rollback targets (writable copies of recent
    /// checkpoints with their overlays mounted) to keep; 0 turns them off.
    pub spare_layers: usize,
    /// Memory the process templates of one sandbox may hold (pages their
    /// originals changed since their checkpoint) before the least recently
    /// used checkpoints' templates are evicted.
    pub template_memory_bytes: u64,
    /// Checkpoints per sandbox that keep process templates.
    pub template_checkpoints: usize,
    /// Checkpoint a sandbox in which only init runs by *freezing* its
    /// writable subvolume as the checkpoint's layer and stacking a new empty
    /// one on top (DeltaFS): no btrfs snapshot, no commit. Otherwise a
    /// checkpoint is a read-only snapshot.
    pub layered: bool,
    /// With `layered`, checkpoint a sandbox whose processes run the same
    /// way: they are stopped and moved to the new stack
    /// (`checkpoint_live.rs`); what cannot be moved makes it a snapshot.
    pub layered_processes: bool,
    /// Processes with this many resident bytes or more have the pages
    /// they write between checkpoints tracked, and their next template is
    /// made from the previous one by copying those pages, not by a fork
    /// (`sandtree-proc`'s `incremental.rs`; a process that ran no code
    /// since needs no copy at all, so the default tracks every process).
    /// `None`: every template is a fork.
    pub incremental_min_rss: Option<u64>,
    /// Read-only layers a sandbox may stack before its lower layers are
    /// squashed into one (in the background); a checkpoint over this many
    /// takes a snapshot instead of stacking another.
    pub max_layers: usize,
    /// Write a durable process image of every checkpoint with processes,
    /// after it answered (`checkpoint_image.rs`).
    pub durable_images: bool,
    /// Sandboxes' networks (`sandbox_network.rs`); `None`: this daemon
    /// gives none (every sandbox has its loopback alone).
    pub network: Option<NetworkConfig>,
}

/// How the daemon gives sandboxes a network.
#[derive(Clone, Debug)]
pub struct NetworkConfig {
    /// Host-side addresses of routers (a /30 each).
    pub range: sandtree_net::Range,
    /// Resolvers the sandboxes' DNS forwarders ask (default: the host's).
    pub upstream: Vec<std::net::SocketAddr>,
    /// Routers made ahead of creates.
    pub pool: usize,
}

impl Default for NetworkConfig {
    fn default() -> NetworkConfig {
        NetworkConfig { range: sandtree_net::Range::DEFAULT, upstream: sandtree_net::Config::host_resolvers(), pool: 8 }
    }
}

impl Config {
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Config {
        Config { data_dir: data_dir.into(), ..Config::default() }
    }

    pub fn run_dir(&self) -> PathBuf {
        self.data_dir.join("run")
    }

    pub fn meta_path(&self) -> PathBuf {
        self.data_dir.join("meta.db")
    }

    /// Where the state store is: the image under the data dir, or the
    /// given btrfs mount.
    pub fn volume_config(&self) -> sandtree_fs::VolumeConfig {
        sandtree_fs::VolumeConfig {
            data_dir: self.data_dir.clone(),
            btrfs_mount: self.btrfs_mount.clone(),
            image_size: self.image_size,
        }
    }

    pub fn host_config(&self) -> sandtree_sandbox::HostConfig {
        sandtree_sandbox::HostConfig {
            run_dir: self.run_dir(),
            uid_base: self.uid_base,
            cgroup_name: self.cgroup_name.clone(),
            store_root: Some(self.volume_config().mount_point()),
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            data_dir: PathBuf::from("/var/lib/sandtree"),
            btrfs_mount: None,
            image_size: 64 << 30,
            uid_base: crate::uid_range::LEGACY_BASE,
            uid_claim: None,
            cgroup_name: "sandtree".into(),
            default_limits: Limits { memory_bytes: Some(4 << 30), pids: Some(4096), cpu_millicores: None },
            freeze_timeout_ms: 2000,
            pre_sync: true,
            spare_layers: 64,
            template_memory_bytes: 2 << 30,
            template_checkpoints: 64,
            layered: true,
            layered_processes: true,
            incremental_min_rss: Some(0),
            max_layers: 24,
            durable_images: true,
            network: Some(NetworkConfig::default()),
        }
    }
}
