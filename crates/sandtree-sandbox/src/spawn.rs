//! Creating a sandbox: the zygote side and the setup of its first process.
//!
//! Sequence (daemon D, zygote Z, first sandbox process C = init):
//! 1. D calls `Zygote::spawn(spec)` -> `ZygoteRequest::Spawn` to Z.
//! 2. Z (real root, initial namespaces) creates the cgroup(s) with the
//!    limits, `<run_dir>/sandboxes/<id>` (owned `uid_base`, 0700) with an
//!    empty `root/` mount point, and builds one detached overlay mount per
//!    layer (see [`crate::overlay`]).
//! 3. Z takes a pre-cloned C from its pool (see [`preclone`]: cloned with
//!    `CLONE_NEWUSER|NEWNS|NEWPID|NEWNET|NEWIPC|NEWUTS` right after the
//!    previous request, `uid_map`/`gid_map` = `0 uid_base 65536` already
//!    written; C is pid 1 of its pid namespace and waits on a socket).
//! 4. Z binds `init.sock` (in the host's network namespace: a socket of
//!    the sandbox's would show its host path in the sandbox's
//!    `/proc/net/unix`), moves C into the cgroup(s), opens a pidfd for C
//!    and sends it the spec with the overlay mount fds and the bound
//!    socket (`SCM_RIGHTS`).
//! 5. C: `unshare(CLONE_NEWCGROUP)` (its cgroup becomes its cgroup root),
//!    `setgroups([])`, `setresgid/setresuid(0)`; makes `/` rprivate;
//!    `move_mount`s the root overlay onto `root/`, then each further layer
//!    onto `root/<target>`; mounts `proc` (nosuid,nodev,noexec), a `/dev`
//!    tmpfs with bind-mounted host null/zero/full/random/urandom/tty, a
//!    private devpts instance + `ptmx` symlink, `/dev/shm`, the fd
//!    symlinks; `listen`s on `init.sock` (the daemon takes init's pid
//!    from the peer credentials of its connection, which are those of the
//!    listening process); `pivot_root(root, root)` + detach the old root;
//!    sets the hostname, brings `lo` up, points fds 0-2 at `/dev/null`,
//!    closes every other inherited fd, names itself `sandtree:[init]`,
//!    makes itself not dumpable (see `setup_init`), installs the seccomp
//!    filter and reports "ok" on its socket. (While C waited in the pool it
//!    replaced its command line, the daemon's, with `sandtree:[init]`.)
//! 6. Z waits for that result (or the error text C sent), closes its
//!    overlay fds, replies `Spawned { pid }` + pidfd to D, and only then
//!    pre-clones the next C.
//! 7. C runs the init loop ([`crate::init`]). D connects to `init.sock`
//!    (`Sandbox::connect`).
//!
//! Kernel quirks worked around:
//! * `/proc` must be mounted inside the new root *before* `pivot_root`
//!   (after it the host `/proc` that makes the mount permissible is gone).
//! * Mounts created in a user namespace are implicitly `nodev`; device
//!   nodes therefore are bind mounts of host nodes, not `mknod`s.
//! * No host `/sys`: `root/sys` stays empty.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, symlink};
use std::path::{Path, PathBuf};

use nix::libc;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::fs::CWD;
use rustix::mount::{MoveMountFlags, move_mount};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use sandtree_sys::process::{BpfInsn, Forked, clone_namespaces, exit_now};

use crate::cgroup::{Backend, Cgroup};
use crate::config::{HostConfig, ID_RANGE, SandboxSpec};
use crate::overlay::Idmapper;

/// The name a sandbox's init gives itself (`comm`): how a process list
/// tells one (the bench warns of other sandboxes by it).
pub const INIT_NAME: &std::ffi::CStr = c"sandtree:[init]";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid spec.
    #[error("invalid sandbox spec: {0}")]
    Invalid(String),
    /// A host-side step failed.
    #[error("{op}: {source}")]
    Io {
        /// Step.
        op: String,
        /// Error.
        source: io::Error,
    },
    /// Cgroup setup failed.
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::Error),
    /// Overlay setup failed.
    #[error(transparent)]
    Overlay(#[from] crate::overlay::Error),
    /// The sandbox's first process failed during setup.
    #[error("sandbox setup failed: {0}")]
    Child(String),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

fn io<E: Into<io::Error>>(op: impl Into<String>) -> impl FnOnce(E) -> Error {
    let op = op.into();
    move |e| Error::Io { op, source: e.into() }
}

/// Long-lived state of the zygote.
pub struct ZygoteState {
    /// Host configuration.
    pub cfg: HostConfig,
    /// Cgroup layout.
    pub backend: Backend,
    /// Idmapped host directories.
    pub idmap: Idmapper,
    /// How overlays name their layers.
    pub names: crate::overlay::LayerNames,
    /// Compiled seccomp filter.
    pub seccomp: Vec<BpfInsn>,
    /// Inits cloned ahead of time (see [`preclone`]).
    pub pool: Vec<Pending>,
    /// Where sandboxes' network namespaces are made from (see
    /// [`NetMaker`]); `None`: from the host's (the kernel's shared table).
    pub net_maker: Option<NetMaker>,
}

/// Connection-table buckets of a sandbox's network namespace.
const SANDBOX_TCP_EHASH: u32 = 4096;

/// A network namespace of the zygote's own that sandboxes' namespaces are
/// made from, with `net.ipv4.tcp_child_ehash_entries` set in it: a
/// namespace gets its TCP connection table's size from the one it is made
/// from, and with this each sandbox has a table of its own, of
/// [`SANDBOX_TCP_EHASH`] buckets, instead of the host's shared one (whose
/// walk, by `/proc/<pid>/net/tcp` or a `sock_diag` dump, costs
/// milliseconds on a host with much memory, whatever the namespace
/// holds). The host's own setting is untouched.
pub struct NetMaker {
    /// The zygote's own network namespace (the host's), to go back to.
    home: OwnedFd,
    maker: OwnedFd,
}

impl NetMaker {
    /// Makes the namespace (single-threaded: the zygote enters it and
    /// comes back). An error leaves the zygote where it was.
    pub fn new() -> io::Result<NetMaker> {
        let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
        let open = |p: &str| rustix::fs::open(p, flags, rustix::fs::Mode::empty());
        let home = open("/proc/self/ns/net")?;
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
        let made = (|| -> io::Result<OwnedFd> {
            // (Opened here, the sysctl is this namespace's.)
            fs::write("/proc/sys/net/ipv4/tcp_child_ehash_entries", SANDBOX_TCP_EHASH.to_string())?;
            Ok(open("/proc/self/ns/net")?)
        })();
        rustix::thread::move_into_link_name_space(home.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))?;
        Ok(NetMaker { home, maker: made? })
    }

    /// The zygote moves into the maker's namespace, to clone an init.
    /// (A move failing changes only which table the next sandboxes get:
    /// the zygote itself uses no network.)
    fn enter(&self) {
        let net = Some(rustix::thread::LinkNameSpaceType::Network);
        if let Err(e) = rustix::thread::move_into_link_name_space(self.maker.as_fd(), net) {
            eprintln!("sandtree zygote: a sandbox shares the host's TCP connection table (setns: {e})");
        }
    }

    /// The zygote back in its own namespace, once the init is cloned (not
    /// in the init: it is in a namespace of its own already).
    fn leave(&self) {
        let net = Some(rustix::thread::LinkNameSpaceType::Network);
        if let Err(e) = rustix::thread::move_into_link_name_space(self.home.as_fd(), net) {
            eprintln!("sandtree zygote: cannot go back to the host's network namespace: {e}");
        }
    }
}

/// A sandbox's first process cloned ahead of time: its namespaces exist and
/// its uid/gid maps are written; it waits on `ctl` for its spec and overlay
/// mounts. Cloning (~0.7 ms, more while other namespaces are torn down) so
/// leaves the critical path of a create or rollback.
pub struct Pending {
    pid: i32,
    ctl: OwnedFd,
}

/// What a pending init receives (with the overlay mount fds and the bound
/// control socket, last, `SCM_RIGHTS`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Go {
    spec: SandboxSpec,
}

/// The clone flags of a sandbox's first process.
const CLONE_FLAGS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// Clones a [`Pending`] init (runs in the zygote, between requests).
///
/// The child dies with the zygote until it is given a spec
/// (`PR_SET_PDEATHSIG`), and clears that as it becomes a sandbox's init,
/// which must outlive any daemon.
pub fn preclone(st: &ZygoteState) -> Result<Pending> {
    let (z_end, c_end) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(io("socketpair"))?;
    if let Some(maker) = &st.net_maker {
        maker.enter();
    }
    let cloned = clone_namespaces(CLONE_FLAGS);
    if let (Some(maker), Err(_) | Ok(Forked::Parent(_))) = (&st.net_maker, &cloned) {
        maker.leave();
    }
    match cloned.map_err(|e| Error::Io { op: "clone".into(), source: io::Error::other(e) })? {
        Forked::Child => {
            drop(z_end);
            let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
            // The daemon's command line and environment (data dir, --tcp
            // address, ...) are not init's to show (`/proc/1/cmdline`).
            // Done while waiting: off the path of a create.
            if let Err(e) = sandtree_sys::process::replace_command_line(INIT_NAME) {
                let _ = crate::protocol::recv::<Go>(c_end.as_fd());
                let _ = crate::protocol::send(c_end.as_fd(), &format!("hide the daemon's command line: {e}"), &[]);
                exit_now(1)
            }
            let Ok(Some((go, mut overlays))) = crate::protocol::recv::<Go>(c_end.as_fd()) else { exit_now(1) };
            let _ = rustix::process::set_parent_process_death_signal(None);
            // (The bound control socket comes last.)
            let listener = if overlays.len() == go.spec.layers.len() + 1 { overlays.pop() } else { None };
            let Some(listener) = listener else {
                let _ = crate::protocol::send(c_end.as_fd(), &"init got no control socket".to_string(), &[]);
                exit_now(1)
            };
            match setup_init(&st.cfg, &go.spec, overlays, listener, &st.seccomp, c_end.as_raw_fd()) {
                Ok((listener, sigfd)) => {
                    let _ = crate::protocol::send(c_end.as_fd(), &"ok".to_string(), &[]);
                    drop(c_end);
                    crate::init::run(listener, sigfd)
                }
                Err(e) => {
                    let _ = crate::protocol::send(c_end.as_fd(), &e.to_string(), &[]);
                    exit_now(1)
                }
            }
        }
        Forked::Parent(pid) => {
            drop(c_end);
            let map = format!("0 {} {ID_RANGE}\n", st.cfg.uid_base);
            let written = fs::write(format!("/proc/{pid}/uid_map"), &map)
                .and_then(|()| fs::write(format!("/proc/{pid}/gid_map"), &map));
            if let Err(e) = written {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                return Err(io("write uid/gid map")(e));
            }
            Ok(Pending { pid, ctl: z_end })
        }
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Steps 2-6 (runs in the zygote). Returns init's host pid and a pidfd.
pub fn spawn(st: &mut ZygoteState, spec: &SandboxSpec) -> Result<(i32, OwnedFd)> {
    if !valid_id(&spec.id) {
        return Err(Error::Invalid(format!("bad id {:?}", spec.id)));
    }
    if spec.layers.first().map(|l| l.target != Path::new("/")).unwrap_or(true) {
        return Err(Error::Invalid("first layer must target /".into()));
    }
    let cfg = st.cfg.clone();
    let cgroup = Cgroup::new(st.backend.clone(), &cfg.cgroup_name, &spec.id);
    cgroup.create(&spec.limits)?;

    for dir in [cfg.run_dir.clone(), cfg.run_dir.join("sandboxes")] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&dir)
            .map_err(io(format!("mkdir {}", dir.display())))?;
    }
    let sb_dir = cfg.sandbox_dir(&spec.id);
    crate::overlay::ensure_shifted_dir(&sb_dir, cfg.uid_base, 0o700)?;
    let root = cfg.root_dir(&spec.id);
    crate::overlay::ensure_shifted_dir(&root, cfg.uid_base, 0o755)?;
    let _ = fs::remove_file(cfg.init_socket(&spec.id));

    let mut overlays = Vec::new();
    for layer in &spec.layers {
        overlays.push(crate::overlay::build(layer, &cfg, &mut st.idmap, &st.names)?);
    }
    overlays.push(bind_control(&cfg.init_socket(&spec.id))?);

    let pending = match st.pool.pop() {
        Some(p) => p,
        None => preclone(st)?,
    };
    let pid = pending.pid;
    let res = (|| -> Result<OwnedFd> {
        cgroup.add(pid)?;
        let pidfd = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(pid).ok_or_else(|| Error::Child("bad pid".into()))?,
            rustix::process::PidfdFlags::empty(),
        )
        .map_err(io("pidfd_open"))?;
        let fds: Vec<_> = overlays.iter().map(|fd| fd.as_fd()).collect();
        crate::protocol::send(pending.ctl.as_fd(), &Go { spec: spec.clone() }, &fds)
            .map_err(io("send spec to init"))?;
        Ok(pidfd)
    })();
    drop(overlays);
    let pidfd = match res {
        Ok(fd) => fd,
        Err(e) => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            return Err(e);
        }
    };
    let out = match crate::protocol::recv::<String>(pending.ctl.as_fd()) {
        Ok(Some((out, _))) => out,
        _ => String::new(),
    };
    if out != "ok" {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        return Err(Error::Child(if out.is_empty() { "init died during setup".into() } else { out }));
    }
    Ok((pid, pidfd))
}

fn mkdir_p(path: &Path, mode: u32) -> Result<()> {
    if !path.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
            .map_err(io(format!("mkdir {}", path.display())))?;
    }
    Ok(())
}

fn do_mount(src: &str, target: &Path, fstype: Option<&str>, flags: MsFlags, data: Option<&str>) -> Result<()> {
    mount(Some(src), target, fstype, flags, data).map_err(io(format!("mount {src} on {}", target.display())))
}

/// Host device nodes bind-mounted into a sandbox's `/dev`.
pub(crate) const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// A fresh `/dev/shm` (at sandbox setup, and at every rollback in place).
pub(crate) fn mount_dev_shm(shm: &Path) -> Result<()> {
    mkdir_p(shm, 0o1777)?;
    do_mount("tmpfs", shm, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=1777"))
}

/// The control socket of a sandbox's init, bound at `path` (step 4; init
/// listens).
fn bind_control(path: &Path) -> Result<OwnedFd> {
    let listener = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(io("socket"))?;
    let addr = SocketAddrUnix::new(path).map_err(io("socket path"))?;
    rustix::net::bind(&listener, &addr).map_err(io(format!("bind {}", path.display())))?;
    Ok(listener)
}

/// Step 5 (runs in C). Returns the listening socket and the SIGCHLD signalfd.
fn setup_init(
    cfg: &HostConfig,
    spec: &SandboxSpec,
    overlays: Vec<OwnedFd>,
    listener: OwnedFd,
    seccomp: &[BpfInsn],
    result_fd: i32,
) -> Result<(OwnedFd, SignalFd)> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP).map_err(io("unshare cgroup"))?;
    nix::unistd::setgroups(&[]).map_err(io("setgroups"))?;
    let root_id = nix::unistd::Gid::from_raw(0);
    nix::unistd::setresgid(root_id, root_id, root_id).map_err(io("setresgid"))?;
    let root_uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setresuid(root_uid, root_uid, root_uid).map_err(io("setresuid"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(io("make / rprivate"))?;

    let root = cfg.root_dir(&spec.id);
    for (layer, fd) in spec.layers.iter().zip(&overlays) {
        let rel = layer.target.strip_prefix("/").unwrap_or(&layer.target);
        let target = root.join(rel);
        if !rel.as_os_str().is_empty() {
            mkdir_p(&target, 0o755)?;
        }
        move_mount(fd.as_fd(), "", CWD, &target, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
            .map_err(io(format!("move_mount {}", target.display())))?;
    }
    drop(overlays);

    let proc_dir = root.join("proc");
    mkdir_p(&proc_dir, 0o555)?;
    do_mount("proc", &proc_dir, Some("proc"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None)?;
    mkdir_p(&root.join("sys"), 0o555)?;
    mkdir_p(&root.join("tmp"), 0o1777)?;
    mkdir_p(&root.join("root"), 0o700)?;

    let dev = root.join("dev");
    mkdir_p(&dev, 0o755)?;
    do_mount("tmpfs", &dev, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=755,size=65536k"))?;
    for name in DEV_NODES {
        let target = dev.join(name);
        fs::File::create(&target).map_err(io(format!("create {}", target.display())))?;
        do_mount(&format!("/dev/{name}"), &target, None, MsFlags::MS_BIND, None)?;
    }
    let pts = dev.join("pts");
    mkdir_p(&pts, 0o755)?;
    do_mount(
        "devpts",
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )?;
    let links: [(&str, &str); 5] = [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ];
    for (name, target) in links {
        symlink(target, dev.join(name)).map_err(io(format!("symlink dev/{name}")))?;
    }
    mount_dev_shm(&dev.join("shm"))?;
    // (Bound by the zygote; the peer credentials a connection gets are
    // those of the process that listens.)
    rustix::net::listen(&listener, 16).map_err(io("listen"))?;

    nix::unistd::chdir(&root).map_err(io("chdir root"))?;
    nix::unistd::pivot_root(".", ".").map_err(io("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(io("detach old root"))?;
    nix::unistd::chdir("/").map_err(io("chdir /"))?;

    nix::unistd::sethostname(&spec.hostname).map_err(io("sethostname"))?;
    sandtree_sys::netdev::set_up("lo").map_err(io("bring lo up"))?;

    sandtree_sys::process::default_signal(libc::SIGCHLD).map_err(|e| Error::Child(e.to_string()))?;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).map_err(io("sigprocmask"))?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).map_err(io("signalfd"))?;

    let null = fs::OpenOptions::new().read(true).write(true).open("/dev/null").map_err(io("open /dev/null"))?;
    rustix::stdio::dup2_stdin(&null).map_err(io("dup2"))?;
    rustix::stdio::dup2_stdout(&null).map_err(io("dup2"))?;
    rustix::stdio::dup2_stderr(&null).map_err(io("dup2"))?;
    drop(null);
    sandtree_sys::process::close_fds_except(&[listener.as_raw_fd(), sigfd.as_fd().as_raw_fd(), result_fd])
        .map_err(|e| Error::Child(e.to_string()))?;
    let _ = rustix::thread::set_name(INIT_NAME);
    // Not dumpable: the sandbox's root may not ptrace init or read its
    // memory, environment, maps, descriptors or executable's host path
    // through `/proc/1` (the daemon's memory is still in it). The change of
    // credentials above left it so only where `fs.suid_dumpable` is 0.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(io("prctl(PR_SET_DUMPABLE)"))?;
    crate::seccomp::install(seccomp).map_err(|e| Error::Child(e.to_string()))?;
    Ok((listener, sigfd))
}

/// Path helper for tests: where a sandbox's root is mounted on the host.
pub fn root_mount_point(cfg: &HostConfig, id: &str) -> PathBuf {
    cfg.root_dir(id)
}
