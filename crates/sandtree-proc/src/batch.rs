//! Many injected syscalls in one ptrace round trip.
//!
//! An injected syscall ([`Tracee::syscall`]) costs two ptrace stops: 20-50
//! µs here. Putting a restored process back takes ten or more of them (cwd,
//! descriptors, sockets, session, rseq, ...), most of the restore's time. A
//! [`Batch`] collects the calls and runs them as a small x86-64 program in
//! the template's scratch area (mapped read-write-execute by the template's
//! set-up, and unmapped at the end of the restore):
//!
//! ```text
//! for each call i:   rdi, rsi, rdx, r10, r8, r9 := its arguments
//!                    (a value, an address in the data area, or the result
//!                    of an earlier call, loaded from the results area)
//!                    rax := nr; syscall; results[i] := rax
//!                    if rax < 0: jump to end
//! a skip (move_fd):  if results[k] == fd: jump over the next calls
//! end:               tgkill(getpid(), gettid(), SIGSTOP); jmp $
//! ```
//!
//! The tracee runs it with `PTRACE_CONT` (every signal blocked, as for any
//! injection) and stops at the `SIGSTOP`, which the tracer drops: one round
//! trip, whatever the number of calls. `SIGSTOP` rather than `int3`: a
//! forced `SIGTRAP` would reset a blocked or ignored `SIGTRAP`'s handler.
//! The results are read back; the first negative one is the failure. A call
//! marked [`Batch::call_retrying_in_use`] that failed with `EADDRINUSE` (a
//! port a killed process still holds) is run again, and the program from
//! there on, after a short wait.
//!
//! Area layout (at the scratch page + [`BATCH_OFFSET`]): the data, then the
//! results (8 bytes per call), then the code.

use sandtree_sys::ptrace;

use crate::inject::Tracee;
use crate::{Error, HostPid, Result};

/// Where the batch area starts in the scratch mapping.
pub(crate) const BATCH_OFFSET: u64 = 4096;
/// Its size.
pub(crate) const BATCH_SIZE: u64 = 16 * 1024;
/// A batch whose area grows past this is run before more is added (at a
/// boundary where no later call needs an earlier result). The room above
/// it takes the largest unit added at once (a descriptor: a path of up to
/// 4 KiB and a few calls).
pub(crate) const BATCH_FLUSH: usize = 8 * 1024;

/// Waits between tries for something a killed process still holds (its
/// pid, a port): naps from `first` µs, doubling up to `max` µs, for at most
/// `wait` in all.
pub(crate) struct Backoff {
    nap: std::time::Duration,
    max: std::time::Duration,
    deadline: std::time::Instant,
}

impl Backoff {
    pub(crate) fn new(first_us: u64, max_us: u64, wait: std::time::Duration) -> Backoff {
        Backoff {
            nap: std::time::Duration::from_micros(first_us),
            max: std::time::Duration::from_micros(max_us),
            deadline: std::time::Instant::now() + wait,
        }
    }

    /// Sleeps before the next try; `false` (no sleep) once the time is up.
    pub(crate) fn snooze(&mut self) -> bool {
        if std::time::Instant::now() >= self.deadline {
            return false;
        }
        std::thread::sleep(self.nap);
        self.nap = (self.nap * 2).min(self.max);
        true
    }
}

/// How long a batched `bind` waits for a killed process to release its port.
const PORT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// An argument of a batched call.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// This value.
    Val(u64),
    /// The address of bytes added with [`Batch::data`] (their offset).
    Data(usize),
    /// The result of an earlier call of the batch (its index).
    Ret(usize),
}

#[derive(Debug)]
enum Op {
    Call {
        what: &'static str,
        nr: i64,
        args: Vec<Arg>,
        retry_in_use: bool,
    },
    /// Jump over the next `calls` calls if the result of call `ret` is `value`.
    SkipIfEq {
        ret: usize,
        value: i32,
        calls: usize,
    },
}

/// Syscalls to run in one round trip (see the module docs).
#[derive(Debug)]
pub(crate) struct Batch {
    /// Address of the batch area in the tracee.
    base: u64,
    /// The area is executable. If not (a process that may not map
    /// writable code: `PR_SET_MDWE`, a seccomp or SELinux rule), the calls
    /// run one injected syscall at a time, with the same results.
    exec: bool,
    ops: Vec<Op>,
    data: Vec<u8>,
    calls: usize,
}

const REGS: [Reg; 6] = [Reg::Rdi, Reg::Rsi, Reg::Rdx, Reg::R10, Reg::R8, Reg::R9];

#[derive(Clone, Copy)]
enum Reg {
    Rax,
    Rdi,
    Rsi,
    Rdx,
    R10,
    R8,
    R9,
}

impl Reg {
    /// (REX prefix, register number in the low three bits).
    fn code(self) -> (u8, u8) {
        match self {
            Reg::Rax => (0x48, 0),
            Reg::Rdi => (0x48, 7),
            Reg::Rsi => (0x48, 6),
            Reg::Rdx => (0x48, 2),
            Reg::R10 => (0x49, 2),
            Reg::R8 => (0x49, 0),
            Reg::R9 => (0x49, 1),
        }
    }
}

/// `movabs reg, imm64`.
fn mov_imm(code: &mut Vec<u8>, reg: Reg, v: u64) {
    let (rex, r) = reg.code();
    code.extend_from_slice(&[rex, 0xb8 + r]);
    code.extend_from_slice(&v.to_le_bytes());
}

/// `movabs rax, [addr]`.
fn load_rax(code: &mut Vec<u8>, addr: u64) {
    code.extend_from_slice(&[0x48, 0xa1]);
    code.extend_from_slice(&addr.to_le_bytes());
}

/// `movabs [addr], rax`.
fn store_rax(code: &mut Vec<u8>, addr: u64) {
    code.extend_from_slice(&[0x48, 0xa3]);
    code.extend_from_slice(&addr.to_le_bytes());
}

/// `mov reg, rax`.
fn mov_from_rax(code: &mut Vec<u8>, reg: Reg) {
    let (rex, r) = reg.code();
    code.extend_from_slice(&[rex, 0x89, 0xc0 + r]);
}

const SYSCALL: [u8; 2] = [0x0f, 0x05];

/// A `rel32` jump placeholder at `at` (its end is `at + 4`) to patch.
struct Patch {
    at: usize,
    to: Target,
}

enum Target {
    End,
    /// The start of op `n`.
    Op(usize),
}

impl Batch {
    /// A batch whose area is at `scratch` + [`BATCH_OFFSET`] (executable
    /// or not: `exec`).
    pub(crate) fn new(scratch: u64, exec: bool) -> Batch {
        Batch { base: scratch + BATCH_OFFSET, exec, ops: Vec::new(), data: Vec::new(), calls: 0 }
    }

    fn clear(&mut self) {
        self.ops.clear();
        self.data.clear();
        self.calls = 0;
    }

    /// Bytes the program needs in the tracee's memory (the data area): the
    /// argument to pass is their address.
    pub(crate) fn data(&mut self, bytes: &[u8]) -> Arg {
        while !self.data.len().is_multiple_of(8) {
            self.data.push(0);
        }
        let off = self.data.len();
        self.data.extend_from_slice(bytes);
        Arg::Data(off)
    }

    /// The address in the tracee of bytes added with [`Batch::data`] (or
    /// [`Batch::path`]): where a call of the batch writes what it returns
    /// through a pointer, to read once the batch ran.
    pub(crate) fn address(&self, arg: Arg) -> u64 {
        match arg {
            Arg::Data(off) => self.base + off as u64,
            _ => panic!("the address of an argument not in the data area"),
        }
    }

    /// A NUL-terminated path in the data area.
    pub(crate) fn path(&mut self, path: &str) -> Arg {
        let mut bytes = path.as_bytes().to_vec();
        bytes.push(0);
        self.data(&bytes)
    }

    /// Add syscall `nr` with `args`; `what` names it in errors. Returns
    /// its result, as an argument for later calls.
    pub(crate) fn call(&mut self, what: &'static str, nr: i64, args: &[Arg]) -> Arg {
        self.push(what, nr, args, false)
    }

    /// [`Batch::call`] that is retried for a while on `EADDRINUSE`.
    pub(crate) fn call_retrying_in_use(&mut self, what: &'static str, nr: i64, args: &[Arg]) -> Arg {
        self.push(what, nr, args, true)
    }

    fn push(&mut self, what: &'static str, nr: i64, args: &[Arg], retry_in_use: bool) -> Arg {
        assert!(args.len() <= 6, "a syscall has at most 6 arguments");
        self.ops.push(Op::Call { what, nr, args: args.to_vec(), retry_in_use });
        self.calls += 1;
        Arg::Ret(self.calls - 1)
    }

    /// Put the descriptor `new` (a result of this batch) on number `fd`
    /// with close-on-exec as in `flags`, and close `new` (unless the kernel
    /// gave `new` that number already).
    pub(crate) fn move_fd(&mut self, new: Arg, fd: i32, flags: u32) {
        let Arg::Ret(ret) = new else { panic!("move_fd of a descriptor not made by the batch") };
        self.ops.push(Op::SkipIfEq { ret, value: fd, calls: 2 });
        let cloexec = (flags & libc::O_CLOEXEC as u32) as u64;
        self.call("dup3", libc::SYS_dup3, &[new, Arg::Val(fd as u64), Arg::Val(cloexec)]);
        self.call("close", libc::SYS_close, &[new]);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.calls == 0
    }

    /// Whether the batch should run before more is added.
    pub(crate) fn is_full(&self) -> bool {
        self.data.len() + self.calls * 8 + self.calls * 120 > BATCH_FLUSH
    }

    fn results_addr(&self) -> u64 {
        self.base + self.data.len().next_multiple_of(8) as u64
    }

    fn code_addr(&self) -> u64 {
        (self.results_addr() + 8 * self.calls as u64).next_multiple_of(16)
    }

    /// The program from call `from` on (earlier calls ran already), and
    /// the offset in it where the tracee stops (after its `tgkill`).
    fn assemble(&self, from: usize) -> (Vec<u8>, usize) {
        let results = self.results_addr();
        let mut code = Vec::new();
        let mut patches = Vec::new();
        let mut starts = Vec::new();
        let mut call_ix = 0usize;
        for op in &self.ops {
            starts.push(code.len());
            match op {
                Op::Call { nr, args, .. } => {
                    if call_ix >= from {
                        for (reg, arg) in REGS.iter().zip(args) {
                            match *arg {
                                Arg::Val(v) => mov_imm(&mut code, *reg, v),
                                Arg::Data(off) => mov_imm(&mut code, *reg, self.base + off as u64),
                                Arg::Ret(k) => {
                                    load_rax(&mut code, results + 8 * k as u64);
                                    mov_from_rax(&mut code, *reg);
                                }
                            }
                        }
                        mov_imm(&mut code, Reg::Rax, *nr as u64);
                        code.extend_from_slice(&SYSCALL);
                        store_rax(&mut code, results + 8 * call_ix as u64);
                        // test rax, rax; js end
                        code.extend_from_slice(&[0x48, 0x85, 0xc0, 0x0f, 0x88]);
                        patches.push(Patch { at: code.len(), to: Target::End });
                        code.extend_from_slice(&[0; 4]);
                    }
                    call_ix += 1;
                }
                Op::SkipIfEq { ret, value, calls } => {
                    if call_ix >= from {
                        load_rax(&mut code, results + 8 * *ret as u64);
                        // cmp rax, imm32; je over the next `calls` calls
                        code.extend_from_slice(&[0x48, 0x3d]);
                        code.extend_from_slice(&value.to_le_bytes());
                        code.extend_from_slice(&[0x0f, 0x84]);
                        let n = starts.len() - 1;
                        let mut to = n + 1;
                        let mut seen = 0;
                        while seen < *calls && to < self.ops.len() {
                            if matches!(self.ops[to], Op::Call { .. }) {
                                seen += 1;
                            }
                            to += 1;
                        }
                        patches.push(Patch { at: code.len(), to: Target::Op(to) });
                        code.extend_from_slice(&[0; 4]);
                    }
                }
            }
        }
        let end = code.len();
        starts.push(end);
        // tgkill(getpid(), gettid(), SIGSTOP); jmp $
        mov_imm(&mut code, Reg::Rax, libc::SYS_getpid as u64);
        code.extend_from_slice(&SYSCALL);
        mov_from_rax(&mut code, Reg::Rdi);
        mov_imm(&mut code, Reg::Rax, libc::SYS_gettid as u64);
        code.extend_from_slice(&SYSCALL);
        mov_from_rax(&mut code, Reg::Rsi);
        mov_imm(&mut code, Reg::Rdx, libc::SIGSTOP as u64);
        mov_imm(&mut code, Reg::Rax, libc::SYS_tgkill as u64);
        code.extend_from_slice(&SYSCALL);
        let stop = code.len();
        code.extend_from_slice(&[0xeb, 0xfe]);
        for p in patches {
            let to = match p.to {
                Target::End => end,
                Target::Op(n) => starts.get(n).copied().unwrap_or(end),
            };
            let rel = to as i64 - (p.at as i64 + 4);
            code[p.at..p.at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
        (code, stop)
    }
}

impl Tracee {
    /// Run `batch` (see the module docs); the first failing call is an
    /// error naming it. Its calls' results, by index (the batch is empty
    /// again).
    pub(crate) fn run_batch(&mut self, batch: &mut Batch) -> Result<Vec<i64>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if !batch.exec {
            return self.run_one_by_one(batch);
        }
        let tid = self.tid;
        let mut from = 0;
        let mut backoff: Option<Backoff> = None;
        let werr = |e| Error::Ptrace { pid: tid, op: "write batch", source: e };
        loop {
            let (code, stop) = batch.assemble(from);
            let code_addr = batch.code_addr();
            if code_addr + code.len() as u64 > batch.base + BATCH_SIZE {
                return Err(Error::unsupported_by_host(tid, "", "restore", "too many calls in one batch (a bug)"));
            }
            ptrace::write_mem(tid.raw(), batch.base, &batch.data).map_err(werr)?;
            let zeros = vec![0u8; 8 * (batch.calls - from)];
            ptrace::write_mem(tid.raw(), batch.results_addr() + 8 * from as u64, &zeros).map_err(werr)?;
            ptrace::write_mem(tid.raw(), code_addr, &code).map_err(werr)?;
            self.run_code(code_addr, code_addr + stop as u64)?;
            let mut raw = vec![0u8; 8 * batch.calls];
            ptrace::read_mem(tid.raw(), batch.results_addr(), &mut raw).map_err(|e| Error::Ptrace {
                pid: tid,
                op: "read batch results",
                source: e,
            })?;
            let results: Vec<i64> =
                raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            let Some(failed) = (from..batch.calls).find(|&i| results[i] < 0) else {
                batch.clear();
                return Ok(results);
            };
            let (what, retry) = batch
                .ops
                .iter()
                .filter_map(|op| match op {
                    Op::Call { what, retry_in_use, .. } => Some((*what, *retry_in_use)),
                    Op::SkipIfEq { .. } => None,
                })
                .nth(failed)
                .unwrap_or(("batched call", false));
            let errno = -results[failed];
            if retry
                && errno == libc::EADDRINUSE as i64
                && backoff.get_or_insert_with(|| Backoff::new(50, 1000, PORT_WAIT)).snooze()
            {
                from = failed;
                continue;
            }
            return Err(Error::Remote { pid: tid, call: what, errno: std::io::Error::from_raw_os_error(errno as i32) });
        }
    }
}

impl Tracee {
    /// [`Tracee::run_batch`] without an executable area: each call injected
    /// on its own (data written to the area first).
    fn run_one_by_one(&mut self, batch: &mut Batch) -> Result<Vec<i64>> {
        let tid = self.tid;
        ptrace::write_mem(tid.raw(), batch.base, &batch.data).map_err(|e| Error::Ptrace {
            pid: tid,
            op: "write batch data",
            source: e,
        })?;
        let mut results: Vec<i64> = Vec::with_capacity(batch.calls);
        let mut skip = 0usize;
        let ops = std::mem::take(&mut batch.ops);
        for op in &ops {
            match op {
                Op::SkipIfEq { ret, value, calls } => {
                    if results.get(*ret) == Some(&(*value as i64)) {
                        skip = *calls;
                    }
                }
                Op::Call { what, nr, args, retry_in_use } => {
                    if skip > 0 {
                        skip -= 1;
                        results.push(0);
                        continue;
                    }
                    let args: Vec<u64> = args
                        .iter()
                        .map(|a| match *a {
                            Arg::Val(v) => v,
                            Arg::Data(off) => batch.base + off as u64,
                            Arg::Ret(k) => results.get(k).copied().unwrap_or(-1) as u64,
                        })
                        .collect();
                    let mut backoff: Option<Backoff> = None;
                    let ret = loop {
                        let ret = self.syscall(*nr, &args)?.ret;
                        let in_use = ret == -(libc::EADDRINUSE as i64);
                        if !(*retry_in_use
                            && in_use
                            && backoff.get_or_insert_with(|| Backoff::new(50, 1000, PORT_WAIT)).snooze())
                        {
                            break ret;
                        }
                    };
                    if ret < 0 {
                        batch.clear();
                        return Err(Error::Remote {
                            pid: tid,
                            call: what,
                            errno: std::io::Error::from_raw_os_error(-ret as i32),
                        });
                    }
                    results.push(ret);
                }
            }
        }
        batch.clear();
        Ok(results)
    }
}

/// Size of the scratch mapping of each template: a page for the pointer
/// arguments of single injected syscalls (paths, `clone_args`), then the
/// area of batched ones (`batch.rs`: data, results, code). Mapped
/// read-write-execute; a restore unmaps it from the restored process.
pub(crate) const SCRATCH: u64 = crate::batch::BATCH_OFFSET + crate::batch::BATCH_SIZE;

/// Where in the scratch page paths go.
const PATH_OFFSET: u64 = 256;

/// Write `path` (and its ending zero) into the scratch page of stopped
/// process `pid` at `scratch`: the address of a path argument.
pub(crate) fn write_path(pid: HostPid, scratch: u64, path: &str) -> Result<u64> {
    let mut bytes = path.as_bytes().to_vec();
    bytes.push(0);
    if bytes.len() as u64 > BATCH_OFFSET - PATH_OFFSET {
        return Err(Error::unsupported_by_host(pid, "", "path", format!("path too long to reopen: {path}")));
    }
    ptrace::write_mem(pid.raw(), scratch + PATH_OFFSET, &bytes).map_err(|source| Error::Ptrace {
        pid,
        op: "write path",
        source,
    })?;
    Ok(scratch + PATH_OFFSET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_jumps_over_two_calls() {
        let mut b = Batch::new(0x10000, true);
        let fd = b.call("socket", libc::SYS_socket, &[Arg::Val(2), Arg::Val(1), Arg::Val(0)]);
        b.move_fd(fd, 3, 0);
        b.call("setsid", libc::SYS_setsid, &[]);
        let (code, _) = b.assemble(0);
        // The skip's je lands on the setsid call: the bytes there load rax
        // with SYS_setsid (the call has no arguments).
        let je = code.windows(2).position(|w| w == [0x0f, 0x84]).expect("je");
        let rel = i32::from_le_bytes(code[je + 2..je + 6].try_into().unwrap());
        let to = (je + 6) as i64 + rel as i64;
        let to = to as usize;
        assert_eq!(&code[to..to + 2], &[0x48, 0xb8]);
        assert_eq!(u64::from_le_bytes(code[to + 2..to + 10].try_into().unwrap()), libc::SYS_setsid as u64);
    }

    #[test]
    fn retried_run_starts_at_the_failed_call() {
        let mut b = Batch::new(0x10000, true);
        b.call("getpid", libc::SYS_getpid, &[]);
        b.call("getppid", libc::SYS_getppid, &[]);
        let (all, _) = b.assemble(0);
        let (rest, _) = b.assemble(1);
        assert!(rest.len() < all.len());
        assert_eq!(u64::from_le_bytes(rest[2..10].try_into().unwrap()), libc::SYS_getppid as u64);
    }
}
