//! Incremental templates: a checkpoint's template of a tracked process
//! (`track.rs`) made from its previous template instead of by a fork.
//!
//! The previous template's *standby* (a fork of it, made between
//! operations, `standby.rs`) holds the process's memory as it was at the
//! previous checkpoint. In the frozen window the process's pages written
//! since (one `PAGEMAP_SCAN`) are copied by the process's holder, which
//! shares its address space, into its page file (`memory_holder::Copier`: an
//! injected `pwritev`, on the other CPU while the tracer clones the
//! sandbox's other processes), or read into a daemon buffer
//! (`process_vm_readv`) when it has none; the standby becomes the new
//! template, and
//! once the checkpoint is over a thread writes those pages into it
//! ([`Pending`]: a copy-on-write break a page, kept out of the window),
//! pages the process dropped are dropped in it too. Cost in the window:
//! the pages written (1,150 pages: ~1.4 ms), not the process's size (a
//! fork copies one page table entry per resident page: 100 MB in 4 KiB
//! pages ~3-4 ms, 1 GB ~12-16 ms).
//!
//! A fork copies more than memory: the descriptor table, signal handlers,
//! credentials, limits, namespaces, the mm's layout. The standby has the
//! previous template's. So a standby is used only when all of that is as
//! it was; otherwise (and when the process wrote more than a 16th of its
//! pages, where a fork is cheaper, and after [`max_generation`] templates
//! made from standbys in a row) the checkpoint forks:
//! - the memory map (`/proc/pid/maps`) is the previous template's, and
//!   every private mapping is tracked;
//! - the *fingerprint* is the same: credentials, capabilities, seccomp,
//!   no_new_privs, umask, ignored and caught signals, THP and speculation
//!   controls, locked memory, nice and scheduling policy, the mm's code,
//!   data, argument and environment bounds, limits, OOM score, personality,
//!   timer slack, namespaces, `comm`;
//! - the descriptors the template keeps (sockets, ptys, eventfds, epolls,
//!   memfds...: every kind the restore does not reopen or make anew) are
//!   the very same open files at the same numbers (`kcmp`), each pipe end's
//!   number holds an `O_PATH` of the same pipe, and the standby holds no
//!   other.
//!
//! What may differ is set in the standby: the handlers of caught signals
//! (read from the process by injected `rt_sigaction`, set in the standby),
//! the program break, and the FPU / SSE / AVX registers (a restored process
//! takes its template's). The rest of the image (registers, descriptors
//! and offsets, pending signals, timers, threads...) is read from the
//! process as for a forked template.
//!
//! When the previous template's standby is not forked yet, the standby of
//! the template before it is taken, if it is ready: the previous
//! template's changes over that one go into it first ([`OlderStandby`]). A
//! standby whose fork is still under way is taken as it is: the window does
//! not wait for the fork, the tracer collects it after the reply ([`ForkingStandby`]).
//!
//! A process that ran no code since its previous template (*quiet*: its
//! registers and FPU state are the image's, no page written but by the
//! kernel, see [`patch_quiet`]) needs none of the injected reads: the
//! standby is its template as it is.
//!
//! Not seen: `madvise` flags of a whole mapping that leave the map as it
//! was (`MADV_DONTFORK`, `MADV_WIPEONFORK`, `MADV_HUGEPAGE`); a restored
//! process then has its previous checkpoint's.

use crate::stats::{Counter, Instruments};
use crate::track::{Delta, PreviousTemplate};
use std::collections::HashSet;
use std::io;

use sandtree_sys::{ptrace, uffd};

use crate::fdstate::Seen;
use crate::inject::Tracee;
use crate::inject::kill_tracee;
use crate::model::{FdImage, FdKind, MapImage};
use crate::standby::Standby;
use crate::stop::StoppedProcess;
use crate::track::Tracking;
use crate::{Error, HostPid, Result, SandboxPid};

/// Templates made from standbys in a row before a checkpoint forks the
/// process again. Every standby is a fork of the template before it, and
/// every fork adds a level to the kernel's anon_vma chain of each private
/// mapping, which the next fork copies whole (measured here with 100
/// mappings and 100 MB: a fork takes ~0.35 ms more per level, 5.4 ms at
/// 30 levels, 74 ms at 200; forks of siblings stay at 2.5 ms). Unbounded,
/// a long session's standby forks, and the restores that fork, would grow
/// without end; a fork of the process starts a chain again at the
/// process's own level. It costs the checkpoint the fork (~2 ms more at
/// 100 MB) once every `MAX_GENERATION + 1` checkpoints. (8 against 4,
/// over 7 alternating bench runs each: checkpoint p50 5.02 against 5.33
/// ms, right-after rollback p95 4.5 against 6.5 ms.) That is for a process
/// of up to 128 MiB; a larger one goes on longer ([`max_generation`]).
pub(crate) const MAX_GENERATION: u32 = 8;

/// Templates made from standbys in a row for a process of `resident`
/// pages. The fork that ends a chain costs the checkpoint's window in
/// proportion to the process's size (1 GB: 15-90 ms here, every
/// `MAX_GENERATION + 1`th checkpoint its p95), a level of the chain costs
/// each later fork the same whatever the size (~0.3 ms per level with
/// ~100 mappings; at 1 GB, 32 levels did not show beside the page tables'
/// 12-29 ms). A chain of `g` costs `R + c g²/2` per `g` checkpoints, least
/// at `g = √(2R/c)`: it grows with the square root of the size, from
/// `MAX_GENERATION` at 128 MiB (22 at 1 GiB, at most 32).
pub(crate) fn max_generation(resident: u64) -> u32 {
    let scale = ((resident * 4096) as f64 / (128u64 << 20) as f64).sqrt();
    ((f64::from(MAX_GENERATION) * scale) as u32).clamp(MAX_GENERATION, 4 * MAX_GENERATION)
}

/// The previous template of a tracked process, for an incremental one
/// (or the one before it: [`OlderStandby`]).
pub(crate) struct Base {
    /// The process's previous template (checkpoint, host pid): what the
    /// pages written count from. The template the standby is of, unless
    /// [`Base::extra`] says otherwise.
    pub id: (String, HostPid),
    /// Its host pid (the standby's template).
    pub template: HostPid,
    /// The standby is of the template before the previous one, which had
    /// no standby ready in time: what the previous one changed over it
    /// goes into the standby first.
    pub extra: Option<OlderStandby>,
    /// Its standby, which becomes the new template (killed with the
    /// `Base` if it does not)...
    pub standby: Option<Standby>,
    /// ...or the standby's fork, still under way (with a handle on the
    /// template to end it by): it ends in the frozen window, beside the
    /// read.
    pub forking: Option<(Tracee, crate::standby::Forking)>,
    /// Its scratch mapping (address, executable): the standby's too.
    pub scratch: (u64, bool),
    /// Its memory map.
    pub maps: Vec<MapImage>,
    /// Its descriptors' flags (descriptor, `fdinfo` flags) as its image
    /// has them, which its standby's are (a fork copies the close-on-exec
    /// bits, and the template's set-up changes none); `None` when the
    /// standby is of another template ([`Base::extra`]): read from it.
    pub fd_flags: Option<Vec<(i32, u32)>>,
    /// The original's [`fingerprint`] then.
    pub fingerprint: String,
    /// The original's rseq registration then (a fork keeps it).
    pub rseq: Rseq,
    /// Templates made from a standby since the last fork of the process.
    pub generation: u32,
    /// What a process that ran no code since needs of it ([`Quiet`]);
    /// `None` when the image holds state that moves on by itself (armed
    /// interval timers) or more threads than one.
    pub quiet: Option<Quiet>,
    /// The engine's counters and test switches.
    pub instruments: std::sync::Arc<Instruments>,
}

/// What the image of the previous template says of a process that ran no
/// code since (see the module docs): its registers and alternate signal
/// stack then.
#[derive(Clone)]
pub(crate) struct Quiet {
    pub regs: crate::model::Registers,
    pub altstack: Option<Vec<u8>>,
}

impl Base {
    /// The standby, once its fork is done.
    fn take_standby(&mut self) -> Result<Standby> {
        if let Some(s) = self.standby.take() {
            return Ok(s);
        }
        match self.forking.take() {
            Some((mut tpl, f)) => f.finish(&mut tpl),
            None => Err(Error::Died { pid: self.template, how: "its standby is gone".into() }),
        }
    }
}

/// The standby a checkpoint takes: ready, or still being forked
/// ([`ForkingStandby`]).
pub(crate) enum TakenStandby {
    Ready(Standby),
    /// With the standby's pid in the sandbox (given by us) and the host
    /// pid of the template forking it (the template's stand-in until the
    /// fork ends: `Pool::resolve_later`).
    Forking(ForkingStandby, SandboxPid, HostPid),
}

impl TakenStandby {
    /// The template's host pid (the stand-in's while its standby is being
    /// forked), its pid in the sandbox, and the standby or its fork, for a
    /// [`Pending`].
    fn parts(self) -> (HostPid, SandboxPid, NextTemplate) {
        match self {
            TakenStandby::Ready(s) => (s.host, s.ns_pid, NextTemplate::Standby(s)),
            TakenStandby::Forking(l, ns_pid, from) => (from, ns_pid, NextTemplate::Forking(l)),
        }
    }
}

impl Base {
    /// The standby; or, when its fork is still under way and gives the
    /// child a pid of ours, the fork itself: the frozen window does not
    /// wait for it ([`ForkingStandby`]).
    fn take_or_defer(&mut self) -> Result<TakenStandby> {
        if self.standby.is_none()
            && let Some((mut tpl, mut f)) = self.forking.take()
        {
            let hold = self.instruments.switches.holding_standby_forks();
            match (if hold { None } else { f.poll(&mut tpl) }, f.ns_pid()) {
                (Some(done), _) => return done.map(TakenStandby::Ready),
                (None, Some(ns_pid)) => {
                    self.instruments.count(Counter::FromForksUnderWay, 1);
                    let from = tpl.tid;
                    let standby = ForkingStandby(Some((tpl, f)), self.instruments.clone());
                    return Ok(TakenStandby::Forking(standby, ns_pid, from));
                }
                (None, None) => self.forking = Some((tpl, f)),
            }
        }
        self.take_standby().map(TakenStandby::Ready)
    }
}

/// A standby whose fork was still under way when its checkpoint took it.
///
/// Why: for a 1 GB process such a fork copies ~262k page table entries
/// (10-35 ms here), longer than an agent's step that runs a command and
/// checkpoints at once (the bench's, ~20-30 ms). The frozen window waited
/// for it (5-20 ms in half the back-to-back checkpoints of a 1 GB REPL).
/// Nothing of the window needs the standby itself: the pages written go to
/// the page file or a buffer, the checks compare with the template that
/// forks it (the standby's descriptors, credentials and map are its). So
/// the checkpoint's template is set up with that template as its stand-in
/// (its `/proc` facts are the standby's), the reply goes out, and the
/// tracer thread then waits for the fork before any other job
/// (`Pool::resolve_later`): the wait overlaps the agent's next step
/// instead of the checkpoint. A fork that fails then drops the
/// checkpoint's templates, as a failed write of its pages does.
pub(crate) struct ForkingStandby(Option<(Tracee, crate::standby::Forking)>, std::sync::Arc<Instruments>);

impl ForkingStandby {
    /// Wait for the standby.
    pub(crate) fn finish(mut self) -> Result<Standby> {
        let made = match self.0.take() {
            Some((mut tpl, f)) => f.finish(&mut tpl),
            None => Err(Error::Died { pid: HostPid(0), how: "its standby is gone".into() }),
        };
        match made {
            Ok(s) if self.1.switches.take_lose_next_standby() => {
                kill_tracee(s.host);
                Err(Error::Died { pid: s.host, how: "lost on purpose (lose_next_standby_taken_while_forking)".into() })
            }
            made => made,
        }
    }
}

impl Drop for ForkingStandby {
    fn drop(&mut self) {
        if let Some((mut tpl, f)) = self.0.take()
            && let Ok(s) = f.finish(&mut tpl)
        {
            kill_tracee(s.host);
        }
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        if let Ok(s) = self.take_standby() {
            kill_tracee(s.host);
        }
    }
}

/// A standby of the template before the previous one, made the new
/// template: the previous template's [`Delta`] over it is applied first
/// (its pages read from the previous template, `from`, which is done
/// changing by then: `Pool::write_pending` writes it first).
///
/// Why: each checkpoint takes the previous template's standby, and that
/// standby can only be forked once the template's pages are written. For
/// a 1 GB process that is 3-5 ms of writes and a 10-20 ms fork (copying
/// ~262k page table entries), more than an agent's step that runs a
/// command and checkpoints at once (the bench's: ~13 ms), so the frozen
/// window waited for the fork. The template before the previous one had
/// a whole step more for its standby's fork.
#[derive(Clone)]
pub(crate) struct OlderStandby {
    pub from: HostPid,
    pub delta: std::sync::Arc<Delta>,
    /// Its dropped pages are dropped in the standby already.
    pub zapped: bool,
}

/// Resident bytes from which a process's checkpoints may start from the
/// standby of the template before the previous one ([`OlderStandby`]). Below, the
/// previous template's standby fork takes a few milliseconds (100 MB:
/// 2-3), within an agent's step, and the copies of the previous template's
/// pages that the older standby's template keeps (its own, ~4 MB a
/// checkpoint for 1,000 pages written a step) cost the pool more than the
/// rare wait they save: measured with a 100 MB REPL, 10-11 MB of pool a
/// checkpoint against 7.4-7.6, and a 64 MiB process's pool over its budget
/// lost 4 of 5 checkpoints' templates instead of 2.
pub(crate) const OLDER_STANDBY_MIN_RSS: u64 = 256 << 20;

/// An rseq registration (area, length, flags, signature).
type Rseq = Option<(u64, u32, u32, u32)>;

/// A template made from a standby.
pub(crate) struct Patched {
    pub host: HostPid,
    pub ns_pid: SandboxPid,
    pub scratch: (u64, bool),
    /// The memory map (the process's; the standby's has the scratch page).
    pub maps: Vec<MapImage>,
    /// The process's fingerprint.
    pub fingerprint: String,
    /// Its pages and the rest, written into it once the checkpoint is over.
    pub pending: Pending,
    /// Its base's generation and one.
    pub generation: u32,
    /// The process's previous template and what this one changes over it
    /// (for the next checkpoint: [`OlderStandby`]).
    pub prev: PreviousTemplate,
}

/// `/proc/<pid>/status` lines a fork copies and the standby must share.
const STATUS_KEYS: &[&str] = &[
    "Name",
    "Umask",
    "Uid",
    "Gid",
    "Groups",
    "SigIgn",
    "SigCgt",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
    "Speculation_Store_Bypass",
    "SpeculationIndirectBranch",
    "THP_enabled",
    "VmLck",
    "Mems_allowed_list",
];

/// `/proc/<pid>/stat` fields (numbered as in proc(5)): nice, rt_priority,
/// policy, start_code, end_code, start_stack, start_data, end_data,
/// start_brk, arg_start, arg_end, env_start, env_end.
const STAT_FIELDS: &[usize] = &[19, 40, 41, 26, 27, 28, 45, 46, 47, 48, 49, 50, 51];

const NAMESPACES: &[&str] = &["mnt", "net", "uts", "ipc", "user", "cgroup", "pid_for_children", "time_for_children"];

/// What a fork of process `host` copies besides its memory, descriptors
/// and signal handlers, as text (see the module docs).
/// (`status`: its `/proc/<host>/status`, when read already while it was
/// stopped.)
pub(crate) fn fingerprint(host: HostPid, status: Option<&str>) -> io::Result<String> {
    let base = format!("/proc/{host}");
    let mut out = String::with_capacity(2048);
    let read;
    let status = match status {
        Some(s) => s,
        None => {
            read = std::fs::read_to_string(format!("{base}/status"))?;
            &read
        }
    };
    for line in crate::procfs::status_lines(status, STATUS_KEYS) {
        out.push_str(line);
        out.push('\n');
    }
    let stat = std::fs::read_to_string(format!("{base}/stat"))?;
    let fields: Vec<&str> = crate::procfs::stat_fields(&stat).collect();
    for &n in STAT_FIELDS {
        // `fields` starts at field 3.
        out.push_str(fields.get(n - 3).copied().unwrap_or("?"));
        out.push(' ');
    }
    out.push('\n');
    for file in ["limits", "oom_score_adj", "personality", "timerslack_ns"] {
        out.push_str(&std::fs::read_to_string(format!("{base}/{file}"))?);
    }
    out.push_str(&crate::procfs::readlink(format!("{base}/root")).unwrap_or_default());
    out.push('\n');
    for ns in NAMESPACES {
        // (A kernel without one of them has none for anyone.)
        out.push_str(&crate::procfs::readlink(format!("{base}/ns/{ns}")).unwrap_or_default());
        out.push('\n');
    }
    Ok(out)
}

/// Why the standby cannot be used (for the log), or `None`. `fp`, `maps`
/// and `rseq` are the process's fingerprint, memory map and rseq
/// registration now.
fn mismatch(
    host: HostPid,
    base: &Base,
    (fp, maps, rseq): (&str, &[MapImage], Rseq),
    tracking: &Tracking,
    fds: &[FdImage],
) -> Option<String> {
    if fp != base.fingerprint {
        return Some("its credentials, limits, namespaces or signal dispositions changed".into());
    }
    if maps != base.maps.as_slice() {
        return Some("its memory map changed".into());
    }
    if !tracking.covers(maps) {
        return Some("a mapping is not tracked".into());
    }
    let (scratch, _) = base.scratch;
    if maps.iter().any(|m| m.start < scratch + crate::batch::SCRATCH && scratch < m.end) {
        return Some("a mapping overlaps the template's scratch page".into());
    }
    if rseq != base.rseq {
        return Some("its rseq registration changed".into());
    }
    // The descriptors the standby keeps: exactly the process's of the
    // kinds a restore does not make anew, the same files at the same
    // numbers.
    // (A fork copies the template's table: while the standby's fork runs,
    // the template's.)
    let sb = base.standby.as_ref().map(|s| s.host).unwrap_or(base.template);
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let kept: Vec<&FdImage> = fds.iter().filter(|f| template_holds(f)).collect();
    let held: HashSet<i32> = match std::fs::read_dir(format!("/proc/{sb}/fd")) {
        Ok(dir) => dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(e) => return Some(format!("the standby's descriptors: {e}")),
    };
    if held.len() != kept.len() {
        return Some("descriptors were opened or closed".into());
    }
    for f in kept {
        let fd = f.fd;
        // (A pipe end's number holds an `O_PATH` of the pipe's inode; a
        // terminal slave's, one of the slave's node.)
        let node = |pid: HostPid| std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).map(|m| (m.dev(), m.ino()));
        let same = match f.kind {
            FdKind::Pipe { ino } => std::fs::metadata(format!("/proc/{sb}/fd/{fd}"))
                .is_ok_and(|m| m.ino() == ino && m.file_type().is_fifo()),
            ref k if k.terminal().is_some() || k.held_as_o_path() => {
                node(host).ok().is_some_and(|n| node(sb).ok() == Some(n))
            }
            _ => sandtree_sys::process::same_open_file(host.raw(), fd, sb.raw(), fd).unwrap_or(false),
        };
        if !held.contains(&fd) || !same {
            return Some(format!("descriptor {fd} changed"));
        }
        // Close-on-exec is the descriptor table's, not the file's. (From
        // the image when it has them: an `fdinfo` read each, ~10 µs, on
        // the frozen window's path.)
        let cloexec = libc::O_CLOEXEC as u32;
        let flags = base
            .fd_flags
            .as_ref()
            .and_then(|v| v.iter().find(|(d, _)| *d == fd).map(|(_, fl)| *fl))
            .or_else(|| crate::procfs::fd_flags(sb, fd).ok());
        if flags.map(|fl| fl & cloexec) != Some(f.flags & cloexec) {
            return Some(format!("descriptor {fd}'s close-on-exec flag changed"));
        }
    }
    None
}

/// Whether a template holds a descriptor at `f`'s number after its set-up
/// (`Template::prepare`): one of a kind it keeps, a memfd, or the `O_PATH`
/// of a pipe end or terminal slave (a dup's number is closed).
fn template_holds(f: &FdImage) -> bool {
    match f.kind {
        FdKind::Memfd { .. } => true,
        ref k if k.held_as_o_path() => f.same_as.is_none(),
        ref k @ FdKind::KeptFile { .. } if k.terminal().is_some() => f.same_as.is_none(),
        ref k => !k.recreated(),
    }
}

/// Signal number and raw kernel `struct sigaction` (32 bytes).
type Handler = (u64, Vec<u8>);

/// What the tracer's own part of a process's pass 1 (`before`, in
/// `checkpoint.rs`) returns.
pub(crate) struct StoppedReads<B> {
    /// Its caught signals (their handlers are read from it).
    pub caught: u64,
    /// Its `/proc/<pid>/status`, as read then: a quiet process's
    /// fingerprint takes its lines from it.
    pub status: String,
    /// The caller's.
    pub rest: B,
}

/// The handlers of the signals `caught` of stopped process `orig`, read by
/// injected `rt_sigaction` into the dead space below its stack's red zone.
fn handlers(s: &StoppedProcess, orig: &mut Tracee, caught: u64) -> Result<Vec<Handler>> {
    let host = s.host;
    let buf = (s.regs.rsp - 128 - 64) & !15;
    let mut saved = [0u8; 32];
    ptrace::read_mem(host.raw(), buf, &mut saved).map_err(|e| Error::Ptrace {
        pid: host,
        op: "read stack",
        source: e,
    })?;
    let mut out = Vec::new();
    // (SIGCHLD always: SA_NOCLDWAIT / SA_NOCLDSTOP count with its default
    // disposition too.)
    let wanted = caught | 1 << (libc::SIGCHLD - 1);
    for sig in (1..=64u64).filter(|sig| wanted & (1 << (sig - 1)) != 0) {
        orig.call("rt_sigaction (read)", libc::SYS_rt_sigaction, &[sig, 0, buf, 8])?;
        let mut act = vec![0u8; 32];
        ptrace::read_mem(host.raw(), buf, &mut act).map_err(|e| Error::Ptrace { pid: host, op: "read", source: e })?;
        out.push((sig, act));
    }
    ptrace::write_mem(host.raw(), buf, &saved).map_err(|e| Error::Ptrace {
        pid: host,
        op: "restore stack",
        source: e,
    })?;
    Ok(out)
}

/// Make the template of stopped process `s` from `base`'s standby, if
/// it can be (see the module docs); `None` (the standby killed) when the
/// checkpoint must fork. Also returns the process's descriptors and what
/// `before` read.
///
/// This thread reads the program break first (an injected `brk`, which
/// takes the address space's lock for writing and would wait out the
/// scan). Then a thread on the CPU the tracer does not use lists the
/// pages written (one `PAGEMAP_SCAN`, which protects them again). This
/// thread meanwhile runs `before` (the tracer's own part of the process's
/// pass 1, which returns its caught-signal mask and what it read) and
/// reads the handlers and FPU state; once the scan is
/// done, it has the process's holder copy the pages (`copier`,
/// `memory_holder.rs`: a `pwritev` of up to 1,024 page runs into its page file,
/// single-stepped over so that it runs whole on the other CPU with no
/// entry stop to wait for), runs `during` (the other processes' pass 1;
/// taken when it ran), then takes the descriptors and the checks of the
/// rest, which the scanning thread read beside the holder's copy once it
/// started it (without a copier, this thread reads them itself), and
/// gives the holder its next runs until none is left. What
/// the holder does not take is read from the daemon (`process_vm_readv`)
/// from the end of the list by this thread once it is done with the
/// rest; without a copier, or a page file large enough, all of it is, by
/// both threads. (The calls injected meanwhile write below the stack's
/// red zone, dead space, and put back what was there; the holder's lists
/// of runs are written below those, on the main stack only, and put back
/// once the copy is done.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn patch<B>(
    s: &StoppedProcess,
    orig: &mut Tracee,
    tracking: &Tracking,
    mut base: Base,
    (rseq, mounts): (Rseq, &std::collections::HashMap<i32, sandtree_sys::mountinfo::MountEntry>),
    mut holder: Option<&mut crate::memory_holder::Copier>,
    quiet: Option<Vec<u8>>,
    before: impl FnOnce(&mut Tracee, bool) -> Result<StoppedReads<B>>,
    during: &mut Option<crate::incremental::During<'_>>,
    seen: &mut Seen,
) -> Result<(Option<Patched>, Vec<FdImage>, B)> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let host = s.host;
    let t0 = std::time::Instant::now();
    let instruments = base.instruments.clone();
    // Registers and FPU state as they were: if no page was written either,
    // the process ran no code since (see the module docs).
    // (Else the scan and the FPU state, read already, serve below.)
    let (mut scanned_first, mut xstate_read) = (None, None);
    if let Some(xstate) = quiet {
        match scan(host, &base, tracking, t0) {
            Ok(Ok(sc)) if sc.taken && sc.zap.is_empty() && as_they_were(host, base.template, &sc.copy, rseq) => {
                return patch_quiet(s, orig, tracking, base, (rseq, mounts), (xstate, sc), before, during, seen);
            }
            other => (scanned_first, xstate_read) = (Some(other), Some(xstate)),
        }
    }
    // (Any way out but the end drops `base`, which kills the standby.)
    let mut buf = take_buffer(0);
    // The holder's page file, if it has one ready: lent to the template's
    // pending write when the pages go there.
    let mut file = holder.as_mut().and_then(|h| {
        h.ready()?;
        h.file.take()
    });
    let copy: std::sync::OnceLock<Vec<(u64, u64)>> = std::sync::OnceLock::new();
    let queue: std::sync::Mutex<std::collections::VecDeque<ReadJob>> = Default::default();
    // Set once the queue holds every read there is (or there is none).
    let queued = AtomicBool::new(false);
    // The pages go to the page file (the holder may copy them), and the
    // dead space below the stack pointer its lists of runs may take.
    let to_file = AtomicBool::new(false);
    let room: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    let total = AtomicUsize::new(0);
    // What the scan found, for the checks on this thread.
    let scanned_slot: std::sync::Mutex<Option<Result<std::result::Result<Scanned, String>>>> = Default::default();
    // ...or, when the holder copies, the checks' verdict from the other
    // thread (`checks_aside` set before `queued`).
    let found_slot: std::sync::Mutex<Option<Result<FoundFds>>> = Default::default();
    let checks_aside = AtomicBool::new(false);
    let copier = holder.is_some();
    let (mut t_inject, mut t_during, mut by_holder) = (Default::default(), Default::default(), 0usize);
    let read_from_back = || -> io::Result<()> {
        loop {
            let job = pop_back(&queue);
            let Some(job) = job else { return Ok(()) };
            uffd::read_pages(host.raw(), job.ranges, job.out)?;
        }
    };
    let (buf_ref, file_ref, copy_ref, queue_ref, queued_ref, base_ref) =
        (&mut buf, &mut file, &copy, &queue, &queued, &base);
    let (to_file_ref, room_ref, total_ref, scanned_ref) = (&to_file, &room, &total, &scanned_slot);
    let (found_ref, checks_aside_ref) = (&found_slot, &checks_aside);
    let sp = s.regs.rsp;
    let aside = move || {
        // (Moved in: the jobs borrow the buffers for as long as they live.)
        let (buf_ref, file_ref) = (buf_ref, file_ref);
        // The scan first: the copy starts once it is done.
        let scanned = scanned_first.unwrap_or_else(|| scan(host, base_ref, tracking, t0)).map(|r| {
            r.map(|mut sc| {
                total_ref.store(sc.total, Ordering::Relaxed);
                let out: &mut [u8] = match file_ref.as_mut() {
                    Some(f) if f.len() >= sc.total && sc.total > 0 => {
                        to_file_ref.store(true, Ordering::Release);
                        // Only below the stack pointer of the main stack is
                        // dead space for sure (a stack in the heap, a
                        // goroutine's, or a signal stack there, is not).
                        let stack = |m: &&MapImage| m.path.as_deref() == Some("[stack]") && m.perms.starts_with("rw");
                        if let Some(m) = sc.maps.iter().filter(stack).find(|m| m.start < sp && sp <= m.end)
                            && sp - m.start > HOLDER_LIST_GAP
                        {
                            let _ = room_ref.set((m.start, sp - HOLDER_LIST_GAP));
                        }
                        &mut f.bytes_mut()[..sc.total]
                    }
                    _ => {
                        if buf_ref.len() < sc.total {
                            tracing::debug!(had = buf_ref.len(), total = sc.total, "page buffer grown");
                            buf_ref.resize(sc.total, 0);
                        }
                        &mut buf_ref[..sc.total]
                    }
                };
                let ranges: &Vec<(u64, u64)> = copy_ref.get_or_init(|| std::mem::take(&mut sc.copy));
                queue_ref.lock().unwrap_or_else(|e| e.into_inner()).extend(split_jobs(ranges, out));
                sc
            })
        });
        // With the holder copying, the descriptors and the checks run here,
        // beside the copy, while the tracer injects its calls and clones
        // the other processes: that is the longer part (a 100 MB REPL with
        // a server and a shell: ~1.9 ms of the tracer's against ~1.3 of
        // copy), which the checks (~0.5 ms) lengthened. Alternating in ten
        // pairs of runs: 100 MB window p50 4.32 against 4.62 ms on
        // average, checkpoint 5.10 against 5.31.
        let check_here = to_file_ref.load(Ordering::Acquire) && room_ref.get().is_some() && copier;
        let scanned = match check_here {
            true => {
                checks_aside_ref.store(true, Ordering::Release);
                Some(scanned)
            }
            false => {
                *scanned_ref.lock().unwrap_or_else(|e| e.into_inner()) = Some(scanned);
                None
            }
        };
        queued_ref.store(true, Ordering::Release);
        if let Some(scanned) = scanned {
            let found = find_fds(host, mounts, rseq, base_ref, tracking, scanned, t0);
            *found_ref.lock().unwrap_or_else(|e| e.into_inner()) = Some(found);
        }
        // With the holder copying on this CPU, nothing more: the checks
        // run on the tracer's, once it is done with the other processes
        // (they took a third of the copy's time here when they shared
        // this CPU with it). Without, the pages are read from here.
        match to_file_ref.load(Ordering::Acquire) && room_ref.get().is_some() && copier {
            true => Ok(()),
            false => read_from_back(),
        }
    };
    let here = |aside_done: &dyn Fn() -> bool| {
        let mine = (|| -> Result<_> {
            let StoppedReads { caught, rest: pre, .. } = before(orig, false)?;
            let handlers = handlers(s, orig, caught)?;
            // A restored process takes its template's FPU / SSE / AVX
            // registers.
            let xstate = match xstate_read.take() {
                Some(x) => x,
                None => ptrace::xstate(host.raw()).map_err(|e| Error::Ptrace {
                    pid: host,
                    op: "GETREGSET xstate",
                    source: e,
                })?,
            };
            Ok((handlers, xstate, pre))
        })();
        // The holder's copy starts once the scan is done: before the other
        // processes' pass 1 if it is by then, else between two of them
        // (waiting for the scan left the tracer idle for 0.3-0.4 ms of
        // each window, p50, while the copy had time to spare), else after
        // them. The holder copies beside `during`, and is given its next
        // runs after it; meanwhile this thread reads from the end of the
        // list. Then the program break: `brk` takes the address space's
        // lock for writing, so beside the scan, which holds it for
        // reading, it waited the scan out. (Read first, before the scan
        // started, it held the scan back by its round trip: 0.1 ms, the
        // first call injected into the process.)
        let mut copying = None;
        let mut brk = None;
        let mut lender = holder.as_deref_mut();
        let mut start = |wait: bool| {
            if brk.is_some() || (!wait && !queued.load(Ordering::Acquire) && !aside_done()) {
                return;
            }
            while !queued.load(Ordering::Acquire) && !aside_done() {
                std::thread::yield_now();
            }
            copying = match (&mine, lender.take(), room.get()) {
                (Ok(_), Some(h), Some(&room)) if to_file.load(Ordering::Acquire) => {
                    Some(Copying { h, room, run: None, saved: None, instruments: &instruments })
                }
                _ => None,
            };
            if let Some(c) = copying.as_mut() {
                c.next(host, &queue);
            }
            brk = Some(orig.call("brk (read)", libc::SYS_brk, &[0]));
        };
        if let Some(d) = during.take() {
            d(seen, &mut || start(false));
        }
        start(true);
        let mine = mine.and_then(|(handlers, xstate, pre)| {
            let brk = brk.unwrap_or_else(|| Err(Error::Died { pid: host, how: "no break read".into() }))?;
            t_inject = t0.elapsed();
            Ok((handlers, brk, xstate, pre))
        });
        // The descriptors and the checks: read beside the holder's copy,
        // or here.
        let found = match checks_aside.load(Ordering::Acquire) {
            true => loop {
                if let Some(f) = found_slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    break f;
                }
                if aside_done() {
                    break Err(Error::Died { pid: host, how: "the reading thread panicked".into() });
                }
                std::thread::yield_now();
            },
            false => match scanned_slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(scanned) => find_fds(host, mounts, rseq, base_ref, tracking, scanned, t0),
                None => Err(Error::Died { pid: host, how: "the reading thread panicked".into() }),
            },
        };
        t_during = t0.elapsed();
        let mut helped = Ok(());
        while let Some(c) = copying.as_mut().filter(|c| c.run.is_some()) {
            match c.poll(&queue) {
                Some(bytes) => {
                    by_holder += bytes;
                    c.next(host, &queue);
                }
                None => {
                    let job = if helped.is_ok() { pop_back(&queue) } else { None };
                    match job {
                        Some(j) => helped = uffd::read_pages(host.raw(), j.ranges, j.out),
                        None => std::thread::yield_now(),
                    }
                }
            }
        }
        if let Some(c) = copying.as_mut() {
            c.put_back(host);
        }
        (mine, found, helped.and_then(|()| read_from_back()))
    };
    let (aside, (mine, found, helped)) = crate::helper_thread::beside(aside, here);
    let read = aside.unwrap_or_else(|_| Err(io::Error::other("the reading thread panicked"))).and(helped);
    let t_read = t0.elapsed();
    let total = total.into_inner();
    let to_file = to_file.into_inner();
    if let Some(h) = holder.as_mut() {
        h.want = h.want.max(total + total / 2).min(MAX_PAGE_FILE);
    }
    // The buffer the pages are in; the other one back where it came from.
    let pages = match (to_file, file.take()) {
        (true, Some(f)) => {
            give_buffer(buf);
            let token = std::sync::Arc::new(());
            if let Some(h) = holder.as_mut() {
                h.lent = Some(std::sync::Arc::downgrade(&token));
            }
            Buf::File { file: f, _lent: token }
        }
        (_, f) => {
            if let (Some(h), Some(f)) = (holder.as_mut(), f) {
                h.file = Some(f);
            }
            Buf::Vec(buf)
        }
    };
    let mut give_back = |pages: Buf| match pages {
        Buf::File { file: f, .. } => {
            if let Some(h) = holder.as_mut() {
                h.file = Some(f);
                h.lent = None;
            }
        }
        Buf::Vec(v) => give_buffer(v),
    };
    let ((handlers, brk, xstate, pre), (found, fds)) = match (mine, found) {
        (Ok(m), Ok(f)) => (m, f),
        (Err(e), _) | (_, Err(e)) => {
            give_back(pages);
            return Err(e);
        }
    };
    let found = found.and_then(|f| read.map(|()| f).map_err(|e| format!("reading the written pages: {e}")));
    let f = match found {
        Ok(f) => f,
        Err(why) => {
            give_back(pages);
            tracing::debug!(pid = s.ns_pid.raw(), "checkpoint forks: {why}");
            return Ok((None, fds, pre));
        }
    };
    let taken = match base.take_or_defer() {
        Ok(t) => t,
        Err(e) => {
            give_back(pages);
            tracing::debug!(pid = s.ns_pid.raw(), "checkpoint forks: no standby ({e})");
            return Ok((None, fds, pre));
        }
    };
    let t_fork = t0.elapsed();
    tracing::debug!(
        pid = s.ns_pid.raw(),
        pages = f.total / 4096,
        by_holder = by_holder / 4096,
        dropped = f.zap.len(),
        t_scan = ?f.t_scan,
        t_check = ?f.t_check,
        ?t_inject,
        ?t_during,
        ?t_read,
        standby_wait = ?t_fork.saturating_sub(t_read),
        later = matches!(taken, TakenStandby::Forking(..)),
        "template patched from the previous one (pages read)"
    );
    let scratch = base.scratch;
    let copied = copy.into_inner().unwrap_or_default();
    let delta = std::sync::Arc::new(Delta { pages: copied.clone(), zap: f.zap.clone() });
    let pages = Pages::Read(copied, pages);
    let (to, ns_pid, standby) = taken.parts();
    let pending = Pending {
        standby,
        owner: host,
        pages,
        bytes: f.total,
        zap: f.zap,
        handlers,
        brk: Some(brk),
        xstate,
        scratch: scratch.0,
        extra: base.extra.take(),
    };
    let patched = Patched {
        host: to,
        ns_pid,
        scratch,
        maps: f.maps,
        fingerprint: f.fp,
        pending,
        generation: base.generation + 1,
        prev: (base.id.clone(), delta),
    };
    Ok((Some(patched), fds, pre))
}

/// [`patch`] for a process that ran no code since its previous template
/// (registers, FPU state and pages as they were): the standby holds its
/// memory, handlers and program break already, so nothing is injected
/// into it (`before` is told to read no timers, there are none) and
/// nothing is copied. The checks and the rest of the image are read as
/// for any template: another process may have changed its limits or
/// priority, the files it shares, its pipes.
#[allow(clippy::too_many_arguments)]
fn patch_quiet<B>(
    s: &StoppedProcess,
    orig: &mut Tracee,
    tracking: &Tracking,
    mut base: Base,
    (rseq, mounts): (Rseq, &std::collections::HashMap<i32, sandtree_sys::mountinfo::MountEntry>),
    (xstate, sc): (Vec<u8>, Scanned),
    before: impl FnOnce(&mut Tracee, bool) -> Result<StoppedReads<B>>,
    during: &mut Option<crate::incremental::During<'_>>,
    seen: &mut Seen,
) -> Result<(Option<Patched>, Vec<FdImage>, B)> {
    let host = s.host;
    let t0 = std::time::Instant::now();
    let StoppedReads { status, rest: pre, .. } = before(orig, true)?;
    let fds = crate::procfs::fds(host, mounts).map_err(|e| Error::Proc { pid: host, what: "fds", source: e })?;
    let f = match check(host, Some(&status), rseq, &base, tracking, &fds, sc, t0)? {
        Ok(f) => f,
        Err(why) => {
            tracing::debug!(pid = s.ns_pid.raw(), "checkpoint forks: {why}");
            return Ok((None, fds, pre));
        }
    };
    // (The standby's fork, if still under way, ends meanwhile.)
    if let Some(d) = during.take() {
        d(seen, &mut || {});
    }
    let (to, ns_pid, standby) = match base.take_or_defer() {
        Ok(taken) => taken.parts(),
        Err(e) => {
            tracing::debug!(pid = s.ns_pid.raw(), "checkpoint forks: no standby ({e})");
            return Ok((None, fds, pre));
        }
    };
    base.instruments.count(Counter::QuietTemplates, 1);
    tracing::debug!(
        pid = s.ns_pid.raw(),
        took = ?t0.elapsed(),
        later = matches!(standby, NextTemplate::Forking(_)),
        "template from the previous one's standby (no code ran since)"
    );
    let pending = Pending {
        standby,
        owner: host,
        pages: Pages::Read(Vec::new(), Buf::Vec(Vec::new())),
        bytes: 0,
        zap: Vec::new(),
        handlers: Vec::new(),
        brk: None,
        xstate,
        scratch: base.scratch.0,
        // (None: a quiet process's base is its previous template.)
        extra: base.extra.take(),
    };
    let patched = Patched {
        host: to,
        ns_pid,
        scratch: base.scratch,
        maps: f.maps,
        fingerprint: f.fp,
        pending,
        generation: base.generation + 1,
        prev: (base.id.clone(), Default::default()),
    };
    Ok((Some(patched), fds, pre))
}

/// Pages a process that ran no code may have had written (by the kernel:
/// see [`as_they_were`]) at most.
const QUIET_PAGES: usize = 16;

/// Whether the pages `written` of process `host` (a few at most) hold
/// what they hold in `template`, its previous template, but for the
/// fields of its rseq area that the kernel refreshes before the process
/// returns to its code (CPU and node ids, concurrency id). A process
/// stopped and let go by a checkpoint runs no code of its own and yet has
/// pages written: by the kernel, which stores a `poll`'s results again
/// when the call it interrupted restarts, and the CPU it runs on into the
/// rseq area.
fn as_they_were(host: HostPid, template: HostPid, written: &[(u64, u64)], rseq: Rseq) -> bool {
    let len: usize = written.iter().map(|(a, b)| (b - a) as usize).sum();
    if len > QUIET_PAGES * 4096 {
        return false;
    }
    let (mut now, mut then) = (vec![0u8; len], vec![0u8; len]);
    if uffd::read_pages(host.raw(), written, &mut now).is_err()
        || uffd::read_pages(template.raw(), written, &mut then).is_err()
    {
        return false;
    }
    // (Offsets in the buffers of the refreshed fields: `cpu_id_start`,
    // `cpu_id`, then `node_id` and `mm_cid` after `rseq_cs` and `flags`.)
    let mut refreshed = Vec::new();
    if let Some((area, ..)) = rseq {
        let mut at = 0u64;
        for &(a, b) in written {
            if a <= area && area + 32 <= b {
                let off = (at + area - a) as usize;
                refreshed.extend([off..off + 8, off + 20..off + 28]);
            }
            at += b - a;
        }
    }
    now.iter().zip(&then).enumerate().all(|(i, (x, y))| x == y || refreshed.iter().any(|r| r.contains(&i)))
}

/// A holder's page file grows to this at most (a 1 GB process may write
/// a 16th of its pages before a checkpoint forks it instead: the rest is
/// read from the daemon).
const MAX_PAGE_FILE: usize = 64 << 20;

/// Bytes kept between the stack pointer and the holder's lists of runs:
/// the red zone (128) and the dead space the tracer's injected calls use
/// (`handlers`, `checkpoint::timers`: 192 below it at most).
const HOLDER_LIST_GAP: u64 = 512;

/// The holder's copy under way in a frozen window (see [`patch`]).
struct Copying<'c> {
    h: &'c mut crate::memory_holder::Copier,
    /// Dead space of the shared address space for the lists of runs:
    /// from, to (below the stack pointer of the stopped process).
    room: (u64, u64),
    run: Option<PageRun>,
    /// What the lists of runs wrote over, from the address given up to
    /// the room's end: put back once the copy is done.
    saved: Option<(u64, Vec<u8>)>,
    /// Where the pages copied are counted.
    instruments: &'c Instruments,
}

/// One `pwritev` of the holder: its jobs' runs, contiguous in the page
/// file.
struct PageRun {
    t0: std::time::Instant,
    jobs: Vec<(usize, usize)>,
    bytes: usize,
}

impl Copying<'_> {
    /// Start the holder on the next runs at the front of `queue`, as many
    /// as one `pwritev` takes (and fit in the dead space): their jobs stay
    /// in the queue's front, marked taken. `run` stays `None` when there
    /// is none left (or the holder cannot).
    fn next(&mut self, host: HostPid, queue: &std::sync::Mutex<std::collections::VecDeque<ReadJob>>) {
        let max = (((self.room.1 - self.room.0) / 16) as usize).min(uffd::IOV_MAX);
        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
        let (mut n, mut bytes, mut jobs) = (0, 0, Vec::new());
        let mut iov = Vec::new();
        let mut at = None;
        for j in q.iter_mut().filter(|j| !j.taken) {
            let end = at.map(|a: usize| a + bytes);
            if end.is_some_and(|e| e != j.at) || n + j.ranges.len() > max {
                break;
            }
            at.get_or_insert(j.at);
            for &(a, b) in j.ranges {
                iov.extend_from_slice(&a.to_ne_bytes());
                iov.extend_from_slice(&(b - a).to_ne_bytes());
            }
            n += j.ranges.len();
            bytes += j.out.len();
            jobs.push((j.at, j.out.len()));
            j.taken = true;
        }
        let Some(at) = at else { return };
        let list = (self.room.1 - iov.len() as u64) & !15;
        let fd = self.h.fd as u64;
        let started = self
            .save(host, list)
            .and_then(|()| ptrace::write_mem(host.raw(), list, &iov))
            .map_err(|e| Error::Ptrace { pid: host, op: "write the holder's runs", source: e })
            .and_then(|()| self.h.tracee.start_stepped(libc::SYS_pwritev, &[fd, list, n as u64, at as u64, 0]));
        match started {
            Ok(()) => self.run = Some(PageRun { t0: std::time::Instant::now(), jobs, bytes }),
            Err(e) => {
                tracing::debug!(holder = self.h.tracee.tid.raw(), "the holder copies no more pages: {e}");
                untake(&mut q, &jobs);
                self.room = (0, 0);
            }
        }
    }

    /// Keep what is at `from` up to the room's end (beyond what is kept
    /// already).
    fn save(&mut self, host: HostPid, from: u64) -> io::Result<()> {
        let kept = self.saved.as_ref().map_or(self.room.1, |(at, _)| *at);
        if from >= kept {
            return Ok(());
        }
        let mut more = vec![0u8; (kept - from) as usize];
        ptrace::read_mem(host.raw(), from, &mut more)?;
        if let Some((_, old)) = self.saved.take() {
            more.extend_from_slice(&old);
        }
        self.saved = Some((from, more));
        Ok(())
    }

    /// Put back what the lists of runs wrote over (dead space below the
    /// stack pointer, as the tracer's injected calls do).
    fn put_back(&mut self, host: HostPid) {
        if let Some((at, bytes)) = self.saved.take()
            && let Err(e) = ptrace::write_mem(host.raw(), at, &bytes)
        {
            tracing::debug!(pid = host.raw(), "the stack below the holder's lists not put back: {e}");
        }
    }

    /// The holder's run, if it is done: `Some(bytes copied)` (0 when it
    /// failed: its jobs go back to the queue for the other readers, and
    /// the holder gets no more), `None` while it runs.
    fn poll(&mut self, queue: &std::sync::Mutex<std::collections::VecDeque<ReadJob>>) -> Option<usize> {
        self.run.as_ref()?;
        let out = match self.h.tracee.poll_stepped() {
            Ok(None) => return None,
            Ok(Some(ret)) => Ok(ret),
            Err(e) => Err(e.to_string()),
        };
        let r = self.run.take()?;
        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
        match out {
            Ok(n) if n == r.bytes as i64 => {
                tracing::debug!(holder = self.h.tracee.tid.raw(), bytes = r.bytes, took = ?r.t0.elapsed(), "pages copied by the holder");
                self.instruments.count(Counter::PagesCopiedByHolders, (r.bytes / 4096) as u64);
                q.retain(|j| !(j.taken && r.jobs.contains(&(j.at, j.out.len()))));
                Some(r.bytes)
            }
            out => {
                tracing::debug!(holder = self.h.tracee.tid.raw(), ?out, bytes = r.bytes, "the holder's copy failed");
                untake(&mut q, &r.jobs);
                self.room = (0, 0);
                Some(0)
            }
        }
    }
}

/// `jobs` (offset, length) in the queue are not taken any more.
fn untake(q: &mut std::collections::VecDeque<ReadJob>, jobs: &[(usize, usize)]) {
    for j in q.iter_mut().filter(|j| jobs.contains(&(j.at, j.out.len()))) {
        j.taken = false;
    }
}

/// The last job of `queue` if no reader took it (the holder takes jobs
/// from the front).
fn pop_back<'a>(queue: &std::sync::Mutex<std::collections::VecDeque<ReadJob<'a>>>) -> Option<ReadJob<'a>> {
    let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
    if q.back().is_some_and(|j| !j.taken) { q.pop_back() } else { None }
}

/// Whether `now` (`PROCMAP_QUERY`) is exactly the map `was` (`maps`):
/// the same mappings with the same bounds, permissions, offsets and files
/// (device and inode: a path can only name another file through another
/// mapping). `maps` lists the `[vsyscall]` page, which is no mapping.
fn same_map(now: &[sandtree_sys::process::MapRange], was: &[MapImage]) -> bool {
    let was = was.iter().filter(|m| m.start < 1 << 47);
    now.len() == was.clone().count()
        && now.iter().zip(was).all(|(n, m)| {
            let p = m.perms.as_bytes();
            let perms = p.len() == 4 && [p[0] == b'r', p[1] == b'w', p[2] == b'x', p[3] == b's'] == n.perms;
            n.start == m.start
                && n.end == m.end
                && perms
                && n.offset == m.offset
                && n.dev == m.dev
                && n.inode == m.inode
        })
}

/// What [`scan`] found: the pages to copy, if the standby can be used.
struct Scanned {
    maps: Vec<MapImage>,
    /// Page runs to copy (start, end; taken for the read), their total
    /// bytes, and page runs dropped.
    copy: Vec<(u64, u64)>,
    total: usize,
    zap: Vec<(u64, u64)>,
    t_scan: std::time::Duration,
    /// Whether the pages written were taken (the map is the base's).
    taken: bool,
}

/// What [`check`] found: the standby can be used, with these pages.
struct StandbyUsable {
    maps: Vec<MapImage>,
    fp: String,
    total: usize,
    zap: Vec<(u64, u64)>,
    t_scan: std::time::Duration,
    t_check: std::time::Duration,
}

/// The memory map and the scan of the pages written (the copy starts
/// from it; the other checks, [`check`], run beside the copy):
/// `Ok(Err(why))` when the checkpoint must fork instead.
fn scan(
    host: HostPid,
    base: &Base,
    tracking: &Tracking,
    t0: std::time::Instant,
) -> Result<std::result::Result<Scanned, String>> {
    // The memory map, where it is the base's, without formatting a path.
    let same =
        sandtree_sys::process::map_ranges(host.raw()).ok().flatten().is_some_and(|now| same_map(&now, &base.maps));
    let maps = match same {
        true => base.maps.clone(),
        false => crate::procfs::maps(host).map_err(|e| Error::Proc { pid: host, what: "maps", source: e })?,
    };
    // (A map that changed forks: `check` says why.)
    if !same && (maps != base.maps || !tracking.covers(&maps)) {
        return Ok(Ok(Scanned {
            maps,
            copy: Vec::new(),
            total: 0,
            zap: Vec::new(),
            t_scan: t0.elapsed(),
            taken: false,
        }));
    }
    // From here the pages written count from this checkpoint: if the
    // standby cannot be used after all, the fork captures them.
    let written = match tracking.take_written(host) {
        Ok(w) => w,
        Err(e) => return Ok(Err(format!("{e}"))),
    };
    let t_scan = t0.elapsed();
    // A guard region installed since: a standby has the page there, a
    // fork copies the guard.
    if written.iter().any(|r| r.categories & uffd::PAGE_IS_GUARD != 0) {
        return Ok(Err("guard regions were installed: a fork copies them".into()));
    }
    // Each run of written pages, cut at the private mappings it lies in:
    // the scan's runs go across mappings (the tracking's ranges merge
    // adjacent mappings, and the kernel merges pages of the same
    // categories whatever their mapping: a binary's `.data`, a file's, and
    // the anonymous rest of its `.bss` right after it). Keeping only the
    // runs inside one mapping lost those pages: the template kept their
    // previous checkpoint's contents (a `psql` came back out of step with
    // its server).
    let private: Vec<(u64, u64)> = maps.iter().filter(|m| !m.shared()).map(|m| (m.start, m.end)).collect();
    let mut copy = Vec::new();
    let mut zap = Vec::new();
    for r in &written {
        for &(start, end) in private.iter().filter(|&&(start, end)| start < r.end && r.start < end) {
            let (a, b) = (r.start.max(start), r.end.min(end));
            // (A written page swapped out since, or being migrated, reads
            // back through /proc/<pid>/mem: only a page neither present
            // nor swapped was dropped.)
            if r.categories & (uffd::PAGE_IS_PRESENT | uffd::PAGE_IS_SWAPPED) != 0 {
                let mut at = a;
                while at < b {
                    let end = b.min(at + JOB_BYTES as u64);
                    copy.push((at, end));
                    at = end;
                }
            } else {
                zap.push((a, b));
            }
        }
    }
    let pages: u64 = copy.iter().map(|(a, b)| (b - a) / 4096).sum();
    let resident = crate::procfs::resident_pages(host);
    if pages > 4096 && pages * 16 > resident {
        return Ok(Err(format!("{pages} of {resident} pages written: a fork is cheaper")));
    }
    if zap.len() > 64 {
        return Ok(Err(format!("{} runs of pages dropped", zap.len())));
    }
    let total = (pages * 4096) as usize;
    Ok(Ok(Scanned { maps, copy, total, zap, t_scan, taken: true }))
}

/// The process's descriptors and what [`check`] finds of the scan's
/// result.
type FoundFds = (std::result::Result<StandbyUsable, String>, Vec<FdImage>);

/// The descriptors of stopped process `host`, then [`check`] (unless the
/// scan already said why the checkpoint must fork).
fn find_fds(
    host: HostPid,
    mounts: &std::collections::HashMap<i32, sandtree_sys::mountinfo::MountEntry>,
    rseq: Rseq,
    base: &Base,
    tracking: &Tracking,
    scanned: Result<std::result::Result<Scanned, String>>,
    t0: std::time::Instant,
) -> Result<FoundFds> {
    let fds = crate::procfs::fds(host, mounts).map_err(|e| Error::Proc { pid: host, what: "fds", source: e })?;
    let found = match scanned? {
        Ok(sc) => check(host, None, rseq, base, tracking, &fds, sc, t0)?,
        Err(why) => Err(why),
    };
    Ok((found, fds))
}

/// The checks but the scan's (see the module docs): `Ok(Err(why))` when
/// the checkpoint must fork instead.
#[allow(clippy::too_many_arguments)]
fn check(
    host: HostPid,
    status: Option<&str>,
    rseq: Rseq,
    base: &Base,
    tracking: &Tracking,
    fds: &[FdImage],
    sc: Scanned,
    t0: std::time::Instant,
) -> Result<std::result::Result<StandbyUsable, String>> {
    let fp = fingerprint(host, status).map_err(|e| Error::Proc { pid: host, what: "fingerprint", source: e })?;
    if let Some(why) = mismatch(host, base, (&fp, &sc.maps, rseq), tracking, fds) {
        return Ok(Err(why));
    }
    let Scanned { maps, total, zap, t_scan, .. } = sc;
    Ok(Ok(StandbyUsable { maps, fp, total, zap, t_scan, t_check: t0.elapsed() }))
}

/// What makes a standby its process's new template, read from the process
/// in the frozen window and written into the standby once the checkpoint
/// is over: writing costs a copy-on-write break per page
/// (~4 µs here), reading only the copy. The pages are written by a thread
/// of their own ([`Pending::start`]), while the tracer serves the next
/// jobs; the rest (registers, handlers, program break, dropped pages) by
/// the tracer once it is done ([`Pending::finish`]).
pub(crate) struct Pending {
    /// The standby that becomes the template.
    standby: NextTemplate,
    /// Host pid of the process (whose holder lent its page file).
    owner: HostPid,
    pages: Pages,
    /// Bytes written.
    bytes: usize,
    /// Page runs the process dropped since.
    zap: Vec<(u64, u64)>,
    handlers: Vec<Handler>,
    /// The program break (`None`: the standby's, which is the process's).
    brk: Option<u64>,
    xstate: Vec<u8>,
    scratch: u64,
    /// The standby is of the template before the previous one: the
    /// previous one's changes go first.
    extra: Option<OlderStandby>,
}

/// The standby a [`Pending`] makes its process's template.
enum NextTemplate {
    Standby(Standby),
    /// Its fork, still under way ([`ForkingStandby`]): until [`Pending::resolve`],
    /// the template's host pid is that of the template forking it.
    Forking(ForkingStandby),
    /// Its fork failed.
    Gone,
}

/// Where the pages of a [`Pending`] are.
enum Pages {
    /// Read: page runs (start, end), and their bytes one after the other.
    Read(Vec<(u64, u64)>, Buf),
    /// Being written (the thread gives the buffer back).
    Writing(std::thread::JoinHandle<(io::Result<()>, Buf)>),
    /// Taken by a failed start.
    Gone,
}

impl Pages {
    /// The buffer, once no thread writes from it.
    fn into_buf(self) -> Buf {
        match self {
            Pages::Read(_, b) => b,
            Pages::Writing(h) => h.join().map(|(_, b)| b).unwrap_or(Buf::Vec(Vec::new())),
            Pages::Gone => Buf::Vec(Vec::new()),
        }
    }
}

/// The bytes of pages read: the daemon's buffer, or the page file of the
/// process's holder (lent until they are written).
pub(crate) enum Buf {
    Vec(Vec<u8>),
    /// With the token the holder's copier watches (`Copier::lent`): a page
    /// file dropped with its template is made again.
    File {
        file: sandtree_sys::pagefile::PageFile,
        _lent: std::sync::Arc<()>,
    },
}

impl Buf {
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::Vec(v) => v,
            Buf::File { file: f, .. } => f.bytes(),
        }
    }
}

impl Pending {
    /// The template whose pages this one reads first ([`OlderStandby`]): it must
    /// be done changing before this one starts.
    pub(crate) fn depends_on(&self) -> Option<HostPid> {
        self.extra.as_ref().map(|e| e.from)
    }

    /// Its standby's fork is still under way ([`ForkingStandby`]).
    pub(crate) fn is_later(&self) -> bool {
        matches!(self.standby, NextTemplate::Forking(_))
    }

    /// Wait for the standby's fork, if it is under way ([`ForkingStandby`]):
    /// returns the standby's host pid and pid in the sandbox.
    pub(crate) fn resolve(&mut self) -> Result<(HostPid, SandboxPid)> {
        // (A fork that fails leaves it `Gone`.)
        self.standby = match std::mem::replace(&mut self.standby, NextTemplate::Gone) {
            NextTemplate::Forking(l) => NextTemplate::Standby(l.finish()?),
            other => other,
        };
        match &self.standby {
            NextTemplate::Standby(s) => Ok((s.host, s.ns_pid)),
            _ => Err(Error::Died { pid: self.owner, how: "its template's standby is gone".into() }),
        }
    }

    /// Start writing the pages into the standby, on a thread of its own
    /// (first the dropped pages of an [`OlderStandby`], injected here).
    pub(crate) fn start(&mut self) {
        // (No pages: `finish` has nothing to wait for.)
        let extra_pages = self.extra.as_ref().is_some_and(|e| !e.delta.pages.is_empty());
        if !matches!(&self.pages, Pages::Read(copy, _) if !copy.is_empty() || extra_pages) {
            return;
        }
        // (Not before the standby is there: `finish` says so.)
        let NextTemplate::Standby(s) = &self.standby else { return };
        let (to, ns_pid) = (s.host, s.ns_pid);
        if let Err(e) = self.zap_extra() {
            tracing::warn!(pid = ns_pid.raw(), "the previous template's dropped pages: {e}");
            self.pages = Pages::Gone;
            return;
        }
        let Pages::Read(copy, buf) = std::mem::replace(&mut self.pages, Pages::Gone) else { return };
        let extra = self.extra.clone();
        // Off the tracer's CPU: the copy-on-write breaks (~4 µs a page, a
        // 1,150-page write ~5 ms of CPU) run in this thread's context, and
        // on the tracer's CPU they held off the tracer and the templates it
        // injects into (a fresh template's first call, its scratch `mmap`
        // right after a checkpoint, took 3-5 ms instead of ~0.2).
        let cpus = crate::inject::off_tracer_cpus();
        let spawned = std::thread::Builder::new().name("sandtree:pages".into()).spawn(move || {
            crate::inject::pin_self(&cpus);
            let written = write_pages(to, extra.as_ref(), &copy, buf.bytes());
            (written, buf)
        });
        match spawned {
            Ok(h) => self.pages = Pages::Writing(h),
            // (`finish` says so.)
            Err(e) => tracing::warn!(pid = ns_pid.raw(), "no thread to write the pages: {e}"),
        }
    }

    /// Drop in the standby the pages of [`OlderStandby`] the previous template
    /// dropped (once: taken).
    fn zap_extra(&mut self) -> Result<()> {
        let Some(e) = self.extra.as_mut().filter(|e| !e.zapped) else { return Ok(()) };
        let NextTemplate::Standby(standby) = &mut self.standby else {
            return Err(Error::Died { pid: self.owner, how: "its template's standby is not forked yet".into() });
        };
        e.zapped = true;
        for &(a, b) in &e.delta.zap {
            standby.tracee.call(
                "madvise (previous template's dropped pages)",
                libc::SYS_madvise,
                &[a, b - a, libc::MADV_DONTNEED as u64],
            )?;
        }
        Ok(())
    }

    /// Whether the pages are written ([`Pending::finish`] would not wait).
    pub(crate) fn written(&self) -> bool {
        match &self.pages {
            Pages::Writing(h) => h.is_finished(),
            Pages::Read(copy, _) => copy.is_empty() && self.extra.as_ref().is_none_or(|e| e.delta.pages.is_empty()),
            Pages::Gone => false,
        }
    }

    /// Whether the pages are being written.
    pub(crate) fn writing(&self) -> bool {
        matches!(&self.pages, Pages::Writing(h) if !h.is_finished())
    }

    /// Wait for the pages (writing them here if they were not started) and
    /// set the rest in the standby: it is the template then. On the tracer
    /// thread. An error leaves the standby half-made: the caller drops its
    /// checkpoint's templates. A page file lent by the process's holder is
    /// given back to `holders` (their owner's) either way.
    pub(crate) fn finish(mut self, holders: &mut [crate::memory_holder::Holder]) -> Result<()> {
        let unstarted = matches!(&self.pages, Pages::Read(..));
        let resolved = self.resolve();
        let zapped = match resolved {
            Ok(_) if unstarted => self.zap_extra(),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        let Pending { standby, owner, pages, bytes, zap, handlers, brk, xstate, scratch, extra, .. } = self;
        let NextTemplate::Standby(mut standby) = standby else {
            if let Buf::File { file: f, .. } = pages.into_buf() {
                crate::memory_holder::give_back_file(holders, owner, f);
            }
            return Err(zapped.err().unwrap_or(Error::Died { pid: owner, how: "no standby".into() }));
        };
        let to = standby.host;
        let t0 = std::time::Instant::now();
        let none = || Buf::Vec(Vec::new());
        let (written, buf) = match pages {
            Pages::Read(copy, buf) => {
                let w = zapped
                    .map_err(|e| io::Error::other(e.to_string()))
                    .and_then(|()| write_pages(to, extra.as_ref(), &copy, buf.bytes()));
                (w, buf)
            }
            Pages::Writing(h) => {
                h.join().unwrap_or_else(|_| (Err(io::Error::other("the writing thread panicked")), none()))
            }
            Pages::Gone => (Err(io::Error::other("no thread to write the pages")), none()),
        };
        match buf {
            Buf::Vec(v) => give_buffer(v),
            Buf::File { file: f, .. } => crate::memory_holder::give_back_file(holders, owner, f),
        }
        written.map_err(|e| Error::Ptrace { pid: to, op: "write the pages written", source: e })?;
        let sb = &mut standby.tracee;
        ptrace::set_xstate(to.raw(), &xstate).map_err(|e| Error::Ptrace {
            pid: to,
            op: "SETREGSET xstate",
            source: e,
        })?;
        for (sig, act) in &handlers {
            ptrace::write_mem(to.raw(), scratch, act).map_err(|e| Error::Ptrace { pid: to, op: "write", source: e })?;
            sb.call("rt_sigaction", libc::SYS_rt_sigaction, &[*sig, scratch, 0, 8])?;
        }
        if let Some(brk) = brk
            && sb.call("brk (read)", libc::SYS_brk, &[0])? != brk
            && sb.call("brk", libc::SYS_brk, &[brk])? != brk
        {
            return Err(Error::Remote { pid: to, call: "brk", errno: io::Error::from_raw_os_error(libc::ENOMEM) });
        }
        for &(a, b) in &zap {
            sb.call("madvise (dropped pages)", libc::SYS_madvise, &[a, b - a, libc::MADV_DONTNEED as u64])?;
        }
        tracing::debug!(pid = standby.ns_pid.raw(), kib = bytes / 1024, waited = ?t0.elapsed(), "template patched (pages written)");
        Ok(())
    }
}

/// Write into standby `to` the pages of `extra` (if any), then the
/// checkpoint's own: runs `copy`, their bytes one after the other.
fn write_pages(to: HostPid, extra: Option<&OlderStandby>, copy: &[(u64, u64)], bytes: &[u8]) -> io::Result<()> {
    write_extra(to, extra)?;
    if copy.is_empty() {
        return Ok(());
    }
    uffd::PageWriter::open(to.raw())?.write(copy, bytes)
}

/// The pages of [`OlderStandby`], read from the previous template and written
/// into standby `to` (before its own pages: those of the checkpoint win).
fn write_extra(to: HostPid, extra: Option<&OlderStandby>) -> io::Result<()> {
    let Some(e) = extra.filter(|e| !e.delta.pages.is_empty()) else { return Ok(()) };
    let len: u64 = e.delta.pages.iter().map(|(a, b)| b - a).sum();
    let mut buf = take_buffer(len as usize);
    let r = uffd::read_pages(e.from.raw(), &e.delta.pages, &mut buf[..len as usize])
        .and_then(|()| uffd::PageWriter::open(to.raw())?.write(&e.delta.pages, &buf[..len as usize]));
    give_buffer(buf);
    r
}

/// Page runs, the part of the buffer their bytes go to, and its offset
/// in the buffer; taken by the holder (`patch`).
struct ReadJob<'a> {
    ranges: &'a [(u64, u64)],
    out: &'a mut [u8],
    at: usize,
    taken: bool,
}

/// `ranges` in jobs of at most [`CHUNK`] ranges and [`JOB_BYTES`] (a
/// longer range is a job of its own: [`scan`] cuts them at
/// [`JOB_BYTES`]), each with its part of `buf` (the bytes of the ranges one
/// after the other).
fn split_jobs<'a>(ranges: &'a [(u64, u64)], mut buf: &'a mut [u8]) -> Vec<ReadJob<'a>> {
    let mut jobs = Vec::new();
    let mut rest = ranges;
    let mut at = 0;
    while !rest.is_empty() {
        let (mut n, mut len) = (0, 0usize);
        while n < rest.len() && n < CHUNK && (n == 0 || len < JOB_BYTES) {
            len += (rest[n].1 - rest[n].0) as usize;
            n += 1;
        }
        let (piece, more) = rest.split_at(n);
        let (mine, others) = std::mem::take(&mut buf).split_at_mut(len);
        jobs.push(ReadJob { ranges: piece, out: mine, at, taken: false });
        at += len;
        (rest, buf) = (more, others);
    }
    jobs
}

/// Buffers of written pages, kept between checkpoints: a new one would
/// fault in each of its pages during the frozen window.
static BUFFERS: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// Buffers kept at most (one per process being checkpointed at once).
const KEPT_BUFFERS: usize = 4;

/// A buffer of at least `len` bytes.
fn take_buffer(len: usize) -> Vec<u8> {
    let mut kept = BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
    // The largest fits most often.
    kept.sort_by_key(|b| b.len());
    let mut buf = kept.pop().unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, 0);
    }
    buf
}

fn give_buffer(buf: Vec<u8>) {
    if buf.capacity() == 0 {
        return;
    }
    let mut kept = BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() < KEPT_BUFFERS {
        kept.push(buf);
    }
}

/// Ranges a reading thread takes at a time (up to a
/// `process_vm_readv` each).
const CHUNK: usize = 128;

/// Bytes a reading thread takes at a time, about (so that both threads
/// share a long run of written pages).
const JOB_BYTES: usize = 1 << 20;

/// The other processes' pass 1, run while the largest one's copy is made
/// (`checkpoint::clone_of`'s `during`); it calls the hook it is given before each
/// process (the largest one's copy starts there once its scan is done:
/// `incremental::patch`).
pub(crate) type During<'a> = &'a mut dyn FnMut(&mut Seen, &mut dyn FnMut());

#[cfg(test)]
mod tests {
    use super::{MAX_GENERATION, max_generation, same_map};

    /// Chains grow with the square root of the process's size, between 8
    /// and 32 templates.
    #[test]
    fn longer_chains_for_larger_processes() {
        let pages = |mib: u64| mib << 8;
        assert_eq!(max_generation(0), MAX_GENERATION);
        assert_eq!(max_generation(pages(100)), MAX_GENERATION);
        assert_eq!(max_generation(pages(512)), 16);
        assert_eq!(max_generation(pages(1024)), 22);
        assert_eq!(max_generation(pages(64 << 10)), 32);
    }

    /// A process's map through `PROCMAP_QUERY` is its `maps`; another
    /// process's is not.
    #[test]
    fn procmap_query_agrees_with_maps() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id() as i32;
        // (Once it runs `sleep`, not the test binary forked.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim() != "sleep" {
            assert!(std::time::Instant::now() < deadline, "sleep never started");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let ranges = sandtree_sys::process::map_ranges(pid).expect("PROCMAP_QUERY");
        let maps = crate::procfs::maps(crate::HostPid(pid)).expect("maps");
        let own = crate::procfs::maps(crate::HostPid(std::process::id() as i32)).expect("own maps");
        let _ = child.kill();
        let _ = child.wait();
        let Some(ranges) = ranges else {
            println!("SKIP: no PROCMAP_QUERY (Linux < 6.11)");
            return;
        };
        assert!(same_map(&ranges, &maps), "PROCMAP_QUERY {ranges:?} against maps {maps:?}");
        assert!(!same_map(&ranges, &own), "another process's map taken for this one");
    }
}
