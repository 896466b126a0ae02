//! The saved state of a sandbox's processes: plain data, separate from the
//! live tracees, serializable and versioned.
//!
//! ```text
//! ProcessTreeImage { version, processes: [ProcessImage, parents first] }
//!   ProcessImage   ids (pid, ppid, pgid, sid, in the sandbox's pid ns), comm, exe,
//!                  credentials, capabilities, umask, signal masks, registers,
//!                  cwd, root, fds: [FdImage], maps: [MapImage]
//!   FdImage        fd number, open flags, position, mount id, kind
//! ```
//!
//! Version 1 is what the template path needs: everything a template does
//! not carry by itself (registers, cwd, files on the sandbox's layers) plus
//! what the checks of [`crate::check`] look at. Memory contents live in the
//! template, not in the image.

use serde::{Deserialize, Serialize};

use crate::SandboxPid;

/// Format version of [`ProcessTreeImage`]; a reader refuses other versions.
pub const IMAGE_VERSION: u32 = 1;

/// Every captured process of a sandbox at one checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessTreeImage {
    /// [`IMAGE_VERSION`].
    pub version: u32,
    /// Parents before children.
    pub processes: Vec<ProcessImage>,
}

/// One process (single-threaded in version 1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessImage {
    /// Pid in the sandbox's pid namespace.
    pub pid: SandboxPid,
    /// Parent pid (1 = the sandbox init).
    pub ppid: SandboxPid,
    /// Process group id (in the sandbox).
    pub pgid: SandboxPid,
    /// Session id (in the sandbox).
    pub sid: SandboxPid,
    /// Whether it has a controlling terminal.
    pub has_tty: bool,
    /// The foreground process group of its controlling terminal (`stat`'s
    /// `tpgid`), when it has one whose leader was captured with it.
    #[serde(default)]
    pub tpgid: Option<SandboxPid>,
    /// `comm`.
    pub comm: String,
    /// `/proc/pid/exe` target.
    pub exe: String,
    /// Number of threads.
    pub threads: u32,
    /// Real, effective, saved and filesystem uid (host ids: as the
    /// daemon reads them in `status`).
    pub uids: [u32; 4],
    /// Real, effective, saved and filesystem gid (host ids).
    pub gids: [u32; 4],
    /// Supplementary groups (host ids).
    #[serde(default)]
    pub groups: Vec<u32>,
    /// Effective capabilities.
    pub cap_eff: u64,
    /// File mode creation mask.
    pub umask: u32,
    /// CPUs it may run on.
    #[serde(default)]
    pub affinity: Vec<u32>,
    /// Signal masks.
    pub signals: SignalMasks,
    /// Queued signals with their `siginfo_t` (thread queue first, then the
    /// process-wide one), oldest first.
    #[serde(default)]
    pub queued_signals: Vec<QueuedSignal>,
    /// General purpose registers at the checkpoint.
    pub regs: Registers,
    /// Working directory (path inside the sandbox).
    pub cwd: String,
    /// Its user may not search the working directory (or a directory
    /// above it), which a restore, done as that user, must `chdir` into:
    /// refused (`check.rs`).
    #[serde(default)]
    pub cwd_denied: bool,
    /// Its working directory had been deleted (`cwd` ends with ` (deleted)`):
    /// the mode a restore makes it again with, at its path, enters, and
    /// removes again (`process/access.rs`); `None` when that cannot be done
    /// (refused).
    #[serde(default)]
    pub cwd_remade: Option<u32>,
    /// Root directory (path inside the sandbox).
    pub root: String,
    /// Open file descriptors.
    pub fds: Vec<FdImage>,
    /// Memory mappings.
    pub maps: Vec<MapImage>,
    /// Contents of deleted-but-open files and memfds, by descriptor, saved
    /// sparsely in memfds of the daemon (not serialized).
    #[serde(skip)]
    pub ghosts: Vec<(i32, std::sync::Arc<crate::fdstate::SparseCopy>)>,
    /// Interval timers (`ITIMER_REAL`, `_VIRTUAL`, `_PROF`) as raw
    /// `struct itimerval`s (a fork does not inherit them).
    #[serde(default)]
    pub itimers: Vec<(i32, Vec<u8>)>,
    /// POSIX timers (`timer_create`; a fork does not inherit them either).
    #[serde(default)]
    pub posix_timers: Vec<PosixTimer>,
    /// Alternate signal stack (raw `stack_t`), if enabled.
    #[serde(default)]
    pub altstack: Option<Vec<u8>>,
    /// It is a child subreaper (`PR_SET_CHILD_SUBREAPER`; a fork does not
    /// inherit it).
    #[serde(default)]
    pub child_subreaper: bool,
    /// rseq registration (area, length, flags, signature).
    #[serde(default)]
    pub rseq: Option<(u64, u32, u32, u32)>,
    /// Robust futex list (head, length) of the main thread (a fork does
    /// not keep it).
    #[serde(default)]
    pub robust_list: Option<(u64, u64)>,
    /// Its threads other than the main one (made again at the restore).
    #[serde(default)]
    pub other_threads: Vec<ThreadImage>,
    /// The signal its parent gets when it ends (`SIGCHLD` but for
    /// `clone`s made otherwise; 0 for none). Read for a child of another
    /// process than init, which its parent makes again at a restore
    /// (`transplant.rs`).
    #[serde(default = "sigchld")]
    pub exit_signal: i32,
    /// It was stopped by a signal (a shell's job after Ctrl-Z): restored,
    /// it stops again.
    #[serde(default)]
    pub job_stopped: bool,
    /// Its children stopped by a signal whose stop it had not waited for
    /// (`waitid` would report it), with that signal: at a restore such a
    /// report stays, any other the restore's stop makes is taken.
    #[serde(default)]
    pub stop_reports: Vec<(SandboxPid, i32)>,
    /// Its children that had exited and that it had not waited for
    /// (zombies): made again by it at a restore, ending the same way
    /// (`process/zombies.rs`).
    #[serde(default)]
    pub zombies: Vec<ZombieImage>,
}

/// A child that had exited and that its parent had not waited for yet at
/// the checkpoint (a zombie): what its parent's `wait` and the sandbox's
/// `ps` tell of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZombieImage {
    /// Its pid in the sandbox.
    pub pid: SandboxPid,
    /// Its process group and session (in the sandbox).
    pub pgid: SandboxPid,
    pub sid: SandboxPid,
    /// `comm`.
    pub comm: String,
    /// Its wait status, as `waitpid` gives it (`stat` field 52): an exit
    /// code (`status >> 8`) or the signal that killed it (`status & 0x7f`).
    pub status: i32,
    /// The signal its parent got when it ended (`stat` field 38; 0: none).
    pub exit_signal: i32,
    /// Real, effective, saved and filesystem uid and gid (host ids).
    pub uids: [u32; 4],
    pub gids: [u32; 4],
}

fn sigchld() -> i32 {
    libc::SIGCHLD
}

/// What a fork of a process copies that only the process itself (or the
/// kernel's view of it) can tell; read from its template. A restore from
/// the image gives these to a new process, as a transplant gives its
/// template's (`transplant.rs`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ForkState {
    /// Signal handlers: signal number, raw `struct kernel_sigaction` (32 bytes).
    pub handlers: Vec<(u64, Vec<u8>)>,
    /// `PR_GET_DUMPABLE`.
    pub dumpable: u64,
    /// `PR_GET_PDEATHSIG`.
    pub death_signal: u64,
    /// `PR_GET_THP_DISABLE`.
    pub thp_disabled: u64,
    /// `personality(0xffffffff)`.
    pub personality: u64,
    /// `PR_GET_MDWE`: memory that is writable may not become executable
    /// (0: off, or the kernel has no such setting).
    #[serde(default)]
    pub mdwe: u64,
    /// The program break.
    pub brk: u64,
    /// The XSAVE area of its main thread (`PTRACE_GETREGSET`, `NT_X86_XSTATE`).
    pub xstate: Vec<u8>,
    /// Resource limits (soft, hard), by resource number.
    pub limits: Vec<(u64, u64)>,
    /// `/proc/<pid>/oom_score_adj`.
    pub oom_score_adj: String,
    /// `/proc/<pid>/timerslack_ns`.
    pub timerslack_ns: String,
    /// `/proc/<pid>/auxv`.
    pub auxv: Vec<u8>,
    /// Code, data, heap, stack, argument and environment bounds
    /// (`start_code end_code start_data end_data start_brk start_stack
    /// arg_start arg_end env_start env_end`, `stat` fields 26-28, 45-51).
    pub mm: Vec<u64>,
    /// What a fork of it copies besides memory, descriptors and handlers
    /// (`incremental::fingerprint`), for a check after a restore.
    pub fingerprint: String,
}

/// A thread other than a process's main thread: what a fork does not
/// copy of it (its memory, stack and TLS block included, is the process's).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadImage {
    /// Thread id in the sandbox's pid namespace.
    pub tid: SandboxPid,
    /// General registers (`fs_base` is its TLS).
    pub regs: Registers,
    /// CPU affinity.
    #[serde(default)]
    pub affinity: Vec<u32>,
    /// XSAVE area: x87, SSE, AVX, ... registers.
    pub xstate: Vec<u8>,
    /// Blocked signals.
    pub blocked: u64,
    /// rseq registration (area, length, flags, signature).
    pub rseq: Option<(u64, u32, u32, u32)>,
    /// Robust futex list (head, length).
    pub robust_list: (u64, u64),
    /// `clear_child_tid` (`set_tid_address`): cleared and woken at its exit
    /// (`pthread_join` waits on it).
    pub clear_child_tid: u64,
    /// Alternate signal stack (`stack_t`), if enabled.
    pub altstack: Option<Vec<u8>>,
    /// Its name (`/proc/<pid>/task/<tid>/comm`).
    pub comm: String,
    /// Signals pending for it alone, with their `siginfo_t`s (queued
    /// again for it at the restore).
    #[serde(default)]
    pub queued: Vec<QueuedSignal>,
}

/// Signal masks from `/proc/pid/status`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct SignalMasks {
    /// `SigBlk`.
    pub blocked: u64,
    /// `SigIgn`.
    pub ignored: u64,
    /// `SigCgt`.
    pub caught: u64,
    /// `SigPnd` | `ShdPnd`.
    pub pending: u64,
}

/// A pending signal and its `siginfo_t`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedSignal {
    /// Sent to the whole process (else to the thread).
    pub shared: bool,
    /// The raw 128-byte `siginfo_t`.
    pub siginfo: Vec<u8>,
}

impl QueuedSignal {
    /// Its signal (`si_signo`, the first field of its `siginfo_t`; 0 for a
    /// `siginfo_t` too short to have one).
    pub fn signo(&self) -> i32 {
        self.siginfo.get(..4).and_then(|b| b.try_into().ok()).map_or(0, i32::from_ne_bytes)
    }
}

/// `user_regs_struct` as plain fields.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registers {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub orig_rax: u64,
    pub rip: u64,
    pub cs: u64,
    pub eflags: u64,
    pub rsp: u64,
    pub ss: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
}

impl From<&sandtree_sys::ptrace::Regs> for Registers {
    fn from(r: &sandtree_sys::ptrace::Regs) -> Self {
        Registers {
            r15: r.r15,
            r14: r.r14,
            r13: r.r13,
            r12: r.r12,
            rbp: r.rbp,
            rbx: r.rbx,
            r11: r.r11,
            r10: r.r10,
            r9: r.r9,
            r8: r.r8,
            rax: r.rax,
            rcx: r.rcx,
            rdx: r.rdx,
            rsi: r.rsi,
            rdi: r.rdi,
            orig_rax: r.orig_rax,
            rip: r.rip,
            cs: r.cs,
            eflags: r.eflags,
            rsp: r.rsp,
            ss: r.ss,
            fs_base: r.fs_base,
            gs_base: r.gs_base,
            ds: r.ds,
            es: r.es,
            fs: r.fs,
            gs: r.gs,
        }
    }
}

impl Registers {
    /// Back to the kernel's layout.
    pub fn to_sys(&self) -> sandtree_sys::ptrace::Regs {
        sandtree_sys::ptrace::Regs {
            r15: self.r15,
            r14: self.r14,
            r13: self.r13,
            r12: self.r12,
            rbp: self.rbp,
            rbx: self.rbx,
            r11: self.r11,
            r10: self.r10,
            r9: self.r9,
            r8: self.r8,
            rax: self.rax,
            rcx: self.rcx,
            rdx: self.rdx,
            rsi: self.rsi,
            rdi: self.rdi,
            orig_rax: self.orig_rax,
            rip: self.rip,
            cs: self.cs,
            eflags: self.eflags,
            rsp: self.rsp,
            ss: self.ss,
            fs_base: self.fs_base,
            gs_base: self.gs_base,
            ds: self.ds,
            es: self.es,
            fs: self.fs,
            gs: self.gs,
        }
    }
}

/// One open file descriptor.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FdImage {
    /// Descriptor number.
    pub fd: i32,
    /// Open flags (`fdinfo` `flags`, `O_CLOEXEC` included).
    pub flags: u32,
    /// File position.
    pub pos: u64,
    /// Mount id (`fdinfo` `mnt_id`).
    pub mnt_id: i32,
    /// What it refers to.
    pub kind: FdKind,
    /// A lower-numbered descriptor of the process that is the same open
    /// file (a `dup`: one offset, one set of status flags), for the kinds
    /// made anew at a restore: this one is restored as a `dup` of it.
    #[serde(default)]
    pub same_as: Option<i32>,
    /// A file of the layers whose open file another captured process
    /// holds too (inherited: a build's log, a shell's redirection): that
    /// process (pid, descriptor), restored before this one, opens it again,
    /// and this one takes that very open file (one offset for both:
    /// `kinds/file.rs`).
    #[serde(default)]
    pub opened_by: Option<(SandboxPid, i32)>,
    /// An end of a pipe (or FIFO held as an `O_PATH`) that the process's
    /// user may not open (made by root before the process changed users:
    /// `subprocess.Popen(user=...)`'s pipes): the restore's daemon opens it
    /// again and hands it over (`kinds/pipe.rs`).
    #[serde(default)]
    pub daemon_opens: bool,
    /// A file of the layers its process's user may not open again (opened
    /// before it changed users: a worker's log inherited from its master):
    /// restorable only when another process opens it again and the daemon
    /// hands it over (`opened_by`), else refused in pass 2
    /// (`process::access::fd_denied`).
    #[serde(default)]
    pub reopen_denied: bool,
    /// Not a descriptor of the process: a file in flight on one of its
    /// unix sockets (sent with `SCM_RIGHTS`, not received yet), captured
    /// as a descriptor its template holds at this number
    /// (`kinds/in_flight.rs`). The restore makes it like any other, hands
    /// it to the daemon and closes it; the daemon sends it again with its
    /// message ([`SocketBuffer::passed`]).
    #[serde(default)]
    pub in_flight: bool,
}

impl FdKind {
    /// A pipe end, or a FIFO's on a mount a rollback keeps: the template
    /// holds an `O_PATH` of its inode instead (`kinds/pipe.rs`).
    pub fn held_as_o_path(&self) -> bool {
        matches!(
            self,
            FdKind::Pipe { .. } | FdKind::Fifo { kept: true, on_layer: false, .. } | FdKind::Fifo { deleted: true, .. }
        )
    }

    /// Made anew at a restore (reopened or recreated in the process),
    /// rather than kept from the template.
    pub fn recreated(&self) -> bool {
        match self {
            FdKind::LayerFile { .. } | FdKind::Deleted { .. } | FdKind::Pipe { .. } => true,
            FdKind::ShmFile { deleted, .. } => !deleted,
            k @ FdKind::KeptFile { .. } => k.terminal().is_some(),
            FdKind::PtyMaster { .. } => true,
            FdKind::Fifo { on_layer, kept, .. } => *on_layer || *kept,
            FdKind::Socket { inet: Some(_), .. } | FdKind::Socket { pair: Some(_), .. } => true,
            FdKind::Socket { tcp: Some(_), .. } => true,
            FdKind::Socket { listening: true, bound: Some(path), .. } => !path.starts_with("/proc/"),
            // A datagram socket bound to a path of the tree, not connected.
            FdKind::Socket {
                listening: false,
                stream: false,
                connected: false,
                bound: Some(path),
                bound_from,
                has_clients: false,
                ..
            } => (path.starts_with('/') && !path.starts_with("/proc/")) || bound_from.is_some(),
            FdKind::AnonInode { state: Some(AnonState::Inotify { .. }), .. } => true,
            // (One of a process that had exited at the checkpoint stays.)
            FdKind::AnonInode { state: Some(AnonState::Pidfd { pid }), .. } => pid.raw() > 0,
            _ => false,
        }
    }

    /// The index of the pseudo-terminal whose slave this is (`/dev/pts/N`).
    /// A template holds no slave (a terminal hangs up when its last slave
    /// closes, checkpoint or not): it turns each into an `O_PATH` descriptor
    /// of the slave's devpts node instead. A pty whose master a captured
    /// process holds (`master_captured`) is made anew at the restore
    /// (`kinds/pty.rs`) and its slave opened again by path; one whose
    /// master is outside (a session's, the daemon's) is opened again
    /// through that `O_PATH`, which fails (`EIO`) if that pty was closed
    /// since, even if another took its index.
    pub fn terminal(&self) -> Option<u32> {
        match self {
            FdKind::KeptFile { path, .. } => path.strip_prefix("/dev/pts/")?.parse().ok(),
            _ => None,
        }
    }

    /// A unix socket bound to a path that a restore binds again (a
    /// listener, or a datagram socket not connected): its inode.
    pub fn bound_again(&self) -> Option<u64> {
        match self {
            FdKind::Socket { ino, family, inet: None, bound: Some(_), pair: None, .. }
                if family == "unix" && self.recreated() =>
            {
                Some(*ino)
            }
            _ => None,
        }
    }

    /// A file made anew by opening (not a socket): a `dup` of one is
    /// restored as a `dup`.
    pub fn reopened_file(&self) -> bool {
        self.recreated() && !matches!(self, FdKind::Socket { .. })
    }
}

/// What a descriptor refers to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FdKind {
    /// A regular file or directory on one of the sandbox's writable layers
    /// (an overlay): reopened by path in the rolled-back tree.
    LayerFile {
        /// Path inside the sandbox.
        path: String,
        /// Opened directory.
        directory: bool,
        /// It holds a lock a restore cannot take again (a lease being
        /// broken, a delegation): refused.
        #[serde(default)]
        locked: bool,
        /// The locks held through it (`flock`, POSIX record locks of this
        /// process, OFD locks), taken again at a restore on the file
        /// reopened in the rolled-back tree (the killed original's went
        /// with the replaced tree).
        #[serde(default)]
        locks: Vec<FileLock>,
    },
    /// A file on a mount that survives rollback (`/dev`, `/proc`, devpts):
    /// the template's descriptor is used as it is.
    KeptFile {
        /// Path inside the sandbox.
        path: String,
        /// A terminal's slave ([`FdKind::terminal`]): bytes of input
        /// waiting to be read on it.
        #[serde(default)]
        unread: u32,
        /// A terminal's slave whose master a captured process holds (see
        /// [`FdKind::terminal`]).
        #[serde(default)]
        master_captured: bool,
        /// A terminal's slave whose pty was gone at the checkpoint (its
        /// master closed: the node removed, the terminal hung up; what a
        /// shell's background job holds after its session ended): a
        /// hung-up terminal's slave at the restore (`kinds/pty.rs`).
        #[serde(default)]
        hung_up: bool,
    },
    /// The master of a pseudo-terminal of the sandbox's devpts
    /// (`/dev/pts/ptmx`). A template holds none (its close must hang the
    /// terminal up, checkpoint or not): the restore makes the terminal
    /// anew, with the same index and settings (`kinds/pty.rs`).
    PtyMaster {
        /// What it held, if it could be read.
        #[serde(default)]
        state: Option<PtyState>,
    },
    /// A file whose last name was removed.
    Deleted {
        /// Path it had.
        path: String,
        /// A regular file or directory on one of the sandbox's layers (else
        /// refused).
        #[serde(default)]
        on_layer: bool,
        /// A directory (removed while open: empty): made again at its path,
        /// opened and removed again at the restore.
        #[serde(default)]
        directory: bool,
        /// A directory that the restore can make again: its path free in the
        /// checkpoint's tree, its parent a directory its user may enter and
        /// write (else refused).
        #[serde(default)]
        remade: bool,
        /// Its size.
        #[serde(default)]
        size: u64,
        /// Its permission bits (`st_mode & 0o7777`; `None` in images of
        /// before they were saved).
        #[serde(default)]
        mode: Option<u32>,
        /// Its access and modification times, ns since the epoch.
        #[serde(default)]
        times: Option<(i64, i64)>,
        /// Its owner (uid, gid: host ids).
        #[serde(default)]
        owner: Option<(u32, u32)>,
        /// Links it still has under other names (then refused).
        #[serde(default)]
        nlink: u64,
        /// Its data segments (offset, length), the rest holes: the saved
        /// contents are these segments one after the other (empty in
        /// images of before: the contents are the whole file).
        #[serde(default)]
        segments: Vec<(u64, u64)>,
    },
    /// A regular file of the sandbox's `/dev/shm` (POSIX shared memory:
    /// `shm_open`, Python's `multiprocessing`). A rollback gives `/dev/shm`
    /// a fresh tmpfs holding the checkpoint's files (`sandtree-runtime`'s
    /// `dev_shm.rs`): one with a name is opened again there by path; a
    /// deleted one lives on in the template, which keeps the descriptor,
    /// its contents saved and put back like shared memory's
    /// (`process::shared_memory`), and is opened again through it. Both with
    /// their flags, at their offsets.
    ShmFile {
        /// Path inside the sandbox (` (deleted)` taken off).
        path: String,
        /// Deleted (unlinked) while open.
        deleted: bool,
    },
    /// A file on a mount that rollback replaces but that is not a layer
    /// (a mount the sandbox made).
    OtherMount {
        /// Path inside the sandbox.
        path: String,
    },
    /// An anonymous pipe's end. The template keeps an `O_PATH` descriptor
    /// of the pipe's inode on its number (not an end: the pipe's readers
    /// and writers are the running processes' alone); the restore opens
    /// the end again through it (`kinds/pipe.rs`).
    Pipe {
        /// Inode number.
        ino: u64,
    },
    /// A named pipe (FIFO). Its buffered bytes are saved like a pipe's.
    /// On a layer it is reopened at the restore, by path in the rolled-back
    /// tree (whose inode is the one later openers of the path reach); on a
    /// kept mount (`/dev`) the template's descriptor is used as it is.
    Fifo {
        /// Path inside the sandbox.
        path: String,
        /// On one of the sandbox's layers (an overlay).
        #[serde(default)]
        on_layer: bool,
        /// On a mount that rollback keeps.
        #[serde(default)]
        kept: bool,
        /// Its last name was removed (`path` was its name): like a kept
        /// one, the template holds its inode (`O_PATH`) and the restore
        /// opens it again through it; nothing can reach it by path.
        #[serde(default)]
        deleted: bool,
    },
    /// A socket.
    Socket {
        /// Inode number.
        ino: u64,
        /// `unix`, `inet`, `inet6`, `netlink`, `other` (or `unknown`).
        family: String,
        /// Stream or seqpacket (connection-oriented).
        stream: bool,
        /// Seqpacket (a listener is bound again with its type).
        #[serde(default)]
        seqpacket: bool,
        /// Listening.
        listening: bool,
        /// Has a peer.
        connected: bool,
        /// A unix socket's filesystem address (bound path), if any.
        #[serde(default)]
        bound: Option<String>,
        /// Its socket file (at an absolute `bound` path) is no longer in
        /// the tree: removed since the bind.
        #[serde(default)]
        bound_gone: bool,
        /// A relative `bound` path whose socket file (this socket's, as
        /// sock_diag names it) is at that path from the process's working
        /// directory: its absolute path. A restore, which enters that
        /// directory first, binds it again at the same relative path.
        #[serde(default)]
        bound_from: Option<Box<str>>,
        /// Data was queued for reading.
        #[serde(default)]
        queued: bool,
        /// A connected unix socket with data queued: its peer's inode, when
        /// the data can be captured and put back through the peer (see
        /// [`SocketBuffer`]).
        #[serde(default)]
        peer: Option<u64>,
        /// An inet socket's bound address (raw `sockaddr_in`/`sockaddr_in6`)
        /// and options, for listeners and bound datagram sockets: those are
        /// re-created at restore (a template holding them would keep their
        /// port taken after the original closed it).
        #[serde(default)]
        inet: Option<InetBinding>,
        /// One end of a pair of unnamed unix sockets (`socketpair`) or of a
        /// connection through a listener, whose other end is alive (or was
        /// released, with data queued on this one): made anew at the
        /// restore (see [`UnixPair`]).
        #[serde(default)]
        pair: Option<UnixPair>,
        /// A connected unix datagram socket: the path it is connected to.
        #[serde(default)]
        peer_path: Option<String>,
        /// A unix datagram socket bound to a path that a captured datagram
        /// socket is connected to (set in pass 2): kept by the template, not
        /// bound again at the restore (the connection is to this socket).
        #[serde(default)]
        has_clients: bool,
        /// A unix listener bound to a path: the process that called
        /// `listen` (its `SO_PEERCRED`, which a client's takes), if it is
        /// in the sandbox.
        #[serde(default)]
        listened_by: Option<SandboxPid>,
        /// A unix connection to a listener not accepted yet (its peer is
        /// still in the listener's queue).
        #[serde(default)]
        not_accepted: bool,
        /// A unix stream or seqpacket connection with its peer alive that
        /// a restore does not make again (made from a connecting end bound
        /// itself, or through a listener of the abstract namespace whose
        /// name is not text): a
        /// template would hold it, and a peer's close after the checkpoint
        /// would never show. Refused.
        #[serde(default)]
        held_connection: bool,
        /// A TCP connection: its state, captured in repair mode
        /// (`kinds/tcp.rs`), made anew at the restore.
        #[serde(default)]
        tcp: Option<Box<TcpConnection>>,
        /// A UDP socket's datagrams queued for reading, captured in pass 1
        /// (`kinds/udp.rs`) and sent to it again at the restore.
        #[serde(default)]
        udp_queue: Option<Box<UdpQueue>>,
        /// An unconnected unix datagram socket bound to a path: the
        /// datagrams queued on it with their senders, captured in pass 1
        /// (`kinds/unix_datagrams.rs`) and sent to its new socket again.
        #[serde(default)]
        unix_datagrams: Option<Box<UnixDatagrams>>,
    },
    /// An anonymous inode (`eventfd`, `eventpoll`, `timerfd`, `signalfd`,
    /// `inotify`, ...).
    AnonInode {
        /// The name after `anon_inode:`.
        what: String,
        /// State that lives in the object (and must be put back at restore,
        /// since the template shares the object with the running original).
        #[serde(default)]
        state: Option<AnonState>,
    },
    /// A memfd: kept by the template (the same open file, and its
    /// mappings: the same memfd, name, inode and seals), its contents put
    /// back (`process::shared_memory`), its offset and status flags set
    /// again (`kinds/memfd.rs`).
    Memfd {
        /// Its name.
        name: String,
        /// Inode (descriptors of one memfd share it).
        #[serde(default)]
        ino: u64,
        /// Its size.
        #[serde(default)]
        size: u64,
        /// `F_GET_SEALS`.
        #[serde(default)]
        seals: u32,
        /// Made with `MFD_HUGETLB` (not captured).
        #[serde(default)]
        hugetlb: bool,
        /// Its mode bits (`MFD_NOEXEC_SEAL`, `fchmod`).
        #[serde(default)]
        mode: u32,
        /// Seals and file system were read (else it is refused).
        #[serde(default)]
        probed: bool,
    },
}

/// How to re-create a bound inet socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InetBinding {
    /// Raw `sockaddr_in` / `sockaddr_in6`.
    pub sockaddr: Vec<u8>,
    /// `SO_REUSEADDR`.
    pub reuse_addr: bool,
    /// `SO_REUSEPORT`.
    pub reuse_port: bool,
    /// `IPV6_V6ONLY` (inet6).
    pub v6only: bool,
    /// Its protocol (`SO_PROTOCOL`: TCP, UDP, UDP-Lite, ...; 0 in images
    /// of before it was saved).
    #[serde(default)]
    pub protocol: i32,
    /// The other options it had, set again before its `bind` (level,
    /// name, raw value): see `kinds::inet::OPTIONS`.
    #[serde(default)]
    pub options: Vec<(i32, i32, Vec<u8>)>,
    /// A TCP listener's connections made but not accepted yet (their
    /// other ends would come back without a peer: refused).
    #[serde(default)]
    pub not_accepted: u32,
}

/// The datagrams queued on an unconnected unix datagram socket at a
/// checkpoint (`kinds/unix_datagrams.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixDatagrams {
    /// Oldest first.
    pub datagrams: Vec<UnixDatagram>,
    /// Why they could not be captured (refused in pass 2).
    pub refused: Option<String>,
}

/// One datagram queued on a unix socket, with its sender.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixDatagram {
    /// Its sender's bound path (as bound: maybe relative); `None`: an
    /// unbound sender.
    pub from: Option<String>,
    pub bytes: Vec<u8>,
    /// The files in flight with it (`SCM_RIGHTS`): their numbers in the
    /// image of the process whose descriptor of the receiving socket holds
    /// this datagram ([`FdImage::in_flight`]; `kinds/in_flight.rs`).
    #[serde(default)]
    pub passed: Vec<i32>,
}

/// The datagrams queued on a UDP socket at a checkpoint (`kinds/udp.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpQueue {
    /// The socket's own address (`getsockname`), where they are sent
    /// again (its loopback address when it is bound to any).
    pub to: std::net::SocketAddr,
    /// Oldest first.
    pub datagrams: Vec<Datagram>,
    /// Why they could not be captured (refused in pass 2).
    pub refused: Option<String>,
}

/// One datagram queued on a socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Datagram {
    /// Its sender.
    pub from: std::net::SocketAddr,
    pub bytes: Vec<u8>,
}

/// A POSIX timer (`timer_create`), as `/proc/<pid>/timers` and
/// `timer_gettime` show it (`process/timers.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixTimer {
    /// Its id (`timer_t`), which the restore asks for again.
    pub id: i32,
    /// Its clock (`CLOCK_*`).
    pub clock: i32,
    /// `sigev_notify`: `SIGEV_SIGNAL`, `SIGEV_NONE`, `SIGEV_THREAD`, with
    /// `SIGEV_THREAD_ID` when it signals one thread.
    pub notify: i32,
    /// `sigev_signo`.
    pub signo: i32,
    /// `sigev_value` (the pointer or integer its signal carries).
    pub value: u64,
    /// With `SIGEV_THREAD_ID`: the thread, in the sandbox.
    pub thread: Option<SandboxPid>,
    /// Its setting, relative (raw `struct itimerspec`: interval, value);
    /// all zero when disarmed.
    pub setting: Vec<u8>,
}

/// A lock held through an open file, as its `fdinfo` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLock {
    /// Whose it is.
    pub kind: LockKind,
    /// A write (exclusive) lock, else a read (shared) one.
    pub write: bool,
    /// First byte (0 for `flock`).
    pub start: u64,
    /// Last byte, `None` to the end of the file and beyond.
    pub end: Option<u64>,
    /// A lease's break notice signal (`F_SETSIG`; 0: `SIGIO`).
    #[serde(default)]
    pub signal: i32,
}

/// The kinds of lock a restore takes again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LockKind {
    /// `flock`: the open file's.
    Flock,
    /// `fcntl(F_SETLK)`: the process's (its descriptor table's).
    Posix,
    /// `fcntl(F_OFD_SETLK)`: the open file's.
    Ofd,
    /// `fcntl(F_SETLEASE)`: the open file's, whose owner (the process
    /// that took it) is told of a conflicting open by a signal
    /// ([`FileLock::signal`]). Its range is the whole file.
    Lease,
}

/// A TCP connection as a checkpoint saw it, through a copy of its socket
/// in repair mode (`sandtree_sys::tcp_repair`), while every process of
/// the sandbox was stopped: what a new socket needs to carry it on, with
/// the same addresses, sequence numbers, unread and unacknowledged bytes,
/// windows and options (`kinds/tcp.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpConnection {
    /// `tcpi_state` (1: established; only those are captured).
    pub state: u8,
    /// Own address, raw (`sockaddr_in` / `sockaddr_in6`).
    pub local: Vec<u8>,
    /// The peer's address, raw.
    pub remote: Vec<u8>,
    /// Why it could not be captured (pass 2 refuses it), if so.
    #[serde(default)]
    pub refused: Option<String>,
    /// Its peer is outside the sandbox (neither loopback nor the sandbox's
    /// own address): nothing else is captured, and a restore gives the
    /// process a connection reset instead (`tcp.rs`).
    #[serde(default)]
    pub outside: bool,
    /// The next byte expected from the peer (`rcv_nxt`).
    pub recv_seq: u32,
    /// The next byte the process would send (`write_seq`).
    pub send_seq: u32,
    /// Received and not read yet.
    pub received: Vec<u8>,
    /// Written and not acknowledged by the peer yet (sent or not).
    pub sent: Vec<u8>,
    /// Of `sent`, the bytes never sent (at its end).
    pub not_sent: u32,
    /// `TCP_MAXSEG`.
    pub mss: u32,
    /// `tcpi_options` (timestamps, SACK, window scaling agreed).
    pub agreed: u8,
    /// Send and receive window shifts.
    pub wscale: (u8, u8),
    /// Its timestamp clock.
    pub timestamp: u32,
    /// `struct tcp_repair_window`, raw.
    pub window: Vec<u8>,
    /// `SO_REUSEADDR` (repair mode clears it).
    pub reuse_addr: bool,
    /// `SO_PEEK_OFF` (-1: not set).
    pub peek_offset: i32,
    /// `SO_SNDBUF`, `SO_RCVBUF` as `getsockopt` gives them.
    pub buffers: (i32, i32),
    /// Its other options (level, name, raw value): see
    /// `procfs::INET_OPTIONS`.
    pub options: Vec<(i32, i32, Vec<u8>)>,
}

/// State held by an anonymous-inode object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AnonState {
    /// A pidfd: the process it refers to, by its pid in the sandbox (the
    /// innermost of `fdinfo`'s `NSpid`; -1 when it had exited). Made anew
    /// at the restore (`pidfd_open`): the template's refers to the process
    /// the rollback kills.
    Pidfd {
        /// Pid in the sandbox.
        pid: SandboxPid,
    },
    /// An eventfd's counter.
    Eventfd {
        /// `eventfd-count`.
        count: u64,
        /// `eventfd-semaphore`: made with `EFD_SEMAPHORE` (a read gives 1).
        #[serde(default)]
        semaphore: bool,
    },
    /// A timerfd's setting.
    Timerfd {
        /// Clock id.
        clockid: i32,
        /// Time to the next expiry, ns (0: disarmed).
        value_ns: u64,
        /// Interval, ns.
        interval_ns: u64,
        /// Expirations not read yet.
        #[serde(default)]
        ticks: u64,
    },
    /// An epoll instance's watch list.
    Epoll {
        /// (watched fd, events, data).
        watches: Vec<(i32, u32, u64)>,
        /// Watched descriptor numbers that no longer name the watched file
        /// (the descriptor was closed, or dup'd and closed, or its number
        /// reused): the watch is keyed by a number the restore cannot
        /// re-create it under (refused).
        #[serde(default)]
        stale: Vec<i32>,
    },
    /// A signalfd's signal mask.
    Signalfd {
        /// Bit `n - 1` for signal `n`.
        mask: u64,
    },
    /// An inotify instance: made anew at the restore, its watches added
    /// again by path in the rolled-back tree with the same descriptors
    /// (`wd`).
    Inotify {
        /// Its watches, by ascending `wd`.
        watches: Vec<InotifyWatch>,
        /// Bytes of events not read yet (`FIONREAD`; refused if any: they
        /// cannot be read without taking them from the running process).
        #[serde(default)]
        pending: u64,
        /// Why a watch's inode could not be located (refused if set).
        #[serde(default)]
        unresolved: Option<String>,
    },
}

/// One inotify watch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InotifyWatch {
    /// Watch descriptor.
    pub wd: i32,
    /// Event mask as `inotify_add_watch` takes it (with `IN_ONESHOT`,
    /// `IN_EXCL_UNLINK`).
    pub mask: u32,
    /// Path of the watched inode inside the sandbox, at the checkpoint.
    pub path: String,
    /// The inode is a symbolic link (added again with `IN_DONT_FOLLOW`).
    #[serde(default)]
    pub dont_follow: bool,
    /// A deleted file the process itself holds open on this descriptor
    /// (`path` is its old name): the watch is added again on the file the
    /// restore makes anew there (`kinds/deleted.rs`).
    #[serde(default)]
    pub through_fd: Option<i32>,
}

/// A pseudo-terminal, as its master holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyState {
    /// Its index: the slave is `/dev/pts/<index>`.
    pub index: u32,
    /// Its settings (a raw `struct termios2`).
    pub termios: Vec<u8>,
    /// Its window size: rows, columns, width and height in pixels.
    pub winsize: [u16; 4],
    /// The slave is locked (`unlockpt` not done yet).
    pub locked: bool,
    /// Packet mode.
    pub packet: bool,
    /// Bytes of output waiting for the master to read.
    pub unread: u32,
    /// Those bytes (read in pass 1 and queued again at once, as at the
    /// restore; empty if they could not be: in packet mode, a locked slave).
    #[serde(default)]
    pub output: Vec<u8>,
    /// The slave's owner (uid, gid, host ids) and mode bits.
    #[serde(default)]
    pub slave_owner: (u32, u32, u32),
}

/// One end of a pair of connected unix sockets whose peer is alive (or,
/// of an unnamed pair, released with data queued here: `peer` 0): an
/// unnamed pair (`socketpair`), or a connection made through a listener
/// bound to a path or an abstract name (`through`). A template holds no end of one (a peer's
/// close must show as the end of the stream, checkpoint or not): the
/// restore makes the pair anew (a `socketpair` in the first restored
/// process that holds an end; a `connect` by the process that connected,
/// accepted by the daemon) and hands the ends to the processes that hold
/// them (`kinds/unix.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixPair {
    /// The peer's inode; 0: the peer of this end of an unnamed pair was
    /// released, and data is queued on it. The restore makes it anew with
    /// a peer that sends the data again and is closed once every process
    /// is back (an end of a stream then reads the end after the data).
    pub peer: u64,
    /// `SOCK_STREAM`, `SOCK_DGRAM` or `SOCK_SEQPACKET`.
    pub sock_type: i32,
    /// It was shut down for sending (`shutdown(SHUT_WR)` here, or
    /// `SHUT_RD` by the peer of a connection-oriented pair).
    pub send_shutdown: bool,
    /// It was shut down for receiving.
    pub rcv_shutdown: bool,
    /// `SO_PASSCRED` was set.
    pub passcred: bool,
    /// A connection made through a listener, not an unnamed pair.
    #[serde(default)]
    pub through: Option<Listened>,
    /// Its socket options set again on the new end, raw (level, name,
    /// value): buffer sizes and timeouts (`kinds/unix.rs`'s
    /// `PAIR_OPTIONS`).
    #[serde(default)]
    pub options: Vec<(i32, i32, Vec<u8>)>,
    /// Of an unnamed pair: the process that made it (the pid both ends'
    /// `SO_PEERCRED` names), if it is in the sandbox. When it holds an
    /// end, the restore makes the pair in it, so that the credentials name
    /// it again (`kinds/unix.rs`'s `restore_order`).
    #[serde(default)]
    pub creator: Option<SandboxPid>,
    /// Its peer was released with data unread (a stream's or seqpacket's:
    /// the next read after the queue fails with `ECONNRESET`); the new
    /// peer gets a byte it never reads before it closes.
    #[serde(default)]
    pub reset: bool,
}

/// How a unix connection made through a listener bound to a path was made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listened {
    /// The listener's path: this end's own address if it is the accepted
    /// end, else its peer's.
    pub path: String,
    /// This end is the accepted one (the listener's side).
    pub accepted: bool,
    /// Of the accepted end: the process that connected (the pid its
    /// `SO_PEERCRED` names), which makes the connection again at a restore
    /// (its peer credentials are then the same); `None` if it is not in
    /// the sandbox any more.
    pub connector: Option<SandboxPid>,
}

/// The bytes a pipe (or FIFO) held at the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeBuffer {
    /// Pipe inode.
    pub ino: u64,
    /// Device of the inode (pipefs, or the filesystem of a FIFO).
    #[serde(default)]
    pub dev: u64,
    /// Its buffered bytes, oldest first.
    pub bytes: Vec<u8>,
    /// Its capacity (`F_GETPIPE_SZ`): a FIFO made anew gets it back.
    #[serde(default)]
    pub size: usize,
    /// An anonymous pipe with an end held outside the checkpoint's
    /// processes at the checkpoint (a reader with no captured reader, or a
    /// writer with no captured writer): the daemon's output pipe of a
    /// background process, the input of a command still being fed. The
    /// restore leaves what it holds as it is: that stream belongs to the
    /// outside end, which a rollback does not rewind.
    #[serde(default)]
    pub outside: bool,
    /// The lengths of the messages `bytes` is made of, when the pipe holds
    /// more than one written in packet mode (`O_DIRECT`); empty for a
    /// byte stream.
    #[serde(default)]
    pub packets: Vec<u32>,
    /// An anonymous pipe had (a reader, a writer) at the checkpoint,
    /// anywhere: what `outside` is worked out from, once every process's
    /// ends are known.
    #[serde(skip)]
    pub ends: (bool, bool),
}

/// What was queued for reading on a connected unix socket at the
/// checkpoint. At the restore it is sent again from its peer (which a
/// template holds), so that it is queued on the socket once more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketBuffer {
    /// The receiving socket's inode.
    pub ino: u64,
    /// Its peer's inode (0: released, `UnixPair::peer`).
    pub peer: u64,
    /// A byte stream rather than messages (one per datagram or seqpacket
    /// record). A stream's bytes are one piece, or, with descriptors in
    /// flight, pieces that each end with the bytes sent with descriptors.
    pub stream: bool,
    /// The queued bytes or messages, oldest first.
    pub messages: Vec<Vec<u8>>,
    /// Descriptors in flight with them (`SCM_RIGHTS`): for each message
    /// (or stream piece) that carries some, its index and the numbers the
    /// files got in the image of the process that captured the queue
    /// ([`FdImage::in_flight`]; `kinds/in_flight.rs`), in order.
    #[serde(default)]
    pub passed: Vec<(usize, Vec<i32>)>,
    /// That process.
    #[serde(default)]
    pub passed_in: Option<SandboxPid>,
}

/// One memory mapping (`/proc/pid/maps`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapImage {
    /// Start address.
    pub start: u64,
    /// End address.
    pub end: u64,
    /// `rwxp` / `rwxs`.
    pub perms: String,
    /// File offset.
    pub offset: u64,
    /// Backing path or pseudo name (`[heap]`, `[stack]`, `[vdso]`).
    pub path: Option<String>,
    /// The backing file's device (`makedev(major, minor)`) and inode
    /// number, as `maps` shows them (0 for an anonymous mapping).
    #[serde(default)]
    pub dev: u64,
    #[serde(default)]
    pub inode: u64,
    /// Marked `MADV_DONTFORK` (`dc` in `smaps`' `VmFlags`): a fork leaves
    /// it out. Its template has it as an ordinary mapping (the mark is
    /// lifted for the template's fork); a restore marks it again.
    #[serde(default)]
    pub dont_fork: bool,
    /// The `madvise` advice the whole mapping carries (`smaps`'
    /// `VmFlags`): a mapping made anew (a transplant, a template made
    /// from an image) is given it again. Read for those only (`smaps`
    /// walks the page tables): empty in a live checkpoint's capture.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advice: Vec<Advice>,
}

/// An `madvise` advice that marks a whole mapping (a `VmFlags` word of
/// `smaps`) and changes what the kernel does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Advice {
    /// `MADV_HUGEPAGE` (`hg`): transparent huge pages wanted.
    HugePage,
    /// `MADV_NOHUGEPAGE` (`nh`).
    NoHugePage,
    /// `MADV_WIPEONFORK` (`wf`): a child of `fork` gets it zeroed.
    WipeOnFork,
    /// `MADV_DONTDUMP` (`dd`): left out of core dumps.
    DontDump,
    /// `MADV_MERGEABLE` (`mg`): KSM may merge its pages.
    Mergeable,
    /// `MADV_RANDOM` (`rr`): no read-ahead.
    Random,
    /// `MADV_SEQUENTIAL` (`sr`): aggressive read-ahead.
    Sequential,
}

impl Advice {
    /// The advice a `VmFlags` word names, if it is one.
    pub fn from_flag(flag: &str) -> Option<Advice> {
        Some(match flag {
            "hg" => Advice::HugePage,
            "nh" => Advice::NoHugePage,
            "wf" => Advice::WipeOnFork,
            "dd" => Advice::DontDump,
            "mg" => Advice::Mergeable,
            "rr" => Advice::Random,
            "sr" => Advice::Sequential,
            _ => return None,
        })
    }

    /// Its `MADV_*` value.
    pub fn madvise(self) -> i32 {
        match self {
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::WipeOnFork => libc::MADV_WIPEONFORK,
            Advice::DontDump => libc::MADV_DONTDUMP,
            Advice::Mergeable => libc::MADV_MERGEABLE,
            Advice::Random => libc::MADV_RANDOM,
            Advice::Sequential => libc::MADV_SEQUENTIAL,
        }
    }
}

impl MapImage {
    /// A `MAP_SHARED` mapping.
    pub fn shared(&self) -> bool {
        self.perms.ends_with('s')
    }

    /// Its protection (`PROT_*`), from its `rwxp`.
    pub fn prot(&self) -> i32 {
        let p = self.perms.as_bytes();
        let mut prot = libc::PROT_NONE;
        for (i, bit) in [(0, libc::PROT_READ), (1, libc::PROT_WRITE), (2, libc::PROT_EXEC)] {
            if p.get(i).is_some_and(|c| *c != b'-') {
                prot |= bit;
            }
        }
        prot
    }
}
