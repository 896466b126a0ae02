//! Saved state: configuration and sandbox specifications (plain data,
//! serialisable, no live kernel objects).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Host-wide settings shared by the daemon, the zygote and every init.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostConfig {
    /// Runtime directory (`<run_dir>/sandboxes/<id>`, `<run_dir>/lower/...`).
    pub run_dir: PathBuf,
    /// First host uid/gid of the range that maps to 0..65536 inside.
    pub uid_base: u32,
    /// Name of the parent cgroup (`sandtree`).
    pub cgroup_name: String,
    /// Mount point of the state store, under which layers' host paths
    /// are named `store/...` inside a sandbox (see [`crate::overlay`]);
    /// `None`: layers elsewhere than `<run_dir>/lower` show their host
    /// paths.
    #[serde(default)]
    pub store_root: Option<PathBuf>,
}

/// Size of the id range every sandbox maps.
pub const ID_RANGE: u32 = 65536;

impl HostConfig {
    /// Defaults: uid_base 1_000_000_000, cgroup `sandtree`, no store root.
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        Self { run_dir: run_dir.into(), uid_base: 1_000_000_000, cgroup_name: "sandtree".into(), store_root: None }
    }

    /// `<run_dir>/sandboxes/<id>`.
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.run_dir.join("sandboxes").join(id)
    }

    /// `<run_dir>/sandboxes/<id>/init.sock`.
    pub fn init_socket(&self, id: &str) -> PathBuf {
        self.sandbox_dir(id).join("init.sock")
    }

    /// `<run_dir>/sandboxes/<id>/root`: the mount point of the sandbox root.
    pub fn root_dir(&self, id: &str) -> PathBuf {
        self.sandbox_dir(id).join("root")
    }

    /// `<run_dir>/lower`: where idmapped host directories are attached.
    pub fn lower_dir(&self) -> PathBuf {
        self.run_dir.join("lower")
    }

    /// Where the idmapped clone of `host` is attached.
    pub fn idmapped_path(&self, host: &Path) -> PathBuf {
        self.lower_dir().join(escape_path(host))
    }
}

/// Escape a path into one directory name: `[A-Za-z0-9._-]` stay, every
/// other byte becomes `%XX` (so `/usr` is `%2Fusr`).
pub fn escape_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What to create: one sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Sandbox id (`[A-Za-z0-9_-]`, used in paths and cgroup names).
    pub id: String,
    /// Hostname inside the UTS namespace.
    pub hostname: String,
    /// Overlay layers; the one with target `/` first.
    pub layers: Vec<OverlayLayer>,
    /// Resource limits.
    pub limits: Limits,
}

/// One overlay mount of the sandbox filesystem.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OverlayLayer {
    /// Mount point inside the sandbox (`/`, `/usr`, ...).
    pub target: PathBuf,
    /// Lower directories, topmost first.
    pub lower: Vec<LowerDir>,
    /// Upper directory (files owned by `uid_base + uid`).
    pub upper: PathBuf,
    /// Overlay work directory (same filesystem as `upper`).
    pub work: PathBuf,
}

/// One lower directory of an overlay.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LowerDir {
    /// Host path.
    pub path: PathBuf,
    /// True for host directories owned by real ids (e.g. host `/usr`): they
    /// are used through an idmapped clone so they appear root-owned inside.
    /// False for trees already stored shifted (`uid_base + uid`).
    pub idmap: bool,
}

/// Resource limits; `None` = unlimited.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Limits {
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks.
    pub pids: Option<u64>,
    /// CPU quota in millicores (1000 = one core).
    pub cpu_millicores: Option<u64>,
}
