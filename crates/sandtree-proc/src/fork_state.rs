//! What a fork copies that only the process can tell
//! ([`crate::model::ForkState`]): read from a template, for a transplant
//! (`transplant.rs`, which gives it to a new child) and for a durable
//! image (`durable/`, which keeps it).

use sandtree_sys::ptrace;

use crate::batch::{Arg, Batch};
use crate::model::ForkState;
use crate::template::Template;
use crate::{Error, HostPid, Result};

/// `prctl(PR_GET_MDWE)`, `prctl(PR_SET_MDWE)`.
const PR_GET_MDWE: i32 = 66;
pub(crate) const PR_SET_MDWE: i32 = 65;

/// Read, in template `t` (one batch in its scratch area; the template is
/// otherwise left as it is), its signal handlers (raw `struct
/// kernel_sigaction`, by signal), the settings read with `prctl`, its
/// personality and program break. The other fields stay empty:
/// [`read_xstate`] and [`read_proc`] fill them.
pub(crate) fn read_in_template(t: &mut Template) -> Result<ForkState> {
    let mut b = Batch::new(t.scratch, t.scratch_exec);
    let mut handlers = Vec::new();
    for sig in 1..=64u64 {
        if sig == libc::SIGKILL as u64 || sig == libc::SIGSTOP as u64 {
            continue;
        }
        let act = b.data(&[0u8; 32]);
        b.call("rt_sigaction (read)", libc::SYS_rt_sigaction, &[Arg::Val(sig), Arg::Val(0), act, Arg::Val(8)]);
        handlers.push((sig, b.address(act)));
    }
    let death = b.data(&[0u8; 8]);
    let death_at = b.address(death);
    let prctl = |b: &mut Batch, what: &'static str, option: i32, arg: Arg| {
        b.call(what, libc::SYS_prctl, &[Arg::Val(option as u64), arg, Arg::Val(0), Arg::Val(0), Arg::Val(0)])
    };
    let dumpable = prctl(&mut b, "prctl(PR_GET_DUMPABLE)", libc::PR_GET_DUMPABLE, Arg::Val(0));
    prctl(&mut b, "prctl(PR_GET_PDEATHSIG)", libc::PR_GET_PDEATHSIG, death);
    let thp = prctl(&mut b, "prctl(PR_GET_THP_DISABLE)", libc::PR_GET_THP_DISABLE, Arg::Val(0));
    let persona = b.call("personality (read)", libc::SYS_personality, &[Arg::Val(0xffff_ffff)]);
    let brk = b.call("brk (read)", libc::SYS_brk, &[Arg::Val(0)]);
    let results = t.tracee.run_batch(&mut b)?;
    // (Alone: a kernel without it fails the call, `EINVAL`.)
    let mdwe = t.tracee.syscall(libc::SYS_prctl, &[PR_GET_MDWE as u64, 0, 0, 0, 0])?.ret;
    let result = |arg: Arg| match arg {
        Arg::Ret(i) => results.get(i).copied().unwrap_or(0) as u64,
        _ => 0,
    };
    let read = |at: u64, len: usize| -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        ptrace::read_mem(t.host.raw(), at, &mut buf).map_err(Error::ptrace(t.host, "read the handlers"))?;
        Ok(buf)
    };
    let handlers = handlers.into_iter().map(|(sig, at)| Ok((sig, read(at, 32)?))).collect::<Result<Vec<_>>>()?;
    let death_signal = u64::from(u32::from_ne_bytes(read(death_at, 4)?.try_into().unwrap_or_default()));
    Ok(ForkState {
        handlers,
        dumpable: result(dumpable),
        death_signal,
        thp_disabled: result(thp),
        personality: result(persona),
        mdwe: mdwe.max(0) as u64,
        brk: result(brk),
        ..ForkState::default()
    })
}

/// The XSAVE area of template `host` (on the tracer thread, which traces
/// it).
pub(crate) fn read_xstate(host: HostPid, state: &mut ForkState) -> Result<()> {
    state.xstate = ptrace::xstate(host.raw()).map_err(Error::ptrace(host, "GETREGSET"))?;
    Ok(())
}

/// The auxiliary vector and memory bounds of template `host` into
/// `state` (what a transplant's memory map needs of its `/proc`).
pub(crate) fn read_bounds(host: HostPid, state: &mut ForkState) -> Result<()> {
    let proc_err = |what: &'static str| move |source| Error::Proc { pid: host, what, source };
    state.auxv = std::fs::read(format!("/proc/{host}/auxv")).map_err(proc_err("auxv"))?;
    state.mm = mm_bounds(&std::fs::read_to_string(format!("/proc/{host}/stat")).map_err(proc_err("stat"))?);
    Ok(())
}

/// Fill the rest of `state` from template `host`'s `/proc` (any thread):
/// limits, OOM score adjustment, timer slack, auxiliary vector, memory
/// bounds and fingerprint.
pub(crate) fn read_proc(host: HostPid, state: &mut ForkState) -> Result<()> {
    let proc_err = |what: &'static str| move |source| Error::Proc { pid: host, what, source };
    state.limits = sandtree_sys::process::limits(host.raw()).map_err(proc_err("resource limits"))?;
    let read = |file: &str| std::fs::read_to_string(format!("/proc/{host}/{file}"));
    state.oom_score_adj = read("oom_score_adj").map_err(proc_err("oom_score_adj"))?.trim().to_string();
    state.timerslack_ns = read("timerslack_ns").map_err(proc_err("timerslack_ns"))?.trim().to_string();
    read_bounds(host, state)?;
    state.fingerprint = crate::incremental::fingerprint(host, None).map_err(proc_err("fingerprint"))?;
    Ok(())
}

/// The memory bounds of a process from its `/proc/<pid>/stat` line, in
/// `ForkState::mm`'s order: `start_code end_code start_data end_data
/// start_brk start_stack arg_start arg_end env_start env_end` (fields
/// 26-28 and 45-51 of proc(5)).
pub(crate) fn mm_bounds(stat: &str) -> Vec<u64> {
    let fields: Vec<u64> = crate::procfs::stat_fields(stat).map(|f| f.parse().unwrap_or(0)).collect();
    // (`fields[0]` is field 3 of proc(5).)
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    [26, 27, 45, 46, 47, 28, 48, 49, 50, 51].into_iter().map(field).collect()
}
