//! A template: a stopped copy-on-write copy of a process at a checkpoint,
//! kept by the tracer thread ([`Template`]), and the templates of one
//! checkpoint ([`CheckpointTemplates`]). A template's own set-up (its
//! scratch mapping, nothing of the tree pinned) and its standby's fork
//! (`standby.rs`) are its methods.

use crate::batch::SCRATCH;
use crate::check::Unrestorable;
use crate::inject::{Tracee, kill_tracee};
use crate::model::{FdKind, ProcessImage};
use crate::standby::{CLONE3_STANDBY, Forking, Standby};
use crate::{Error, HostPid, Result, SandboxPid};

/// One template: a stopped copy of a process at a checkpoint.
pub(crate) struct Template {
    pub image: ProcessImage,
    /// Host pid of the template.
    pub host: HostPid,
    /// Its pid in the sandbox.
    pub ns_pid: SandboxPid,
    /// The template itself, in a ptrace stop.
    pub tracee: Tracee,
    /// Address of its scratch mapping (0 until it is set up, once the
    /// checkpoint is over).
    pub scratch: u64,
    /// The scratch mapping is executable (batches run there, `batch.rs`).
    pub scratch_exec: bool,
    /// A fork of the template made between operations (`standby.rs`): a restore
    /// takes it with `CLONE_VM` (no page tables to copy) and it stays as
    /// the restored process's holder.
    pub standby: Option<Standby>,
    /// Its standby's fork, while it runs (`standby.rs`): no other request
    /// may be made of the template meanwhile.
    pub forking: Option<Forking>,
    /// Forking a standby failed once: restores fork the template instead.
    pub no_standby: bool,
    /// A checkpoint took its standby (`incremental.rs`).
    pub standby_taken: bool,
    /// Its standbys cannot be given a pid of ours (`clone3` with `set_tid`
    /// refused): they fork with whatever pid comes.
    pub any_pid: bool,
    /// The original's fingerprint, when it is tracked (`incremental.rs`).
    pub fingerprint: Option<String>,
    /// Made from the previous template's standby (`incremental.rs`).
    pub incremental: bool,
    /// Templates made from a standby since the last fork of the process.
    pub generation: u32,
    /// Made from a standby: the checkpoint of the template it was made
    /// over and the pages it changed over that one (written, dropped): its
    /// other pages are that template's (`durable/write.rs` reads them no
    /// more).
    pub changed_since: Option<(String, std::sync::Arc<crate::track::Delta>)>,
    /// Its pages written since the previous template and the rest, until
    /// they are written into it after the checkpoint
    /// (`Pool::write_pending`).
    pub to_write: Option<crate::incremental::Pending>,
    /// The `madvise` advice of its mappings (`smaps`), read at its first
    /// transplant (`transplant::child_of`) and kept: a template never
    /// runs, so it stays as it was.
    pub advice: Option<Vec<crate::procfs::AdvisedRange>>,
}

/// The templates of one checkpoint.
pub(crate) struct CheckpointTemplates {
    pub templates: Vec<Template>,
    /// Buffered bytes of each pipe, with a template (host pid) and fd
    /// through which the pipe is reached at restore.
    pub pipes: Vec<(crate::model::PipeBuffer, HostPid, i32)>,
    /// The contents of each shared memory object, with a template (host
    /// pid) that holds it and where, through which they are put back at
    /// restore (`process::shared_memory`).
    pub shared_memory:
        Vec<(crate::process::shared_memory::SharedMemoryCopy, HostPid, crate::process::shared_memory::Reach)>,
    /// Data queued on unix sockets, with a template (host pid) and fd of
    /// the peer it is sent from again at restore.
    pub sockets: Vec<(crate::model::SocketBuffer, HostPid, i32)>,
    /// Data queued on the ends of unix socket pairs, which the restore
    /// makes anew (`kinds/unix.rs`).
    pub pair_data: Vec<crate::model::SocketBuffer>,
    pub unrestorable: Vec<Unrestorable>,
    pub last_used: u64,
}

/// Whether a template's pending write holds its standby's fork still
/// under way (`incremental::ForkingStandby`): until `Pool::resolve_later`, the
/// template's host pid is the template forking it, its stand-in.
pub(crate) fn is_later(to_write: &Option<crate::incremental::Pending>) -> bool {
    to_write.as_ref().is_some_and(|p| p.is_later())
}

/// Kill template `host`, unless `host` is a stand-in ([`is_later`]): that
/// template is another checkpoint's; this one's standby is killed once
/// forked, when its pending write is dropped.
pub(crate) fn kill_template(host: HostPid, later: bool) {
    if !later {
        kill_tracee(host);
    }
}

impl Template {
    /// Its standby is still being forked and was taken by a checkpoint
    /// (`incremental::ForkingStandby`): until `Pool::resolve_later`, its host pid
    /// is the template forking it, its stand-in.
    pub(crate) fn deferred(&self) -> bool {
        is_later(&self.to_write)
    }

    /// Kill it (unless it is a stand-in: [`Template::deferred`]).
    pub(crate) fn kill(self) {
        kill_template(self.host, self.deferred());
    }

    /// A template's set-up: a scratch page, and nothing of the tree pinned.
    pub(crate) fn prepare(&mut self) -> Result<()> {
        let t = self;
        let image = &t.image;
        let tpl = &mut t.tracee;
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let mflags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        // Executable for batches; a process that may not map writable code
        // (PR_SET_MDWE, a seccomp or SELinux rule) gets its syscalls one at a
        // time instead.
        let rwx = rw | libc::PROT_EXEC as u64;
        let t0 = std::time::Instant::now();
        let out = tpl.syscall(libc::SYS_mmap, &[0, SCRATCH, rwx, mflags, u64::MAX, 0])?;
        let t_mmap = t0.elapsed();
        let (scratch, exec) = if (-4095..0).contains(&out.ret) {
            tracing::debug!(
                pid = image.pid.raw(),
                errno = -out.ret,
                "no executable scratch: batched calls run one at a time"
            );
            (tpl.call("mmap (scratch)", libc::SYS_mmap, &[0, SCRATCH, rw, mflags, u64::MAX, 0])?, false)
        } else {
            (out.ret as u64, true)
        };
        // The rest in one round trip (`batch.rs`).
        let mut b = crate::batch::Batch::new(scratch, exec);
        // Pin nothing of the tree this checkpoint's layer will be replaced by:
        // cwd to "/" (pivot_root moves it with the root), layer files closed
        // (reopened by path at restore).
        let root = b.path("/");
        b.call("chdir", libc::SYS_chdir, &[root]);
        // Bound inet sockets and unix listeners too: the restore makes them
        // anew, and a template holding them would keep a port (or a socket
        // file of the old tree) taken after the original closed them.
        // A pipe end (or a FIFO's on a kept mount) becomes an `O_PATH`
        // descriptor of the pipe's inode on its number (`kinds/pipe.rs`):
        // the pipe's ends are the running processes' alone, and the
        // restore opens them again through it.
        // A terminal slave likewise (`FdKind::terminal`).
        use crate::batch::Arg;
        for f in &image.fds {
            match &f.kind {
                k @ (FdKind::Pipe { .. } | FdKind::KeptFile { .. } | FdKind::Fifo { .. })
                    if f.same_as.is_none() && (k.terminal().is_some() || k.held_as_o_path()) =>
                {
                    // (A terminal by its path: a `/dev/tty` descriptor's
                    // magic link names `/dev/tty`, not the slave's node.
                    // A pty closed since the checkpoint has no node left:
                    // then through the descriptor, whatever it names, as
                    // the restore makes that pty anew or finds it hung up;
                    // so for one hung up before, whose index another pty
                    // may have taken.)
                    let gone = |path: &str| {
                        std::fs::symlink_metadata(format!("/proc/{}/root{path}", t.host))
                            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
                    };
                    let path = match k {
                        FdKind::KeptFile { path, hung_up: false, .. } if !gone(path) => b.path(path),
                        _ => b.path(&format!("/proc/self/fd/{}", f.fd)),
                    };
                    let flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
                    let o = b.call(
                        "open (O_PATH of a pipe or terminal)",
                        libc::SYS_open,
                        &[path, Arg::Val(flags), Arg::Val(0)],
                    );
                    b.move_fd(o, f.fd, f.flags);
                }
                // (Memfds stay: their numbers must stay taken while a restore
                // holds a new memfd on a spare descriptor, see `fix_up`.)
                FdKind::Memfd { .. } => continue,
                k if k.recreated() => {
                    b.call("close", libc::SYS_close, &[Arg::Val(f.fd as u64)]);
                }
                _ => continue,
            }
            if b.is_full() {
                tpl.run_batch(&mut b)?;
            }
        }
        // Leave the original's session / process group: while any task is in
        // them, their id (the original's pid) stays allocated, and the restore
        // could not have it back. (A session of the sandbox whatever its
        // leader: `process::session::made_by_session`.) The copy joins them again. (A forked
        // template left them as it was made, `checkpoint::clone_of`, and so
        // did a template of a child of another process, `process::tree`:
        // this is for one made from a standby, in its template's.)
        if image.ppid == SandboxPid::INIT && t.incremental {
            if image.sid == image.pid || crate::process::session::made_by_session(image) {
                b.call("setsid", libc::SYS_setsid, &[]);
            } else {
                let zero = crate::batch::Arg::Val(0);
                b.call("setpgid", libc::SYS_setpgid, &[zero, zero]);
            }
        }
        tpl.run_batch(&mut b)?;
        tracing::debug!(pid = image.pid.raw(), ?t_mmap, batch = ?t0.elapsed(), "template's scratch and batch");
        tpl.take_held(); // e.g. SIGCHLD meant for the original
        t.scratch = scratch;
        t.scratch_exec = exec;
        Ok(())
    }

    /// Whether `t`'s process holds enough private memory that a restore
    /// without its standby forks it for milliseconds on the rollback's path (a
    /// 100 MB Python: 2.5-4 ms, a rollback of ~7 ms instead of ~3; a shell or a
    /// small server: ~0.3 ms). After a burst of checkpoints the standbys lag
    /// behind; those of large processes are made first, since their absence is
    /// what makes a rollback slow.
    pub(crate) fn large(&self) -> bool {
        let t = self;
        const LARGE: u64 = 32 << 20;
        let private: u64 =
            t.image.maps.iter().filter(|m| !m.shared() && m.perms.starts_with("rw")).map(|m| m.end - m.start).sum();
        private >= LARGE
    }

    /// Start the injected fork of template `t`: `clone3` with `set_tid` when
    /// `ns_pid` is given, else `clone`. Parent = the template's parent (init).
    ///
    /// The standby shares the template's root and working directory
    /// (`CLONE_FS`; neither ever changes them, and what is restored from it
    /// gets a copy): a layered checkpoint's `pivot_root` moves the root of
    /// every task on the kernel's list, and a child still being forked is not
    /// on it yet; with its own copy it kept the old, detached tree and was
    /// dropped. An agent that thinks between steps made the pool fork 1 GB
    /// standbys that its next checkpoint overtook: 36 of them dropped in one
    /// bench run, each 25-100 ms of CPU beside the checkpoints. Sharing the
    /// template's, it is moved with the template.
    ///
    /// The fork runs off the tracer's CPU (the template is moved there first;
    /// `Forking::collect` pins both back). On that CPU, where the tracer and
    /// every call it injects run, a fork held the CPU for milliseconds at
    /// their wake-ups, even at nice 19: a task that ran just before (the
    /// tracer after a checkpoint, a 1 GB REPL that wrote its pages) wakes
    /// with a negative scheduler lag, and the fork keeps the CPU until that
    /// is paid (a sched trace: the REPL's injected `brk` took 3 ms instead of
    /// 30 µs). Moved off once a checkpoint began, alternating per checkpoint
    /// in one bench run: 1 GB checkpoint p50 9.7 against 15.4 ms (with a fork
    /// under way 12.8 against 16.2), 100 MB with one 4.1 against 5.2. Off
    /// from the start, alternating per fork in another run: 100 MB 4.1
    /// against 5.4 ms, 1 GB 13.2 against 15.0 (the time from the
    /// checkpoint's start to the stop, p90, 0.1 against 0.7-3 ms).
    pub(crate) fn start_standby(&mut self, ns_pid: Option<SandboxPid>) -> Result<()> {
        let t = self;
        let flags = (libc::CLONE_PARENT | libc::CLONE_FS) as u64;
        let Some(pid) = ns_pid else { return t.tracee.start_syscall_unwaited(libc::SYS_clone, &[flags, 0, 0, 0, 0]) };
        let args = crate::inject::clone_args(t.scratch + crate::inject::SET_TID_OFFSET, flags);
        crate::inject::write_clone_args(t.host, t.scratch, &args, pid)?;
        t.tracee.start_syscall_unwaited(libc::SYS_clone3, &[t.scratch, crate::inject::CLONE_ARGS_SIZE])
    }

    /// Collect `t`'s standby fork if it is done: `None` while it runs.
    pub(crate) fn poll_standby(&mut self) -> Option<()> {
        let t = self;
        let done = t.forking.as_mut()?.poll(&mut t.tracee)?;
        t.forking = None;
        t.keep(done);
        Some(())
    }

    /// Wait for `t`'s standby fork, if one is under way (a job that uses the
    /// template, or kills it, first lets the fork end).
    pub(crate) fn settle_standby(&mut self) {
        let t = self;
        if let Some(f) = t.forking.take() {
            let done = f.finish(&mut t.tracee);
            t.keep(done);
        }
    }

    /// `t`'s standby fork under way, if any, with a handle on `t` to end it
    /// by (for a checkpoint that takes the standby as its template,
    /// `incremental.rs`): `t` itself must not be asked for anything until then.
    pub(crate) fn take_forking(&mut self) -> Option<(Tracee, Forking)> {
        let t = self;
        let f = t.forking.take()?;
        Some((Tracee::new(t.host, t.tracee.saved, t.tracee.insn), f))
    }

    fn keep(&mut self, made: Result<Standby>) {
        let t = self;
        match made {
            Ok(s) => t.standby = Some(s),
            Err(Error::Remote { call: CLONE3_STANDBY, errno, .. }) => match errno.raw_os_error() {
                // The pid was taken meanwhile: another one next time.
                Some(libc::EEXIST) => tracing::debug!(pid = t.image.pid.raw(), "standby pid taken"),
                // No pid of ours for it (no CAP_SYS_ADMIN over the sandbox's
                // pid namespace): whatever pid comes, from now on.
                _ => {
                    tracing::debug!(pid = t.image.pid.raw(), "standby without a pid of ours: {errno}");
                    t.any_pid = true;
                }
            },
            // (Made again next time, from the template's root.)
            Err(e @ Error::RootMoved { .. }) => tracing::debug!(pid = t.image.pid.raw(), "standby dropped: {e}"),
            Err(e) => t.failed(e),
        }
    }

    pub(crate) fn failed(&mut self, e: Error) {
        let t = self;
        // Not again for this template (a restore forks it instead).
        t.no_standby = true;
        tracing::debug!(pid = t.image.pid.raw(), "no standby: {e}");
    }
}
