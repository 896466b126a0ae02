//! Workload suite in the spirit of CRIU's zdtm: each case starts one small
//! program in a sandbox that sets up one kind of process state and then
//! answers queries about it, as seen from inside the process. The case
//! checkpoints, mutates the state through the program, rolls back in place
//! and checks that the program sees exactly the checkpoint's state again
//! (twice where cheap).
//!
//! Each program is a file of `tests/workloads/` (see its README): Python
//! after a shared prelude (`prelude.py`), C compiled in the sandbox, or
//! lines typed into a session. Most cases are a declared [`Spec`] run by
//! one generic loop ([`run_declared`]); the ones whose checks are special
//! (several checkpoints, the engine's own counters, sessions, ...) are a
//! function of their own below.
//!
//! Protocol: the program listens on 127.0.0.1:7000 (listening sockets are
//! kept by the engine); each connection carries one command line and gets
//! one report line back, then the program closes it (no query's connection
//! is open at a checkpoint). Queries are `bash` `/dev/tcp` one-liners run
//! with `Engine::exec`, each bounded by a timeout.
//!
//! `harness = false` for the same reason as `engine.rs`: the zygote must be
//! forked while the process is still single-threaded. Cases run in sequence
//! on one engine with its own data dir and cgroup; the last line is
//! `N passed, M failed`. An optional first argument filters cases by name.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use sandtree_api::{
    CheckpointRequest, CreateSandboxRequest, ErrorCode, ExecRequest, ExecResponse, ForkRequest, ImageState,
    ProcessState, RestoreSource, RollbackRequest, SessionRunRequest,
};
use sandtree_runtime::Engine;

mod common;
use common::{Case, CaseFuture};

/// Port every workload listens on (each sandbox has its own network namespace).
const PORT: u16 = 7000;
/// Bound of every exec (a compile included): a hang fails the case, not CI.
const EXEC_TIMEOUT_MS: u64 = 20_000;
/// Rollback rounds per case.
const ROUNDS: usize = 2;

/// The text of a program file of `tests/workloads/` (a missing file does
/// not compile).
macro_rules! program {
    ($file:literal) => {
        include_str!(concat!("workloads/", $file))
    };
}

/// What every Python workload starts with (`serve`, `status`, ...).
const PRELUDE: &str = program!("prelude.py");

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

async fn exec(e: &Engine, sb: &str, req: ExecRequest) -> Result<ExecResponse> {
    let req = ExecRequest { timeout_ms: Some(req.timeout_ms.unwrap_or(EXEC_TIMEOUT_MS)), ..req };
    let what = req.cmd.join(" ");
    let out = e.exec(sb, req).await.with_context(|| format!("exec `{what}`"))?;
    ensure!(!out.timed_out, "`{what}` timed out: {}{}", out.stdout, out.stderr);
    Ok(out)
}

/// `sh -c script` (with `stdin` and `env`), which must exit 0; its stdout.
async fn sh_with(
    e: &Engine,
    sb: &str,
    script: &str,
    stdin: Option<&str>,
    env: BTreeMap<String, String>,
) -> Result<String> {
    let out = exec(
        e,
        sb,
        ExecRequest { cmd: argv(&["sh", "-c", script]), stdin: stdin.map(String::from), env, ..Default::default() },
    )
    .await?;
    ensure!(out.exit_code == Some(0), "`{script}` exited {:?}: {}{}", out.exit_code, out.stdout, out.stderr);
    Ok(out.stdout)
}

async fn sh(e: &Engine, sb: &str, script: &str) -> Result<String> {
    sh_with(e, sb, script, None, BTreeMap::new()).await
}

/// The value of `key` in a `k=v k=v` report.
fn field(report: &str, key: &str) -> Result<String> {
    report
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .map(String::from)
        .with_context(|| format!("no {key}= in {report:?}"))
}

fn num(report: &str, key: &str) -> Result<u64> {
    field(report, key)?.parse().with_context(|| format!("{key} in {report:?}"))
}

/// The report without the listed keys (values that move with time).
fn without(report: &str, keys: &[&str]) -> String {
    report
        .split_whitespace()
        .filter(|kv| !keys.iter().any(|k| kv.split('=').next() == Some(*k)))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// `python3 -c <prelude + code> args...`.
fn python(code: &str, args: &[&str]) -> Vec<String> {
    let mut cmd = vec!["python3".into(), "-c".into(), format!("{PRELUDE}\n{code}")];
    cmd.extend(args.iter().map(|a| a.to_string()));
    cmd
}

/// The lines of a program typed into a session: blank and `#` lines skipped.
fn typed_lines(program: &str) -> impl Iterator<Item = &str> {
    program.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// One workload: a sandbox and its one background program.
struct Workload {
    sb: String,
    pid: i32,
}

impl Workload {
    /// Creates a sandbox, starts `cmd` in the background and waits until it
    /// answers `ping`.
    async fn start(e: &Engine, cmd: Vec<String>) -> Result<Workload> {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        Workload::start_in(e, sb, cmd).await
    }

    async fn start_in(e: &Engine, sb: String, cmd: Vec<String>) -> Result<Workload> {
        let bg = exec(e, &sb, ExecRequest { cmd, background: true, ..Default::default() }).await?;
        let w = Workload { sb, pid: bg.pid };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match w.ask_raw(e, "ping").await {
                Ok(r) if r == "pong" => return Ok(w),
                r => {
                    let running = e.processes(&w.sb).await?.processes.iter().any(|p| p.pid == w.pid && p.running);
                    if !running || Instant::now() > deadline {
                        bail!("workload never answered ({r:?}); {}", w.diagnose(e).await);
                    }
                }
            }
            sleep_ms(50).await;
        }
    }

    async fn start_python(e: &Engine, code: &str) -> Result<Workload> {
        Workload::start(e, python(code, &[])).await
    }

    /// The program's state and output, for failure messages.
    async fn diagnose(&self, e: &Engine) -> String {
        match e.process_output(&self.sb, self.pid).await {
            Ok(o) => {
                let p = &o.process;
                let tail =
                    |s: &str| s.chars().rev().take(1500).collect::<Vec<_>>().into_iter().rev().collect::<String>();
                format!(
                    "pid {} running={} exit={:?} signal={:?} stdout={:?} stderr={:?}",
                    p.pid,
                    p.running,
                    p.exit_code,
                    p.signal,
                    tail(&o.stdout),
                    tail(&o.stderr)
                )
            }
            Err(err) => format!("pid {}: no process output: {err}", self.pid),
        }
    }

    async fn ask_raw(&self, e: &Engine, cmd: &str) -> Result<String> {
        let script = format!("exec 3<>/dev/tcp/127.0.0.1/{PORT} && printf '%s\\n' \"$CMD\" >&3 && head -c 4096 <&3");
        let out = exec(
            e,
            &self.sb,
            ExecRequest {
                cmd: argv(&["bash", "-c", &script]),
                env: BTreeMap::from([("CMD".to_string(), cmd.to_string())]),
                timeout_ms: Some(10_000),
                ..Default::default()
            },
        )
        .await?;
        ensure!(out.exit_code == Some(0), "query `{cmd}` exited {:?}: {}", out.exit_code, out.stderr.trim());
        let reply = out.stdout.trim_end().to_string();
        ensure!(!reply.is_empty(), "query `{cmd}`: empty reply");
        ensure!(!reply.starts_with("error"), "query `{cmd}`: {reply}");
        Ok(reply)
    }

    /// Sends one command, returns the one-line report.
    async fn ask(&self, e: &Engine, cmd: &str) -> Result<String> {
        match self.ask_raw(e, cmd).await {
            Ok(r) => Ok(r),
            Err(err) => bail!("{err:#}; {}", self.diagnose(e).await),
        }
    }

    /// A checkpoint that captured the program. Two in fact: the program's
    /// template of the second is made from the first's (`incremental.rs`:
    /// every process is tracked here), and it is the one returned.
    async fn checkpoint(&self, e: &Engine) -> Result<String> {
        // The query connection is closed by the program before it answers
        // the next accept; give it a moment to be gone from the fd table.
        sleep_ms(50).await;
        e.checkpoint(&self.sb, CheckpointRequest::default()).await.context("first checkpoint")?;
        // (The tracer makes the first one's standby meanwhile.)
        sleep_ms(100).await;
        self.checkpoint_once(e).await
    }

    /// One checkpoint that captured the program.
    async fn checkpoint_once(&self, e: &Engine) -> Result<String> {
        sleep_ms(50).await;
        self.checkpoint_now(e).await
    }

    /// [`Workload::checkpoint_once`] at once (the program may still be
    /// closing the query's connection: not for a check of descriptors).
    async fn checkpoint_now(&self, e: &Engine) -> Result<String> {
        let r = e.checkpoint(&self.sb, CheckpointRequest::default()).await.context("checkpoint")?;
        ensure!(
            r.checkpoint.process_state == ProcessState::Captured,
            "processes not captured: {} {:?}",
            r.note,
            r.checkpoint.unrestorable
        );
        ensure!(
            r.checkpoint.processes.contains(&self.pid),
            "pid {} not captured: {:?}",
            self.pid,
            r.checkpoint.processes
        );
        Ok(r.checkpoint.id)
    }

    /// A rollback in place that restored the program.
    async fn rollback(&self, e: &Engine, ck: &str) -> Result<()> {
        self.rollback_restoring(e, ck, &[self.pid]).await
    }

    async fn rollback_restoring(&self, e: &Engine, ck: &str, pids: &[i32]) -> Result<()> {
        // (Not while standby forks are held: no image is written then.)
        let from_image = from_images() && !e.test_switches().standby_forks_held();
        if from_image {
            drop_templates_for_the_image(e, &self.sb, ck).await?;
        }
        let r = e
            .rollback(&self.sb, RollbackRequest { checkpoint: ck.to_string(), allow_restart: false })
            .await
            .context("rollback")?;
        ensure!(!r.processes_restarted, "processes restarted instead of restored: {}", r.note);
        if from_image {
            ensure!(r.restored_from == Some(RestoreSource::Image), "not restored from the image: {}", r.note);
        }
        for pid in pids {
            ensure!(r.restored_pids.contains(pid), "pid {pid} not restored: {:?} ({})", r.restored_pids, r.note);
        }
        Ok(())
    }

    async fn delete(self, e: &Engine) -> Result<()> {
        e.delete_sandbox(&self.sb, true).await?;
        Ok(())
    }
}

/// Whether every rollback of the suite restores from the checkpoint's
/// durable image (`SANDTREE_WORKLOADS_FROM_IMAGES=1`): its templates are
/// dropped first, once the image is written.
fn from_images() -> bool {
    std::env::var("SANDTREE_WORKLOADS_FROM_IMAGES").is_ok_and(|v| v == "1")
}

/// Checkpoint `ck`'s templates dropped once its durable image is written
/// (the rollback then makes them again from the image).
async fn drop_templates_for_the_image(e: &Engine, sb: &str, ck: &str) -> Result<()> {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let image = e.get_checkpoint(ck).await?.process_image;
        match image.as_ref().map(|i| i.state) {
            Some(ImageState::Durable) => break,
            Some(ImageState::Writing) if Instant::now() < deadline => sleep_ms(20).await,
            // (What an image does not keep yet fails its writing, by name:
            // as a refusal of the image path.)
            Some(ImageState::Failed)
                if image
                    .as_ref()
                    .and_then(|i| i.error.as_deref())
                    .is_some_and(|e| e.contains("not kept in a process image yet")) =>
            {
                let error = image.and_then(|i| i.error).unwrap_or_default();
                bail!(
                    "cannot bring them back: {error}, so it is not restored from a process image yet; nothing was changed"
                );
            }
            _ => bail!("the image of {ck} was not written: {image:?}"),
        }
    }
    e.drop_templates(sb, ck)?;
    Ok(())
}

/// Checks that keep going after a failure, so that one run reports every
/// difference of a round.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn eq(&mut self, what: &str, got: &str, want: &str) {
        if got != want {
            self.0.push(format!("{what}: got {got:?}, want {want:?}"));
        }
    }

    fn that(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.0.push(msg());
        }
    }

    fn result(self, round: usize) -> Result<()> {
        ensure!(self.0.is_empty(), "round {round}: {}", self.0.join("; "));
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The generic case: a declared `Spec`, run by `run_declared`.

/// A declared case. The loop ([`run_declared`]): start `program` (Python,
/// after the prelude) with `args`; run `setup` (checks fail the case at
/// once); ask each `at_ck` query and check its answer; checkpoint (twice,
/// the second's template made from the first's, or once with
/// `checkpoint_once`). Then round `i` of `rounds` runs `mutate[i % len]`,
/// rolls back in place (the program restored, not restarted), asks every
/// `at_ck` query again, whose answer must be the checkpoint's (without the
/// `moving` keys), and runs `after`; a round reports all its differences at
/// once. After the last round, `end` (checks fail the case at once).
struct Spec {
    /// The program's text: `program!("<case>.py")`.
    program: &'static str,
    /// Its arguments (`sys.argv[1:]`).
    args: &'static [&'static str],
    setup: &'static [Step],
    /// Queries and what each must answer at the checkpoint; after every
    /// rollback, each must answer the same again.
    at_ck: &'static [(&'static str, Want)],
    /// Report keys that move with time: left out of the comparison with the
    /// checkpoint's answers and of every [`Want::Is`] of a program's answer.
    moving: &'static [&'static str],
    checkpoint_once: bool,
    mutate: &'static [&'static [Step]],
    after: &'static [Step],
    end: &'static [Step],
    rounds: usize,
}

impl Spec {
    const DEFAULT: Spec = Spec {
        program: "",
        args: &[],
        setup: &[],
        at_ck: &[],
        moving: &[],
        checkpoint_once: false,
        mutate: &[&[]],
        after: &[],
        end: &[],
        rounds: ROUNDS,
    };
}

/// One step of a declared case.
enum Step {
    /// Ask the program `.0`; its answer must be `.1`.
    Ask(&'static str, Want),
    /// Run the script `.0` with `sh -c` in the sandbox, `$PID` the
    /// program's pid; it must exit 0 and print `.1`.
    Sh(&'static str, Want),
    /// Run the Python program `.0` (a file, without the prelude) with
    /// `python3 -c` in the sandbox; it must exit 0 and print `.1` (trimmed).
    Py(&'static str, Want),
    /// Send the program signal `.0` (through the engine).
    Signal(i32),
    Sleep(u64),
    /// A checkpoint now must be refused (with error code `.0` when given),
    /// its message naming all of `.1`.
    Refused(Option<ErrorCode>, &'static [&'static str]),
}

/// What an answer must be.
enum Want {
    Any,
    /// Exactly this (a program's answer: without the case's moving keys).
    Is(&'static str),
    /// These `key=value` fields (among others).
    Has(&'static [(&'static str, &'static str)]),
    /// Passes this test.
    Like(fn(&str) -> bool),
    /// Field `.0` is at least `.1`.
    AtLeast(&'static str, u64),
    /// The last answer to command `.0`, exactly.
    Same(&'static str),
    /// Field `.0` grew by `.2` or more since the last answer to command `.1`.
    Grew(&'static str, &'static str, u64),
    /// Field `.0` is exactly `.2` more than in the last answer to command `.1`.
    Plus(&'static str, &'static str, u64),
    All(&'static [Want]),
}

use Step::*;
use Want::*;

/// A declared case running: its workload and the last answer to each command.
struct Declared {
    w: Workload,
    moving: &'static [&'static str],
    last: BTreeMap<&'static str, String>,
}

impl Declared {
    /// `report` without the moving keys.
    fn steady(&self, report: &str) -> String {
        if self.moving.is_empty() { report.to_string() } else { without(report, self.moving) }
    }

    fn last_num(&self, cmd: &str, key: &str) -> Result<u64> {
        num(self.last.get(cmd).with_context(|| format!("no answer to `{cmd}` yet"))?, key)
    }

    /// Whether `got` (a program's answer if `answer`) is `want`: why not.
    fn check(&self, want: &Want, got: &str, answer: bool) -> Result<()> {
        match want {
            Any => {}
            Is(s) => {
                let got = if answer { self.steady(got) } else { got.to_string() };
                ensure!(got == *s, "got {got:?}, want {s:?}");
            }
            Has(fields) => {
                for (k, v) in *fields {
                    ensure!(field(got, k)? == *v, "want {k}={v} in {got:?}");
                }
            }
            Like(ok) => ensure!(ok(got), "unexpected {got:?}"),
            AtLeast(k, n) => ensure!(num(got, k)? >= *n, "want {k} >= {n} in {got:?}"),
            Same(cmd) => {
                let then = self.last.get(cmd).with_context(|| format!("no answer to `{cmd}` yet"))?;
                ensure!(got == then, "got {got:?}, want {then:?} as `{cmd}` answered");
            }
            Grew(k, cmd, by) => {
                let then = self.last_num(cmd, k)?;
                ensure!(num(got, k)? >= then + by, "want {k} >= {then} + {by} (`{cmd}`'s) in {got:?}");
            }
            Plus(k, cmd, by) => {
                let then = self.last_num(cmd, k)?;
                ensure!(num(got, k)? == then + by, "want {k} = {then} + {by} (`{cmd}`'s) in {got:?}");
            }
            All(wants) => {
                for w in *wants {
                    self.check(w, got, answer)?;
                }
            }
        }
        Ok(())
    }

    /// Asks `cmd`, checks the answer, records it: the answer and what was
    /// wrong with it.
    async fn ask(&mut self, e: &Engine, cmd: &'static str, want: &Want) -> Result<(String, Option<String>)> {
        let got = self.w.ask(e, cmd).await?;
        let wrong = self.check(want, &got, true).err().map(|err| format!("`{cmd}`: {err:#}"));
        self.last.insert(cmd, got.clone());
        Ok((got, wrong))
    }

    /// Runs `step`: an error if it could not run, what was wrong if it ran.
    async fn step(&mut self, e: &Engine, step: &Step) -> Result<Option<String>> {
        let w = &self.w;
        let (what, got, want) = match step {
            Ask(cmd, want) => return Ok(self.ask(e, cmd, want).await?.1),
            Sh(script, want) => {
                let env = BTreeMap::from([("PID".to_string(), w.pid.to_string())]);
                (format!("`{script}`"), sh_with(e, &w.sb, script, None, env).await?, want)
            }
            Py(code, want) => {
                let out =
                    exec(e, &w.sb, ExecRequest { cmd: argv(&["python3", "-c", code]), ..Default::default() }).await?;
                ensure!(out.exit_code == Some(0), "`python3 -c` program: {}", out.stderr);
                ("`python3 -c` program".to_string(), out.stdout.trim().to_string(), want)
            }
            Signal(sig) => {
                e.kill_process(&w.sb, w.pid, *sig).await?;
                return Ok(None);
            }
            Sleep(ms) => {
                sleep_ms(*ms).await;
                return Ok(None);
            }
            Refused(code, words) => {
                let Err(err) = e.checkpoint(&w.sb, CheckpointRequest::default()).await else {
                    return Ok(Some(format!("a checkpoint accepted, want one refused naming {words:?}")));
                };
                let msg = err.to_string();
                let ok = code.is_none_or(|c| err.code() == c) && words.iter().all(|word| msg.contains(word));
                return Ok(
                    (!ok).then(|| format!("checkpoint refused with {:?} {msg:?}, want {code:?} {words:?}", err.code()))
                );
            }
        };
        Ok(self.check(want, &got, false).err().map(|err| format!("{what}: {err:#}")))
    }

    /// Runs `steps`, failing at the first thing wrong.
    async fn steps_strict(&mut self, e: &Engine, steps: &[Step], when: &str) -> Result<()> {
        for step in steps {
            if let Some(wrong) = self.step(e, step).await? {
                bail!("{when}: {wrong}");
            }
        }
        Ok(())
    }

    /// Runs `steps`, noting what is wrong in `c`.
    async fn steps(&mut self, e: &Engine, steps: &[Step], c: &mut Checks) -> Result<()> {
        for step in steps {
            c.0.extend(self.step(e, step).await?);
        }
        Ok(())
    }
}

/// The generic loop of a declared case (see [`Spec`]).
async fn run_declared(e: &Engine, s: &'static Spec) -> Result<()> {
    let w = Workload::start(e, python(s.program, s.args)).await?;
    let mut d = Declared { w, moving: s.moving, last: BTreeMap::new() };
    d.steps_strict(e, s.setup, "before the checkpoint").await?;
    let mut at_ck = Vec::new();
    for (cmd, want) in s.at_ck {
        let (got, wrong) = d.ask(e, cmd, want).await?;
        if let Some(wrong) = wrong {
            bail!("state at the checkpoint: {wrong}");
        }
        at_ck.push((*cmd, d.steady(&got)));
    }
    let ck = if s.checkpoint_once { d.w.checkpoint_once(e).await? } else { d.w.checkpoint(e).await? };
    for round in 0..s.rounds {
        let mut c = Checks::default();
        d.steps(e, s.mutate[round % s.mutate.len()], &mut c).await?;
        d.w.rollback(e, &ck).await?;
        for (cmd, then) in &at_ck {
            let got = d.w.ask(e, cmd).await?;
            c.eq(&format!("`{cmd}` after rollback"), &d.steady(&got), then);
            d.last.insert(cmd, got);
        }
        d.steps(e, s.after, &mut c).await?;
        c.result(round)?;
    }
    d.steps_strict(e, s.end, "after the last rollback").await?;
    d.w.delete(e).await
}

/// A declared case as a [`Case`]: `("name", declared!(SPEC))`.
macro_rules! declared {
    ($spec:ident) => {{
        fn case(e: &Engine) -> CaseFuture<'_> {
            Box::pin(run_declared(e, &$spec))
        }
        case as Case
    }};
}

// ---------------------------------------------------------------------------
// Declared cases (program, setup, queries, mutations, checks).

/// Signal mask and handlers: after rollback SIGUSR1 runs h1 again, raised
/// inside or sent from outside.
static SIGNAL_MASK_AND_HANDLERS: Spec = Spec {
    program: program!("signal_mask_and_handlers.py"),
    at_ck: &[("state", Has(&[("handler", "h1"), ("blocked", "12")]))],
    mutate: &[&[
        Ask("mutate", Has(&[("blocked", "10"), ("hup", "SIG_IGN")])),
        // Mutated, SIGUSR1 raised: blocked, no handler runs.
        Ask("raise", Same("mutate")),
    ]],
    after: &[
        // Raised inside: h1 runs once.
        Ask("raise", Has(&[("h1", "1"), ("h2", "0")])),
        // Sent from outside: h1 runs.
        Sh("kill -USR1 $PID", Any),
        Ask("state", Has(&[("h1", "2"), ("h2", "0")])),
    ],
    ..Spec::DEFAULT
};

/// Pending signals: unblocking delivers SIGUSR1 and SIGUSR2 after every
/// rollback (and after the last one).
static PENDING_SIGNAL: Spec = Spec {
    program: program!("pending_signal.py"),
    at_ck: &[("state", Has(&[("pending", "10,12"), ("got", "-")]))],
    mutate: &[&[Ask("consume", Has(&[("pending", "-"), ("got", "10,12")]))]],
    end: &[Ask("consume", Has(&[("got", "10,12")]))],
    ..Spec::DEFAULT
};

/// What `pending_signal_siginfo` takes: each signal as often as it was
/// queued, with its `siginfo`. (`tgkill` gives `si_code` SI_USER on this
/// kernel, like `kill`.)
const SIGINFO_GOT: &str = "got=10/user/self,12/user/self,34/queue/self/7,34/queue/self/8";

/// Pending signals in detail: after rollback each comes back where it was
/// (`/proc/self/status`), as often as it was queued, with its `siginfo`
/// (`si_code`, `si_pid`, `si_value`, read with `sigtimedwait`).
static PENDING_SIGNAL_SIGINFO: Spec = Spec {
    program: program!("pending_signal_siginfo.py"),
    at_ck: &[("state", Is("pending=10,12,34 SigPnd=0000000000000200 ShdPnd=0000000200000800"))],
    // Taken as queued once before the first rollback.
    mutate: &[&[Ask("consume", Is(SIGINFO_GOT))], &[]],
    after: &[Ask("consume", Is(SIGINFO_GOT))],
    ..Spec::DEFAULT
};

static UMASK_AND_CWD: Spec = Spec {
    program: program!("umask_and_cwd.py"),
    at_ck: &[("state", Is("umask=027 Umask=0027 cwd=/root/ck-dir probe=750 marker=True"))],
    mutate: &[
        &[Ask("mutate-rename", Is("umask=002 Umask=0002 cwd=/root/moved probe=775 marker=True"))],
        &[Ask("mutate-chdir", Is("umask=077 Umask=0077 cwd=/tmp/elsewhere probe=700 marker=False"))],
    ],
    ..Spec::DEFAULT
};

static FILE_OFFSET: Spec = Spec {
    program: program!("file_offset.py"),
    at_ck: &[(
        "state",
        Is(r"rw=12 ro=6 ap=3 append=1 data=b'line1\nline2\n' fresh=b'line1\nline2\n' log=b'a1\n' same=True"),
    )],
    // From the restored state the same writes land at the same offsets (no hole, no overlap).
    mutate: &[&[Ask(
        "mutate",
        Is(
            r"rw=18 ro=12 ap=6 append=1 data=b'line1\nline2\nline3\n' fresh=b'line1\nline2\nline3\n' log=b'a1\na2\n' same=True",
        ),
    )]],
    ..Spec::DEFAULT
};

/// A dup'd descriptor of a layer file comes back sharing its twin's
/// offset: writes through both append one after the other.
static DUP_SHARES_OFFSET: Spec = Spec {
    program: program!("dup_shares_offset.py"),
    at_ck: &[("state", Is("pos=6,6 content=b'aaaabb'"))],
    // (Round 2 starts from round 1's write after its rollback.)
    mutate: &[
        &[Ask("write", Is("pos=10,10 content=b'aaaabbccdd'"))],
        &[Ask("write", Is("pos=14,14 content=b'aaaabbccddccdd'"))],
    ],
    after: &[Ask("write", Is("pos=10,10 content=b'aaaabbccdd'"))],
    ..Spec::DEFAULT
};

/// A pipe comes back with its buffered bytes.
static PIPE_KEEPS_BUFFERED_BYTES: Spec = Spec {
    program: program!("pipe_keeps_buffered_bytes.py"),
    at_ck: &[("state", Is("avail=5"))],
    // (Round 2 starts from the pipe drained after round 1's rollback.)
    mutate: &[&[Ask("mutate", Is("got=b'hello' avail=8"))], &[Ask("mutate", Is("got=b'' avail=8"))]],
    after: &[Ask("drain", Is("got=b'hello' avail=0"))],
    ..Spec::DEFAULT
};

/// A checkpoint leaves a pipe's ends to the running processes alone: after
/// a mere checkpoint, closing every write end gives the reader the end of
/// file, closing the read end breaks the pipe for the writer (before, the
/// templates held ends of every pipe: the reader waited forever; issue 36,
/// class 1). The rollback brings the ends back open, with their flags, one
/// pipe per pair, a packet-mode pipe's messages whole.
static PIPE_ENDS_CLOSED_AFTER_A_CHECKPOINT: Spec = Spec {
    program: program!("pipe_ends_closed_after_a_checkpoint.py"),
    at_ck: &[("state", Is("ends=r+nb,w,w,r,w+nb,r+nb,w+nb+direct pair=same pipe3=7"))],
    // (Round 2 starts from round 1's `after`, which closed them.)
    mutate: &[&[Ask("close", Is("read=eof write=broken"))], &[]],
    after: &[Ask("messages", Is("got=b'one',b'two!'")), Ask("close", Is("read=eof write=broken"))],
    ..Spec::DEFAULT
};

/// A FIFO on `/dev` (a mount a rollback keeps, and the FIFO's inode with
/// it) is left to the running processes alone, like a pipe: after a mere
/// checkpoint, closing its writer gives the reader its bytes and the end
/// of file, closing its reader breaks it for the writer (before, the
/// templates held its ends; issue 36, class 1). The rollback opens the
/// ends again on the same inode, with their flags and its bytes.
static FIFO_ON_DEV: Spec = Spec {
    program: program!("fifo_on_dev.py"),
    at_ck: &[("state", Is("ends=r+nb,w,r+nb,w+nb avail=6 at_path=True"))],
    // (Round 2 starts from round 1's `after`, which closed them.)
    mutate: &[&[Ask("close", Is("read=eof write=broken got=b'queued'"))], &[]],
    after: &[Ask("close", Is("read=eof write=broken got=b'queued'"))],
    ..Spec::DEFAULT
};

/// A FIFO on the layer comes back with its bytes, reopened in the
/// rolled-back tree: both ends are the inode at its path (a writer from
/// outside reaches the restored reader) and keep their modes, and an epoll
/// watching it watches the new one.
static FIFO_ON_LAYER: Spec = Spec {
    program: program!("fifo_on_layer.py"),
    at_ck: &[("state", Is("avail=6 writer_blocking=True at_path=True"))],
    mutate: &[&[Ask("mutate", Is("avail=9"))]],
    after: &[
        Ask("ready", Is("ready=True")),
        Ask("drain", Is("got=b'queued'")),
        Ask("ready", Is("ready=False")),
        Sh("printf ext > /root/ctl", Is("")),
        Ask("ready", Is("ready=True")),
        Ask("drain", Is("got=b'ext'")),
    ],
    ..Spec::DEFAULT
};

/// Memfds come back with their names, contents, sizes, offsets, seals, and
/// two descriptors of one memfd still share it.
static MEMFD_STATE: Spec = Spec {
    program: program!("memfd_state.py"),
    at_ck: &[(
        "state",
        Is("/memfd:sandtree-state (deleted):b'checkpoint-data'@3 /memfd:frozen (deleted):b'frozen'@6 \
            same=True ro=True seals=11,1"),
    )],
    mutate: &[&[Ask("mutate", Is("/memfd:sandtree-state (deleted):b'MUTATEDin'@1 via-ro=b'MUTATEDin'"))]],
    ..Spec::DEFAULT
};

/// An inotify instance comes back with the same watch descriptors (a gap
/// included), on a directory and a file of the layer, a directory below it
/// (`/usr`) and a symbolic link itself; its flags, a dup, its epoll watch;
/// events after the rollback come from the rolled-back tree.
static INOTIFY_WATCHES: Spec = Spec {
    program: program!("inotify_watches.py"),
    at_ck: &[("state", Is("wds=[1, 3, 4, 5] nonblock=True cloexec=True dup=True pending=0"))],
    mutate: &[&[Ask("mutate", Is("1:100:new wds=[1, 3, 4, 5, 6] nonblock=True cloexec=True dup=True pending=0"))]],
    after: &[Ask("touch", Is("1:100:after,3:2:,5:4: epoll=True new=6"))],
    ..Spec::DEFAULT
};

/// An inotify watch on a file the program holds open and deleted (`tail
/// -f` of a log rotated away): after a rollback the watch is on the file
/// made anew on that descriptor, reports its writes, and its deletion once
/// it is closed (issue 38, item 8: refused before).
static INOTIFY_ON_A_DELETED_FILE: Spec = Spec {
    program: program!("inotify_on_a_deleted_file.py"),
    at_ck: &[("state", Is("deleted=True wds=[1] pending=0"))],
    mutate: &[&[Ask("write", Is("1:2"))]],
    after: &[Ask("write", Is("1:2"))],
    end: &[Ask("close", Is("1:8,1:400,1:8000"))],
    ..Spec::DEFAULT
};

/// Events not read yet cannot be captured (reading them would take them
/// from the process): the checkpoint is refused, naming them; once they are
/// read, it is taken.
static INOTIFY_UNREAD_EVENTS_ARE_REFUSED: Spec = Spec {
    program: program!("inotify_watches.py"),
    setup: &[
        Sh("touch /root/w/unread", Any),
        Refused(None, &["inotify", "not read yet"]),
        // Still running, with its events: `touch` reads them.
        Ask("touch", Like(|s| s.starts_with("1:100:unread,1:100:after,"))),
    ],
    rounds: 0,
    ..Spec::DEFAULT
};

/// A process with three threads comes back with all of them, the same
/// thread ids, each where it was: the worker blocked in its queue takes
/// new work, the ticker keeps ticking, and joining the worker after it
/// exits returns (its `clear_child_tid` was put back).
static THREADS_COME_BACK: Spec = Spec {
    program: program!("threads_come_back.py"),
    at_ck: &[(
        "state",
        Like(|s| {
            s.starts_with("done=[2] tids=[")
                && s.contains("names=['MainThread', 'ticker', 'timed', 'worker']")
                && s.contains("'tick-os'")
        }),
    )],
    mutate: &[&[Ask("work", Is("done=[2, 22]"))]],
    after: &[
        Ask("ticking", Is("ticking=True")),
        Ask("timed", Is("got2=['x']")),
        Ask("work", Is("done=[2, 22]")),
        Ask("join", Is("joined=True")),
    ],
    ..Spec::DEFAULT
};

/// A process under `PR_SET_MDWE` (no writable code: its template's scratch
/// area is not executable, so the restore's batched syscalls run one at a
/// time, `batch.rs`) is restored exactly and keeps refusing writable code.
static NO_WRITABLE_CODE: Spec = Spec {
    program: program!("no_writable_code.py"),
    at_ck: &[("state", Like(|s| s.starts_with("n=1 cwd=/tmp pos=4 ") && s.ends_with("rwx_refused=True")))],
    mutate: &[&[Ask("mutate", Is("n=2"))]],
    ..Spec::DEFAULT
};

const UNIX_CLIENT: &str = program!("unix_socketpair_and_listener.client.py");

/// Data in flight on connected unix sockets (a stream socketpair's bytes,
/// a datagram socketpair's messages) is captured (peeked) and queued again
/// through the peer at the restore; on an unconnected datagram socket it
/// is not captured yet: that checkpoint is refused, naming it. Data sent after the checkpoint is gone
/// after the rollback, and the listener (bound to a file of the replaced
/// tree) accepts again at its path.
static UNIX_SOCKETPAIR_AND_LISTENER: Spec = Spec {
    program: program!("unix_socketpair_and_listener.py"),
    setup: &[
        Py(UNIX_CLIENT, Is("unix-ok")),
        Ask("drain", Is("b_got=b'inflight' a_got=b'back'")),
        Ask("passfd", Is("queued")),
        Ask("passfd-drain", Is("got=b'fd' fds=1")),
        Ask("refill", Is("a2b=8 b2a=4")),
        Ask("lone", Is("queued")),
        Sleep(50),
        Refused(Some(ErrorCode::ProcessNotRestorable), &["in flight"]),
        Ask("lone-drain", Is("lone_got=b'x'")),
        Ask("dgram", Is("queued")),
    ],
    at_ck: &[("state", Is("a2b=8 b2a=4"))],
    mutate: &[&[Ask("mutate", Is("a2b=9 b2a=0"))]],
    after: &[
        Ask("drain", Is("b_got=b'inflight' a_got=b'back'")),
        Ask("dgrams", Is("db_got=[b'datagram', b'second']")),
        // Still connected.
        Ask("ping-pair", Is("b_got=b'ping'")),
        Py(UNIX_CLIENT, Is("unix-ok")),
    ],
    ..Spec::DEFAULT
};

static EVENTFD_COUNTER: Spec = Spec {
    program: program!("eventfd_counter.py"),
    at_ck: &[("state", Is("count=5"))],
    mutate: &[&[Ask("mutate", Is("count=2"))]],
    after: &[Ask("read", Is("read=5 count=0"))],
    ..Spec::DEFAULT
};

/// A semaphore eventfd, a dup of it and an epoll watching it, shared with
/// a forked child: after each rollback the child's write reaches the
/// parent's counter and both epolls, and a read through the dup takes
/// from the same counter, one at a time (issue 39: from a durable image,
/// one object made per open file and given to every holder).
static EVENTFD_SHARED_WITH_A_CHILD: Spec = Spec {
    program: program!("eventfd_shared_with_a_child.py"),
    at_ck: &[("state", Is("count=2 semaphore=1"))],
    mutate: &[&[Ask("read", Any)]],
    after: &[Ask("kick 1", Is("child=1 parent=1 count=5")), Ask("read", Is("read=1 count=4"))],
    ..Spec::DEFAULT
};

/// Three timerfds: a periodic one read all the time (disarmed by the
/// mutation: armed again after rollback, and firing), a one-shot one that
/// expired and was never read (its tick is read by the mutation: there
/// again after rollback), and a periodic one never read (expired and not
/// forwarded whenever the checkpoint looks at it: still periodic and armed
/// after rollback).
static TIMERFD_STAYS_ARMED: Spec = Spec {
    program: program!("timerfd_stays_armed.py"),
    setup: &[Sleep(200)],
    at_ck: &[(
        "state",
        All(&[
            Is("interval_ns=20000000 armed=1 oneshot_ticks=1 unread_interval_ns=10000000 unread_armed=1"),
            // The timer fires.
            AtLeast("total", 3),
        ]),
    )],
    moving: &["total"],
    mutate: &[&[
        // Disarmed, the one-shot read.
        Ask("mutate", Is("interval_ns=0 armed=0 oneshot_ticks=0 unread_interval_ns=10000000 unread_armed=1")),
        Sleep(100),
    ]],
    // Firing after rollback.
    after: &[Sleep(300), Ask("state", Grew("total", "state", 5))],
    ..Spec::DEFAULT
};

/// epoll and signalfd: after rollback the pipe is in the epoll set again
/// and the signalfd reads SIGUSR1.
static EPOLL_AND_SIGNALFD: Spec = Spec {
    program: program!("epoll_and_signalfd.py"),
    setup: &[Ask("probe", Is("ready=pipe,sigfd got=x signos=10"))],
    at_ck: &[("state", Is("ready=-"))],
    mutate: &[&[Ask("mutate", Is("ready=-")), Ask("probe", Is("ready=- got=x signos=-"))]],
    after: &[Ask("probe", Is("ready=pipe,sigfd got=x signos=10"))],
    ..Spec::DEFAULT
};

/// `setitimer` keeps firing after a rollback (the timer was disarmed after
/// the checkpoint; not inherited by fork: put back by the restore).
static INTERVAL_TIMER_KEEPS_FIRING: Spec = Spec {
    program: program!("interval_timer_keeps_firing.py"),
    setup: &[Sleep(100)],
    at_ck: &[("state", Is("interval=0.020 armed=1"))],
    moving: &["ticks"],
    // Round 2 waits for the engine's idle-time standby (the restore then
    // takes the other path).
    mutate: &[&[Ask("mutate", Is("stopped"))], &[Sleep(300), Ask("mutate", Is("stopped"))]],
    after: &[Sleep(200), Ask("state", Grew("ticks", "state", 4))],
    ..Spec::DEFAULT
};

/// Deleted-but-open files (an `O_TMPFILE`, and a named file unlinked while
/// open) come back with the checkpoint's contents and offsets; so do a
/// 101 MiB one with a 75 MiB hole, sparse again (25 MiB allocated), and a
/// 20 MiB memfd (issue 38, item 7: refused over 16 MiB before).
static DELETED_OPEN_FILES: Spec = Spec {
    program: program!("deleted_open_files.py"),
    at_ck: &[(
        "state",
        Is("tmp=tmpfile-ck@10 named=named-ck@8 big=1317ea481fb9:105906176:25 memfd=630f25483a9c:20971520"),
    )],
    mutate: &[&[Ask(
        "mutate",
        Is("tmp=tmpfile-ck+more@15 named=NAMED-ck@5 big=33291246f932:105906176:26 memfd=1224175a7053:20971520"),
    )]],
    // No name in the tree.
    after: &[Sh("test -e /root/gone.txt && echo there || echo gone", Is("gone\n"))],
    ..Spec::DEFAULT
};

/// A named pipe unlinked while open (for reading and writing, with bytes
/// in it) comes back as that FIFO, still deleted, with its bytes; its name
/// is not in the tree again, and closing its writer gives its reader the
/// end (issue 38, item 7: refused before).
static DELETED_FIFO: Spec = Spec {
    program: program!("deleted_fifo.py"),
    at_ck: &[("state", Is("avail=8 link=/root/ff (deleted)"))],
    // (Round 1 starts from round 0's drain.)
    mutate: &[&[Ask(
        "mutate",
        Like(|s| s.ends_with(" link=/root/ff (deleted)") && s != "avail=8 link=/root/ff (deleted)"),
    )]],
    after: &[Sh("test -e /root/ff && echo there || echo gone", Is("gone\n")), Ask("drain", Is("got=ck-bytes"))],
    end: &[Ask("eof", Is("eof=0"))],
    ..Spec::DEFAULT
};

/// The slave of a pty whose master was closed before the checkpoint (what
/// a shell's background jobs hold once its session ended), held by the
/// program and, as its former controlling terminal, by a process it
/// started: each comes back holding a hung-up terminal (the end on read,
/// `EIO` on write and on `isatty`'s `TCGETS`, no controlling terminal),
/// under its name, with its flags
/// (issue 38, item 7: refused before as a deleted file).
static HUNG_UP_TERMINAL: Spec = Spec {
    program: program!("hung_up_terminal.py"),
    at_ck: &[(
        "state",
        Like(|s| {
            s.starts_with("link=/dev/pts/")
                && s.contains(" (deleted) tty=False read=0 write=errno5 child=/dev/pts/")
                && s.ends_with(" (deleted) ctty=0 nonblock=False")
        }),
    )],
    mutate: &[&[Ask("mutate", Like(|s| s.starts_with("new=/dev/pts/")))]],
    ..Spec::DEFAULT
};

/// A worker left as a child of init by processes that exited, sharing a
/// listener with the program that started it (a preforking server's
/// shape), in three places (`orphaned_process_group.py`): a group whose
/// leader is gone in a session whose leader is gone (made anew by
/// surrogates, the worker by the session's), the group of a gone session
/// leader (a notebook's `!server &`), and a gone leader's group in the
/// program's session (an interactive shell's `(server &)`: made by the
/// restored program). Each comes back in its group and session, answering
/// on the shared listener with its counter; a kill of the whole group
/// after the checkpoint does not reach the templates (issue 38, item 1:
/// refused before; a shared listener failed the rollback).
static ORPHANED_PROCESS_GROUP: Spec = Spec {
    program: program!("orphaned_process_group.py"),
    args: &["group"],
    at_ck: &[("state", Is("ppid=init pgrp=True group=ok sid=True worker=w=1 log=pw@2"))],
    setup: &[Ask("bump", Is("w=1"))],
    mutate: &[&[Ask("bump", Is("w=2"))], &[Ask("kill", Is("gone"))]],
    // (One offset for both: the worker's write moves the program's.)
    after: &[Ask("bump", Is("w=2")), Ask("log", Is("pwwp@4"))],
    ..Spec::DEFAULT
};

/// [`ORPHANED_PROCESS_GROUP`], in the group of a gone session leader.
static ORPHAN_IN_A_GONE_SESSION: Spec = Spec { args: &["session"], ..ORPHANED_PROCESS_GROUP };

/// [`ORPHANED_PROCESS_GROUP`], in the program's session, the worker
/// running as `nobody`.
static ORPHAN_IN_A_LIVE_SESSION: Spec = Spec { args: &["live", "nobody"], ..ORPHANED_PROCESS_GROUP };

/// [`ORPHANED_PROCESS_GROUP`]'s worker as the program's child in the group
/// of a sibling that exited (a pipeline's first command): made again by
/// the program after a surrogate it makes (refused before).
static CHILD_IN_A_GONE_GROUP: Spec = Spec {
    args: &["pipeline"],
    at_ck: &[("state", Is("ppid=me pgrp=True group=ok sid=True worker=w=1 log=pw@2"))],
    ..ORPHANED_PROCESS_GROUP
};

/// A directory open and then removed comes back as a removed directory at
/// the same path (with its mode and modification time), empty, taking no
/// new entry; its path is not in the tree (issue 38, item 7: refused
/// before).
static DELETED_DIRECTORY: Spec = Spec {
    program: program!("deleted_directory.py"),
    at_ck: &[("state", Is("link=/root/gonedir (deleted) mode=751 entries=0 mtime=1000000"))],
    mutate: &[&[Ask("mutate", Is("link=/root/gonedir (deleted) mode=700 entries=0 mtime=1000000"))]],
    after: &[Sh("test -e /root/gonedir && echo there || echo gone", Is("gone\n")), Ask("make", Is("make=errno2"))],
    ..Spec::DEFAULT
};

/// A process stopped by SIGSTOP is captured stopped, and comes back
/// stopped after a rollback (it was refused: it would have come back
/// running); continued, it answers (issue 38, job control).
static STOPPED_PROCESS_COMES_BACK_STOPPED: Spec = Spec {
    program: program!("port_is_free_after_the_server_exits.py"),
    args: &["x"],
    setup: &[Signal(19), Sleep(50), Sh("awk '{print $3}' /proc/$PID/stat", Is("T\n"))],
    mutate: &[&[Signal(18), Ask("who", Has(&[("who", "x")]))]],
    after: &[Sh("awk '{print $3}' /proc/$PID/stat", Is("T\n")), Signal(18), Ask("who", Has(&[("who", "x")]))],
    ..Spec::DEFAULT
};

/// A child that switched to another user and exited, not waited for yet
/// (a zombie): a restore makes a zombie again as a copy of its parent,
/// which cannot take another user's ids, so the checkpoint is refused,
/// naming it; once waited for, the program is checkpointed and restored as
/// usual (issue 36, class 2; other zombies come back: below).
static ZOMBIE_OF_ANOTHER_USER_IS_REFUSED: Spec = Spec {
    program: program!("zombie_of_another_user_is_refused.py"),
    setup: &[
        Ask("spawn", Like(|r| r.ends_with("state=Z"))),
        Refused(None, &["a zombie", "ran as other ids"]),
        Ask("reap", Is("status=7")),
    ],
    rounds: 1,
    ..Spec::DEFAULT
};

/// A zombie in the group of a live child (a job's last command that exited
/// before the shell waited for it): a restore makes that group only at the
/// live child's own turn, after the zombie, so the checkpoint is refused,
/// naming the zombie; once waited for, checkpointed and restored as usual.
static ZOMBIE_IN_A_LIVE_LEADERS_GROUP_IS_REFUSED: Spec = Spec {
    program: program!("zombie_in_a_live_leaders_group_is_refused.py"),
    setup: &[
        Ask("spawn", Is("state=Z")),
        Refused(None, &["a zombie", "a group led by a live process"]),
        Ask("reap", Is("status=4")),
    ],
    rounds: 1,
    ..Spec::DEFAULT
};

/// Each zombie child of the program, as `state` tells it at the checkpoint:
/// state, name, group and session.
const ZOMBIES_AT_CK: &str = "member=S/member/leader/mine/mine z-code=Z/z-code/mine/mine/mine \
     z-follow=Z/z-follow/leader/mine/mine z-leader=Z/z-leader/own/mine/mine z-mine=Z/z-mine/mine/mine/mine z-segv=Z/z-segv/mine/mine/mine \
     z-sess=Z/z-sess/own/own/mine z-term=Z/z-term/mine/mine/mine sigchld=7";

/// `state` once the zombies are waited for.
const ZOMBIES_REAPED_STATE: &str = "member=S/member/leader/mine/mine z-code=gone z-follow=gone z-leader=gone z-mine=gone z-segv=gone z-sess=gone z-term=gone sigchld=7";

/// What the program's waits for its zombies get.
const ZOMBIES_REAPED: &str =
    "z-code=exit7 z-follow=exit9 z-leader=exit3 z-mine=exit0 z-segv=sig11 z-sess=exit5 z-term=sig15";

/// Children that exited and that their parent had not waited for yet
/// (zombies: ended by an exit code, by SIGTERM, by SIGSEGV without a core;
/// one leading the group of a live child, one in that group, one leading
/// its own session) come
/// back after a rollback as its zombies, with their pids, names, groups,
/// sessions and exit statuses, the live child in the zombie's group, and
/// no SIGCHLD the parent had not had (a shell's `$(id -u)` between its end
/// and the wait made the E2B door's pause fail).
static ZOMBIE_CHILDREN_COME_BACK: Spec = Spec {
    program: program!("zombie_children_come_back.py"),
    setup: &[Ask("spawn", Is("spawned"))],
    at_ck: &[("state", Is(ZOMBIES_AT_CK))],
    // (Round 2 starts from round 1's `after`, which reaped them.)
    mutate: &[
        &[Ask("reap", Is(ZOMBIES_REAPED)), Ask("state", Is(ZOMBIES_REAPED_STATE))],
        &[Ask("state", Is(ZOMBIES_REAPED_STATE))],
    ],
    after: &[Sleep(100), Ask("state", Is(ZOMBIES_AT_CK)), Ask("reap", Is(ZOMBIES_REAPED))],
    ..Spec::DEFAULT
};

/// Inet sockets made anew at the restore keep their protocol (UDP-Lite is
/// not UDP), their options (TCP_NODELAY, SO_KEEPALIVE, TCP_KEEPIDLE,
/// IP_TTL, IP_TOS, UDP-Lite's checksum coverage) and an address bound with
/// IP_FREEBIND that no interface has (issue 36, classes 3 and 4). The
/// UDP-Lite one with a datagram queued is refused (its datagrams are not
/// captured: UDP's are).
static INET_SOCKET_OPTIONS: Spec = Spec {
    program: program!("inet_socket_options.py"),
    setup: &[
        Ask("queue", Is("queued")),
        Refused(None, &["queued datagrams", "other than UDP"]),
        Ask("unqueue", Is("read=q")),
    ],
    at_ck: &[("opts", Is("tcp=6,1,1,77,33,16 lite=136,20,20 free=17,1,10.253.0.7:7003"))],
    mutate: &[&[Ask("change", Is("tcp=6,0,1,99,44,16 lite=136,30,20 free=17,1,10.253.0.7:7003"))]],
    after: &[Ask("reach", Is("tcp=ok lite=ok"))],
    ..Spec::DEFAULT
};

/// TCP connections with both ends in the sandbox come back exactly:
/// addresses, unread bytes both ways, options, an IPv6 one, and one whose
/// send queue was full (bytes unacknowledged and never sent) carries every
/// byte once, in order; one the server closed (CLOSE_WAIT) gives its bytes,
/// its end, and a reset to a write. A connection not accepted yet, and one
/// half closed by its own side, are refused by name (issue 38, item 6).
static TCP_CONNECTIONS: Spec = Spec {
    program: program!("tcp_connections.py"),
    setup: &[
        // (A connection closed by a killed process lingers in TIME_WAIT,
        // which a new connection may not take over without this.)
        Sh(
            "echo 0 > /proc/sys/net/ipv4/tcp_tw_reuse && cat /proc/sys/net/ipv4/tcp_tw_reuse",
            Like(|a| a.trim() == "0"),
        ),
        Ask("pending", Is("pending")),
        Refused(None, &["not accepted yet"]),
        Ask("accept", Is("accepted")),
        Ask("halfclose", Is("halfclosed")),
        Refused(None, &["TCP connection in state"]),
        Ask("close", Is("closed")),
    ],
    at_ck: &[(
        "state",
        Like(|a| {
            a.contains("pair=True")
                && a.contains("opts=1,1,55,1")
                && a.contains(",9,7,response!,request ")
                && a.contains("v6=")
                && a.contains(",3,six ")
                && a.contains(",0,0")
                && a.contains(",3,bye")
        }),
    )],
    mutate: &[&[Ask("mutate", Is("mutated"))]],
    after: &[Ask("drain", Like(|a| a.starts_with("small=ok v6=ok idle=ok closed=ok big=ok:") && !a.ends_with(":0")))],
    ..Spec::DEFAULT
};

/// A Node.js HTTP server (a child of the client) and a keep-alive client
/// connection to it: after a rollback the next request goes over the same
/// connection (the server sees the checkpoint's client port) and finds the
/// server's count as it was (issue 38, real programs).
static NODE_KEEP_ALIVE_CLIENT: Spec = Spec {
    program: program!("node_keep_alive_client.py"),
    at_ck: &[(
        "state",
        Like(|a| {
            let field = |k: &str| a.split(' ').find_map(|f| f.strip_prefix(k)).map(str::to_string);
            a.starts_with("count=1 ") && field("port=").is_some() && field("port=") == field("local=")
        }),
    )],
    mutate: &[&[Ask("inc", Like(|a| a.starts_with("count=2 ")))]],
    ..Spec::DEFAULT
};

/// redis-server with keys in its memory and a client connection to it:
/// after a rollback the client's next command goes over the same
/// connection (same client id) and finds the keys as they were (issue 38,
/// real programs).
static REDIS_WITH_A_CLIENT: Spec = Spec {
    program: program!("redis_with_a_client.py"),
    at_ck: &[("state", Like(|a| a.starts_with("id=") && a.ends_with(" k=v1 n=1 size=2")))],
    mutate: &[&[Ask("mutate", Is("mutated")), Ask("state", Like(|a| a.ends_with(" k=v2 n=2 size=3")))]],
    ..Spec::DEFAULT
};

/// Mappings marked MADV_DONTFORK (Node's heap: V8 marks it), which a
/// fork leaves out: their template has them (the mark lifted for its
/// fork), and the restored process has their bytes and the mark again.
static DONT_FORK_MAPPING: Spec = Spec {
    program: program!("dont_fork_mapping.py"),
    at_ck: &[("state", Like(|a| a.starts_with("heap=") && a.contains(",True ro=") && a.ends_with(",True")))],
    mutate: &[&[Ask("mutate", Is("mutated"))]],
    ..Spec::DEFAULT
};

/// Mappings marked with `madvise` advice (huge pages or not, wipe on
/// fork, no dump, random or sequential reads), in a process and in its
/// forked child: the marks come back with the pages, from a template (a
/// fork keeps them), from a transplant (the child: made anew) and from an
/// image (every process: made anew). Before, a mapping made anew lost
/// them.
static MAPPING_ADVICE: Spec = Spec {
    program: program!("mapping_advice.py"),
    at_ck: &[(
        "state",
        Is("parent hg:hg nh:nh wf:wf dd:dd rr:rr sr:sr | child hg:hg nh:nh wf:wf dd:dd rr:rr sr:sr | sum=35840"),
    )],
    mutate: &[&[Ask("mutate", Like(|a| a.ends_with("sum=46080")))]],
    ..Spec::DEFAULT
};

/// Locks on files of the layer come back with their owners: `flock`,
/// POSIX record locks (a read and a write range), an OFD lock; another
/// process cannot take them after a rollback (issue 38, item 4).
static FILE_LOCKS: Spec = Spec {
    program: program!("file_locks.py"),
    at_ck: &[(
        "state",
        Is("a=FLOCK/WRITE/0-EOF b=POSIX/READ/10-19+POSIX/WRITE/100-EOF c=OFDLCK/WRITE/0-9 others=busy,busy,busy,busy"),
    )],
    mutate: &[&[Ask("mutate", Is("a=none b=none c=none others=free,free,free,free"))]],
    ..Spec::DEFAULT
};

/// Leases on files of the layer come back (a read lease, and a write
/// lease with its break notice signal): after a rollback, a conflicting
/// open is refused while the lease breaks and the holder's handler is
/// called with its signal (issue 38, item 4).
static FILE_LEASES: Spec = Spec {
    program: program!("file_leases.py"),
    at_ck: &[("state", Is("r=0 w=1 sig=35"))],
    mutate: &[&[Ask("unlease", Is("r=2 w=2 sig=0"))]],
    after: &[Ask("break", Is("open=errno11 broken=35"))],
    ..Spec::DEFAULT
};

/// A file of the layer mapped shared and writable (SQLite's WAL index)
/// comes back with the bytes the mapping had at the checkpoint, mapped
/// onto the rolled-back file: a write through it shows in the file
/// (issue 38, item 3).
static SHARED_FILE_MAPPING: Spec = Spec {
    program: program!("shared_file_mapping.py"),
    at_ck: &[("state", Is("mapping=v1 file=v1"))],
    mutate: &[&[Ask("mutate", Is("mapping=v2 file=v2"))]],
    after: &[Ask("through", Is("through=v3"))],
    ..Spec::DEFAULT
};

/// Shared memory of four kinds (shared anonymous, SysV, a
/// `multiprocessing.Value` with its lock in deleted files of `/dev/shm`,
/// named POSIX shared memory), shared with a forked child: after a
/// rollback both see the checkpoint's values, a page written after the
/// checkpoint is empty again, the lock works, and what the child writes
/// this process sees (issue 38, item 3).
static SHARED_MEMORY: Spec = Spec {
    program: program!("shared_memory.py"),
    at_ck: &[("state", Is("parent=11,11,11,11,11 child=11,11,11,11,11 late=0 lock=True"))],
    mutate: &[&[Ask("set 22", Is("parent=22,22,22,22,22 child=22,22,22,22,22 late=22 lock=True"))]],
    after: &[Ask("child 33", Is("parent=33,33,33,33,33 child=33,33,33,33,33 late=0 lock=True"))],
    ..Spec::DEFAULT
};

/// PostgreSQL (`pg_ctl start`, as the `postgres` user: a postmaster and
/// its children, each in a session of its own, sharing anonymous memory,
/// a SysV segment and `/dev/shm` segments) with a `psql` client holding a
/// transaction open: after a rollback the transaction is open again with
/// its row, a new connection sees only the committed rows, and the commit
/// then succeeds, and an insert after it, with the table and its index
/// agreeing (issue 38, real programs).
static POSTGRESQL_WITH_A_CLIENT: Spec = Spec {
    program: program!("postgresql_with_a_client.py"),
    at_ck: &[("state", Is("mine=1,2,3 tx=t others=1,2"))],
    // (Round 1 starts from round 0's `commit`.)
    mutate: &[&[Ask("mutate", Any)]],
    after: &[Ask("commit", Is("mine=1,2,3,4 tx=f others=1,2,3,4 counts=4,4"))],
    ..Spec::DEFAULT
};

/// Python with SQLite in WAL mode, an open connection and a transaction
/// not committed yet: after a rollback the transaction is still open with
/// its row, another process still sees only the committed rows, and the
/// commit then succeeds with the database intact (issue 38, real
/// programs: locks and a shared mapping of the `-shm` file).
static SQLITE_WAL: Spec = Spec {
    program: program!("sqlite_wal.py"),
    at_ck: &[("state", Is("mine=1,2,3 tx=True others=1,2"))],
    mutate: &[&[Ask("mutate", Is("mine=1,2,3,4,5 tx=False others=1,2,3,4,5"))]],
    after: &[Ask("commit", Is("mine=1,2,3 integrity=ok others=1,2,3"))],
    ..Spec::DEFAULT
};

/// A Jupyter kernel (ipykernel, a child of its client) and a
/// jupyter_client connected over its five loopback ZeroMQ channels: after
/// a rollback the kernel has the checkpoint's variables and function, and
/// the next cells run (issue 38, real programs; its mappings of
/// `/usr/local` files, which `maps` names without `/usr`, are found in the
/// tree again: `process::memory::mapped_file_in_tree`). (One checkpoint:
/// after two, IPython's history database, SQLite, finds its file's inode
/// number changed and turns read-only — the open bug of layered
/// checkpoints that `sqlite_open_database` names.)
static IPYKERNEL_WITH_A_CLIENT: Spec = Spec {
    program: program!("ipykernel_with_a_client.py"),
    checkpoint_once: true,
    at_ck: &[("state", Is("ok:41_2"))],
    mutate: &[&[Ask("mutate", Is("ok:")), Ask("state", Is("ok:99_2"))]],
    after: &[Ask("next", Is("ok:42")), Ask("next", Is("ok:43"))],
    ..Spec::DEFAULT
};

/// POSIX timers (timer_create) come back with their ids, clocks, signals
/// and values, intervals and whether they are armed, one signalling a
/// thread; the periodic one fires again (issue 38, item 5).
static POSIX_TIMERS: Spec = Spec {
    program: program!("posix_timers.py"),
    at_ck: &[(
        "state",
        Is(
            "timers=0,10/0x1234,signal/pid,1;1,0/0x0,none/pid,0;2,12/0x0,signal/pid,1;3,12/0x0,signal/tid,1 beat=0.050,armed quiet=7.000,armed idle=0.000,off thread=0.000,armed",
        ),
    )],
    mutate: &[&[Ask("mutate", Is("mutated"))]],
    after: &[Ask("fires", Is("fires=yes"))],
    ..Spec::DEFAULT
};

/// Signals pending for one thread alone (pthread_kill while it blocks
/// them) come back pending for that thread, with their siginfo (issue 38,
/// item 8).
static SIGNAL_PENDING_FOR_A_THREAD: Spec = Spec {
    program: program!("signal_pending_for_a_thread.py"),
    at_ck: &[("state", Is("thread=0000000000000a00 process=0000000000000000"))],
    // (After a round's `take`, there is nothing left to take.)
    mutate: &[&[Ask("mutate", Like(|a| a == "took=10/0,12/0" || a == "took=none"))]],
    after: &[Ask("take", Is("took=10/0,12/0"))],
    ..Spec::DEFAULT
};

/// A working directory deleted while the process was in it comes back
/// deleted: made again at its path with its mode, entered, removed again
/// (issue 38, item 7).
static DELETED_WORKING_DIRECTORY: Spec = Spec {
    program: program!("deleted_working_directory.py"),
    at_ck: &[("state", Is("cwd=/root/build_(deleted) mode=710 list=ok create=ENOENT"))],
    mutate: &[&[Ask("mutate", Is("moved"))]],
    ..Spec::DEFAULT
};

/// A SO_REUSEPORT group (two TCP listeners and two UDP sockets sharing a
/// port each) comes back whole: new connections and datagrams spread over
/// every member again (issue 38, item 6).
static REUSEPORT_GROUP: Spec = Spec {
    program: program!("reuseport_group.py"),
    at_ck: &[("state", Is("127.0.0.1:7020,1 127.0.0.1:7020,1 127.0.0.1:7021,1 127.0.0.1:7021,1"))],
    mutate: &[&[Ask("mutate", Is("closed"))]],
    after: &[Ask("spread", Is("tcp=both udp=both"))],
    ..Spec::DEFAULT
};

/// Pidfds of the process itself and of init: after rollback the process's
/// pidfds of itself refer to it, not to the original the rollback killed
/// (issue 36, class 6).
static PIDFD_OF_ITSELF: Spec = Spec {
    program: program!("pidfd_of_itself.py"),
    at_ck: &[("state", Is("me=self again=self init=1 inheritable=False,True live=yes,yes"))],
    ..Spec::DEFAULT
};

/// A deleted-but-open file comes back with its owner, mode, modification
/// time, size and holes (it was a 0600 file of root, filled in full); one still linked
/// under another name is refused (a copy would be another file; issue 36,
/// class 5).
static DELETED_FILE_IDENTITY: Spec = Spec {
    program: program!("deleted_file_identity.py"),
    setup: &[
        Ask("linked", Is("linked")),
        Refused(None, &["still linked under another name"]),
        Ask("unlinked", Is("unlinked")),
    ],
    at_ck: &[(
        "state",
        Is("owner=1234:1235 mode=645 size=1048580 segments=0+4096,1048576+4 mtime=1000000001987654321"),
    )],
    mutate: &[&[Ask(
        "mutate",
        Like(|r| r.starts_with("owner=4321:4321 mode=600 size=1048580") && r.contains("524288+")),
    )]],
    ..Spec::DEFAULT
};

/// Memory holding data marked MADV_WIPEONFORK is refused by name: a
/// template, a copy by fork, gets it zeroed, and the restored process
/// lost it (issue 36, class 2). Unmarked, it comes back. (Marked but never
/// written, it holds nothing to lose: not refused. MADV_DONTFORK memory
/// is captured: `dont_fork_mapping`.)
static MAPPING_NOT_COPIED_BY_FORK: Spec = Spec {
    program: program!("mapping_not_copied_by_fork.py"),
    setup: &[
        Ask("wipeonfork", Is("marked")),
        Refused(None, &["MADV_WIPEONFORK", "would be lost"]),
        Ask("keeponfork", Is("unmarked")),
    ],
    at_ck: &[("state", Is("sum=28672 len=1048576"))],
    mutate: &[&[Ask("mutate", Is("sum=19712 len=1048576"))]],
    ..Spec::DEFAULT
};

/// A private mapping of a file the process holds open for writing (on the
/// layer, and deleted) is refused by name: the template's mapping stayed
/// on the old inode, whose later writes its pages showed, and it no longer
/// saw the restored descriptor's writes (issue 36, class 5). With the
/// writable descriptors closed, the mappings come back.
static PRIVATE_MAPPING_OF_A_WRITTEN_FILE: Spec = Spec {
    program: program!("private_mapping_of_a_written_file.py"),
    setup: &[
        Ask("layer", Is("mapped")),
        Refused(None, &["private mapping of /root/mapped", "open for writing"]),
        Ask("close", Is("closed")),
        Ask("deleted", Is("mapped")),
        Refused(None, &["private mapping of /root/gone", "open for writing"]),
        Ask("close", Is("closed")),
    ],
    at_ck: &[("state", Is("gone=g mapped=m"))],
    mutate: &[&[Ask("mutate", Is("gone=X mapped=X"))]],
    ..Spec::DEFAULT
};

/// A process of a user other than root (no capabilities in the sandbox),
/// with a second thread, comes back on its pid and tid through the
/// sandbox's `ns_last_pid` (`clone3`'s `set_tid` needs `CAP_SYS_ADMIN`),
/// with its credentials and files (issue 38; before, the checkpoint
/// refused it: "no CAP_SYS_ADMIN in the sandbox"). A file it holds that its
/// user may not open (opened as root before the switch) and a working
/// directory its user may not enter (it switched in /root) are refused by
/// name: the restore, done as that user, could not open or enter them.
static NON_ROOT_USER: Spec = Spec {
    program: program!("non_root_user.py"),
    // (The working directory is checked in pass 1, a file in pass 2, once
    // it is known that no other process opens it again for this one.)
    setup: &[
        Refused(None, &["working directory /root is not searchable by its user"]),
        Ask("leave", Is("left")),
        Refused(None, &["/tmp/rootonly was opened with rights its user does not have"]),
        Ask("forget", Is("closed")),
    ],
    at_ck: &[(
        "state",
        Is("n=0 uid=1000,1000 gid=1000 cap=0000000000000000 pos=3 threads=2 tid=True pipe=5 pair=paired"),
    )],
    mutate: &[&[Ask(
        "mutate",
        Is("n=1 uid=1000,1000 gid=1000 cap=0000000000000000 pos=4 threads=2 tid=True pipe=9 pair=pairedmore"),
    )]],
    ..Spec::DEFAULT
};

/// Children of a captured process (a fork that did not exec, and a
/// `python3` started with subprocess in a process group of its own) come
/// back as its children, made again by it (issue 38, process trees): their
/// parent pid, its wait for them, their memory, their pipes and groups.
static CHILDREN_COME_BACK: Spec = Spec {
    program: program!("children_come_back.py"),
    at_ck: &[(
        "state",
        Is(
            "forked=0 child=True ppid=True group=True execd=0 child=True ppid=True group=True queued=2 children=2 sums=253828,253828 log=start/ threads=2,2",
        ),
    )],
    mutate: &[&[Ask(
        "mutate",
        Is(
            "forked=1 child=True ppid=True group=True execd=1 child=True ppid=True group=True queued=4 children=2 sums=253829,253829 log=start/c1/p/ threads=2,2",
        ),
    )]],
    end: &[Ask("quit", Is("forked=3 execd=3"))],
    ..Spec::DEFAULT
};

/// Children stopped by `SIGTSTP` (as Ctrl-Z stops a shell's job) come back
/// stopped, and their parent's reports of their stops as they were: the
/// one it had waited for is not reported again, the other still is, and no
/// `SIGCHLD` is pending (issue 38, job control).
static STOPPED_CHILDREN: Spec = Spec {
    program: program!("stopped_children.py"),
    at_ck: &[("state", Is("taken=T,none pending=T,SIGTSTP sigchld=False"))],
    mutate: &[&[Ask("mutate", Is("killed"))]],
    end: &[Ask("cont", Is("ended=[-15, -15]"))],
    ..Spec::DEFAULT
};

/// A thread running with other credentials than the main thread (a raw
/// `setresuid` switches one thread's alone) is refused by name: a thread
/// made again at the restore takes the main thread's (issue 38, any
/// user). With the same credentials again, it comes back.
static THREAD_WITH_ITS_OWN_USER: Spec = Spec {
    program: program!("thread_with_its_own_user.py"),
    setup: &[Refused(None, &["runs with other user ids than the main thread"]), Ask("same", Is("same"))],
    at_ck: &[("state", Is("threads=2 euid=0"))],
    ..Spec::DEFAULT
};

/// Unix connections that a restore cannot make again yet (through a
/// listener of the abstract namespace whose name is not text; from a
/// connecting end bound to a path) are refused by name: the checkpoint's templates held their ends
/// before, so a peer's close after a checkpoint never showed (issue 36,
/// class 1). Closed, the program is checkpointed and rolled back as usual.
static UNIX_CONNECTION_NOT_MADE_AGAIN: Spec = Spec {
    program: program!("unix_connection_not_made_again.py"),
    setup: &[
        Ask("abstract", Is("connected")),
        Refused(None, &["through a listener of the abstract namespace whose name is not text"]),
        Ask("close", Is("closed")),
        Ask("bound", Is("connected")),
        Refused(None, &["made from a bound socket"]),
        Ask("close", Is("closed")),
    ],
    rounds: 1,
    ..Spec::DEFAULT
};

/// A unix listener whose socket file (and its directory) was removed after
/// the bind is refused by name: a restore would bind it again at its path
/// (the rollback failed with ENOENT; issue 36, class 3). Closed, the
/// program is checkpointed and rolled back as usual.
static UNIX_LISTENER_FILE_REMOVED: Spec = Spec {
    program: program!("unix_listener_file_removed.py"),
    setup: &[
        Ask("listen", Is("listening")),
        Refused(None, &["whose socket file was removed"]),
        Ask("close", Is("closed")),
    ],
    rounds: 1,
    ..Spec::DEFAULT
};

/// Mounts the sandbox made in its tree (a tmpfs, a bind mount) are refused
/// by name, since a rollback would lose them while saying it restored
/// exactly (issue 36, class 7); unmounted, the program is checkpointed and
/// rolled back as usual.
static MOUNT_IN_THE_SANDBOX: Spec = Spec {
    program: program!("mount_in_the_sandbox.py"),
    setup: &[
        Ask("tmpfs", Is("mounted")),
        Refused(None, &["mount /root/m", "tmpfs"]),
        Ask("umount", Is("unmounted")),
        Ask("bind", Is("mounted")),
        Refused(None, &["mount /root/b", "bind mount"]),
        Ask("umount", Is("unmounted")),
    ],
    rounds: 1,
    ..Spec::DEFAULT
};

/// A unix stream pair with one end shut down for writing, and a seqpacket
/// pair with messages queued: after each rollback, the end of the stream,
/// the EPIPE and the messages are the checkpoint's. (Issue 36, class 3,
/// reported EPIPE and ECONNRESET at rollbacks of such sockets; in this
/// shape, one process holding both ends, they come back exactly: this case
/// pins that.)
static UNIX_SHUTDOWN: Spec = Spec {
    program: program!("unix_shutdown.py"),
    at_ck: &[("state", Is("stream=eof send=errno32 seqpacket=one"))],
    mutate: &[&[Ask("drain", Is("stream=read after=eof"))]],
    ..Spec::DEFAULT
};

/// A unix socket pair between a program and its child: after a mere
/// checkpoint, the child's exit gives the program the end of the stream
/// (before, the child's template held its end: the program waited
/// forever; issue 36, class 1). After a rollback the pair is made anew,
/// its ends in both restored processes, and works.
static SOCKETPAIR_PEER_CLOSED_AFTER_A_CHECKPOINT: Spec = Spec {
    program: program!("socketpair_peer_closed_after_a_checkpoint.py"),
    at_ck: &[("state", Is("child=pong timeout=3.0 rcvbuf=24690 sndtimeo=2.500000 creds=mine"))],
    // (Round 2 starts from round 1's `after`, whose child quit.)
    mutate: &[&[Ask("close", Is("peer=eof"))], &[]],
    after: &[Ask("close", Is("peer=eof"))],
    ..Spec::DEFAULT
};

/// Output of a pty made in the sandbox that the master has not read yet
/// at the checkpoint (`pexpect` between two calls) is still there after
/// it and after a rollback (before, the checkpoint was refused).
static PTY_OUTPUT_NOT_READ_YET: Spec = Spec {
    program: program!("pty_master_closed_after_a_checkpoint.py"),
    setup: &[Ask("leave", Is("waiting=6"))],
    at_ck: &[("waiting", Is("waiting=6"))],
    mutate: &[&[Ask("collect", Is("got=pong"))], &[]],
    after: &[Ask("collect", Is("got=pong")), Ask("waiting", Is("waiting=0"))],
    ..Spec::DEFAULT
};

/// Unix connections (stream and seqpacket) made through listeners of a
/// process the program started: after a mere checkpoint, the server's
/// close of its end shows as the end of the stream (before, the server's
/// template held that end: the program waited in vain; issue 36, class 1).
/// After a rollback the connections are made anew with the same addresses
/// and peer credentials, and each listener keeps its type and is one
/// socket in the two processes that hold it (before, each bound its own).
/// A connection its listener has not accepted yet is refused by name
/// (before, the restored client found it reset).
static UNIX_CONNECTION_CLOSED_AFTER_A_CHECKPOINT: Spec = Spec {
    program: program!("unix_connection_closed_after_a_checkpoint.py"),
    setup: &[
        Ask("pending", Is("pending")),
        Sleep(50),
        Refused(Some(ErrorCode::ProcessNotRestorable), &["has not accepted yet"]),
        Ask("unpending", Is("closed")),
    ],
    at_ck: &[(
        "state",
        Is(
            "stream=pong,peer=/root/conn.sock,name='',creds=ok,one_listener=True seqpacket=pong,peer=/root/seq.sock,name='',creds=ok,one_listener=True",
        ),
    )],
    mutate: &[&[Ask("close", Is("stream=eof seqpacket=eof"))]],
    after: &[Ask("close", Is("stream=eof seqpacket=eof"))],
    ..Spec::DEFAULT
};

/// A pty the program made, its slave the terminal of a process it
/// started: after a mere checkpoint, closing the master hangs the terminal
/// up and the process dies of SIGHUP (before, the program's template held
/// the master: nothing happened; issue 36, class 1). After a rollback the
/// pty is made anew with its index, size and settings, and both ends work.
static PTY_MASTER_CLOSED_AFTER_A_CHECKPOINT: Spec = Spec {
    program: program!("pty_master_closed_after_a_checkpoint.py"),
    at_ck: &[("state", Like(|a| a.starts_with("tty=/dev/pts/") && a.ends_with(" size=33x77 echo=off child=pong")))],
    // (Round 2 starts from round 1's `after`, which closed it.)
    mutate: &[&[Ask("close", Is("child=gone"))], &[]],
    after: &[Ask("close", Is("child=gone"))],
    ..Spec::DEFAULT
};

/// A unix datagram socket bound to a path of the tree still receives what
/// is sent to that path after a rollback, with the file's mode (before,
/// the rolled-back tree's file was a dead copy: the send was refused;
/// issue 36, class 4). One a captured socket is connected to stays the one
/// it reaches.
static UNIX_DATAGRAM_BOUND_TO_A_PATH: Spec = Spec {
    program: program!("unix_datagram_bound_to_a_path.py"),
    at_ck: &[("state", Is("mode=0o660 name=/root/dgram.sock nonblocking=True"))],
    after: &[Ask("roundtrip", Is("got=hello")), Ask("client", Is("client=hi"))],
    ..Spec::DEFAULT
};

/// A unix listener and a datagram socket bound to relative paths from the
/// process's working directory come back bound at the same relative names
/// (a client's peer name is still `listen.sock`), and receive; a
/// connection through the listener comes back (made again through it);
/// with the
/// process elsewhere, where the names lead to no socket file, a checkpoint
/// is refused, naming the path (issue 38, item 6).
static UNIX_RELATIVE_PATHS: Spec = Spec {
    program: program!("unix_relative_paths.py"),
    setup: &[
        Ask("away", Is("cwd=/")),
        Refused(None, &["relative path listen.sock", "working directory"]),
        Ask("back", Is("cwd=/root/rel")),
    ],
    at_ck: &[("state", Is("listener=listen.sock dgram=dgram.sock cwd=/root/rel kept=listen.sock,listen.sock"))],
    after: &[Ask("roundtrip", Is("stream=ping peer=listen.sock dgram=hello")), Ask("kept", Is("kept=k"))],
    ..Spec::DEFAULT
};

/// Datagrams queued on UDP sockets at the checkpoint come back, from the
/// same senders, in the same order (one of 3000 bytes included; IPv4,
/// IPv6 and IPv4 to a dual-stack socket), on bound sockets
/// (made anew) and on a connected one (kept), and what came after the
/// checkpoint is gone (issue 38, item 6).
static UDP_QUEUED_DATAGRAMS: Spec = Spec {
    program: program!("udp_queued_datagrams.py"),
    at_ck: &[("state", Is("ready"))],
    mutate: &[&[Ask("drain", Any), Ask("late", Is("sent"))]],
    after: &[Ask(
        "drain",
        Is(
            "v4=one@127.0.0.1:9410,len3000@127.0.0.1:9410 v6=six@::1:9411,mapped@::ffff:127.0.0.1:9410 conn=c1@127.0.0.1:9402,c2@127.0.0.1:9402",
        ),
    )],
    ..Spec::DEFAULT
};

/// What `drain` answers with the files in flight of `fill`.
const IN_FLIGHT: &str = "d:pipe[1]=hello,file[1]=345,plain[0]=,epoll[1]=ready=1,memfd[1]=memfd-data,both[2]=zzQ s:headfd[1]=12/3,tail[0]= q:sock[1]=to-e0/pong c:ev[1]=5 u:to-inbox@/root/snd.sock[2]=dgX,anon@[1]=9";

/// Files sent on unix sockets with `SCM_RIGHTS` and not received yet come
/// back in their messages, each working as it did: a pipe's read end
/// (its write end kept), both ends of a pipe with bytes in it, an epoll
/// watching a kept eventfd, a memfd with its contents, a file at its
/// offset, a dup of a file the
/// program keeps open (one offset), a socket pair's end with data queued
/// on it, an eventfd with its counter, on a datagram pair, a stream pair,
/// a seqpacket pair and a connection through a listener; what came after
/// the checkpoint is gone. A deleted file in flight is refused by name, as
/// is an empty message (issue 38, item 6: every one was refused before).
static DESCRIPTORS_IN_FLIGHT: Spec = Spec {
    program: program!("descriptors_in_flight.py"),
    setup: &[
        Ask("deleted", Is("sent")),
        Refused(None, &["deleted file /root/gone.txt is in flight"]),
        Ask("drain", Is("d:deleted[1]=? s: q: c: u:")),
        Ask("empty", Is("sent")),
        Refused(None, &["an empty message is queued"]),
        Ask("drain", Is("d:[1]=? s: q: c: u:")),
        Ask("fill", Is("sent")),
    ],
    at_ck: &[("state", Is("ready"))],
    mutate: &[&[Ask("drain", Any), Ask("late", Is("sent"))]],
    after: &[Ask("drain", Is(IN_FLIGHT))],
    ..Spec::DEFAULT
};

/// Files a child sent its parent on a unix stream pair and closed: a TCP
/// listener no process holds, and a pipe's write end whose read end the
/// child keeps. After each rollback the parent receives them, the listener
/// accepts on its port, and a line written to the pipe reaches the child,
/// which answers on the pair with the counter of an eventfd its parent
/// sent it, in flight too (issue 38, item 6).
static DESCRIPTORS_IN_FLIGHT_BETWEEN_PROCESSES: Spec = Spec {
    program: program!("descriptors_in_flight_between_processes.py"),
    setup: &[Ask("fill", Is("sent"))],
    at_ck: &[("state", Is("ready"))],
    mutate: &[&[Ask("drain", Any)]],
    after: &[Ask("drain", Is("listener[1]=accepted,pipe[1]=echo:x ev=7"))],
    ..Spec::DEFAULT
};

/// A child's answers on unix socket pairs, sent before it exited and not
/// read yet (a `multiprocessing.Pipe()` worker's result): after each
/// rollback the parent reads them, then the end of the stream; on the
/// datagram pair nothing more, and its send is refused; where the child
/// left the parent's message unread, the read after the data fails with
/// ECONNRESET (issue 38, item 6: refused before, "data in flight whose
/// sender is not a captured process").
static REPLIES_FROM_A_GONE_CHILD: Spec = Spec {
    program: program!("replies_from_a_gone_child.py"),
    setup: &[Ask("fill", Is("sent"))],
    at_ck: &[("state", Is("ready"))],
    mutate: &[&[Ask("drain", Any)]],
    after: &[Ask("drain", Is("s=result,eof d=dgram-result,again,send:ECONNREFUSED r=late,reset"))],
    ..Spec::DEFAULT
};

/// Unix connections through listeners of the abstract namespace (a stream
/// one and a seqpacket one, as Xvfb's `@/tmp/.X11-unix/X0`), with data
/// queued both ways: after each rollback both ends have their addresses
/// and peer credentials, the data is there, a message goes through, the
/// listener accepts a new connection, and one made after the checkpoint
/// is not pending (issue 38, item 6: refused before, "made through a
/// listener of the abstract namespace").
static ABSTRACT_UNIX_CONNECTIONS: Spec = Spec {
    program: program!("abstract_unix_connections.py"),
    at_ck: &[(
        "state",
        Is("s=b'\\x00sandtree-stream'>b'\\x00sandtree-stream' q=b'\\x00sandtree-seq'>b'\\x00sandtree-seq' creds=ok"),
    )],
    mutate: &[&[Ask("drain", Any), Ask("late", Is("connected")), Ask("close", Is("closed"))]],
    after: &[Ask("drain", Is("s=to-server-s/to-client-s q=to-server-q/to-client-q pending=none echo=ping new=ok"))],
    ..Spec::DEFAULT
};

/// An X server (Xvfb) with a client watching a property of its root
/// window, connected through the abstract namespace: after each rollback
/// the server has the checkpoint's property, the watching client is still
/// connected and sees the next change, and new clients connect (issue 38,
/// item 6: a computer-use agent's desktop, refused before).
static XVFB_WITH_CLIENTS: Spec = Spec {
    program: program!("xvfb_with_clients.py"),
    setup: &[Ask("set one", Is("set"))],
    // (The watching client's connection is through the abstract name.)
    at_ck: &[("get", Is("FOO=one")), ("spy", Is("seen=one")), ("links", Is("abstract=2 path=1"))],
    mutate: &[&[Ask("set two", Is("set")), Ask("spy", Like(|s| s.ends_with(",two")))]],
    after: &[Ask("set three", Is("set")), Ask("spy", Is("seen=one,three")), Ask("get", Is("FOO=three"))],
    ..Spec::DEFAULT
};

/// Datagrams queued on an unconnected unix datagram socket bound to a path
/// come back in order, each from its sender (a socket bound to a path, one
/// bound to a relative path, an unbound one), and what came after the
/// checkpoint is gone; one from a sender no process holds any more is
/// refused, naming it (issue 38, item 6).
static UNIX_DATAGRAMS_FROM_SENDERS: Spec = Spec {
    program: program!("unix_datagrams_from_senders.py"),
    setup: &[
        Ask("gone", Is("sent")),
        Refused(None, &["from /root/gone.sock", "no captured process"]),
        Ask("drain", Is("bye@/root/gone.sock")),
        Ask("connect", Is("sent")),
        Refused(None, &["bound to /root/inbox.sock", "connected to"]),
        Ask("drain", Is("via-k@")),
        Ask("disconnect", Is("closed")),
        Ask("fill", Is("sent")),
    ],
    at_ck: &[("state", Is("ready"))],
    mutate: &[&[Ask("drain", Any), Ask("late", Is("sent"))]],
    after: &[Ask("drain", Is("from-a@/root/a.sock,anon@,from-b@b.sock,again@/root/a.sock"))],
    ..Spec::DEFAULT
};

/// Epoll watches keyed by descriptor numbers that no longer name the
/// watched files (dup'd, then closed) are refused by name: the restore
/// cannot re-create them under those numbers (before, the rollback failed
/// with EBADF, or watched another file with the old data; issue 36,
/// classes 3 and 6). Closed, the program is checkpointed as usual.
static EPOLL_WATCH_OF_A_CLOSED_NUMBER: Spec = Spec {
    program: program!("epoll_watch_of_a_closed_number.py"),
    setup: &[
        Ask("watch", Is("watching")),
        Refused(None, &["no longer name the watched files"]),
        Ask("unwatch", Is("unwatched")),
    ],
    rounds: 1,
    ..Spec::DEFAULT
};

/// Memfds holding a program run through their descriptor (fexecve): after
/// rollback they still run (issue 36, class 6, reported ETXTBSY).
static MEMFD_EXEC: Spec =
    Spec { program: program!("memfd_exec.py"), at_ck: &[("run", Is("plain=0 sealed=0"))], ..Spec::DEFAULT };

/// A memfd mapped shared and private, shared with a forked child (which
/// its parent makes again at a restore), comes back as the same memfd: the
/// checkpoint's contents through every mapping (the private one's own page
/// too), its offset, the child still sharing it (issue 38, item 8: refused
/// before).
static MEMFD_MAPPED: Spec = Spec {
    program: program!("memfd_mapped.py"),
    at_ck: &[("state", Is("shared=ck,ck private=ck,own late=b'\\x00\\x00\\x00\\x00' pos=3 child=ckck"))],
    mutate: &[&[Ask("mutate", Is("shared=MU,MU private=MU,own late=b'late' pos=5 child=MUMU"))]],
    after: &[Ask("child", Is("shared=CH,ck private=CH,own late=b'\\x00\\x00\\x00\\x00' pos=3 child=CHCH"))],
    ..Spec::DEFAULT
};

/// A POSIX message queue held open is refused by name (it was refused as
/// a file "on a mount that rollback replaces"); closed, the process is
/// checkpointed.
static POSIX_MESSAGE_QUEUE: Spec = Spec {
    program: program!("posix_message_queue.py"),
    setup: &[Refused(None, &["POSIX message queue /sandtree-q", "mq_open"]), Ask("close", Is("closed"))],
    rounds: 1,
    ..Spec::DEFAULT
};

/// sqlite3 with an open database (autocommit: no lock held between
/// statements): after rollback the connection sees the checkpoint's rows,
/// and keeps working. (One checkpoint: after two, the restored connection
/// finds the database file's inode number changed and turns read-only — an
/// open bug of layered checkpoints, see docs/architecture/process-pool.md.)
static SQLITE_OPEN_DATABASE: Spec = Spec {
    program: program!("sqlite_open_database.py"),
    setup: &[Ask("add", Any), Ask("add", Any), Ask("add", Any)],
    at_ck: &[("count", Is("rows=3"))],
    checkpoint_once: true,
    mutate: &[&[Ask("count", Any), Ask("add", Any), Ask("add", Plus("rows", "count", 2))]],
    after: &[
        Ask("add", Is("rows=4")),
        Sh(
            "python3 -c \"import sqlite3; print(sqlite3.connect('/root/app.db').execute('pragma integrity_check').fetchone()[0])\"",
            Is("ok\n"),
        ),
    ],
    ..Spec::DEFAULT
};

// ---------------------------------------------------------------------------
// Special cases: their checks do not fit the declared loop (several
// checkpoints, the engine's counters and switches, values compared across
// rounds or with the time before the rollback, sessions, a second server).
// Their programs are files too.

/// Memory and xmm registers (a C program): after rollback the state is the
/// checkpoint's, the same advances from it give the same state every round,
/// and the bursts cut by the checkpoint finish with the right result.
fn memory_and_registers(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let src = program!("memory_and_registers.c");
        let build = "cat > /root/fpu.c && gcc -O2 -msse2 -o /root/fpu /root/fpu.c";
        sh_with(e, &sb, build, Some(src), BTreeMap::new()).await?;
        let w = Workload::start_in(e, sb, argv(&["/root/fpu"])).await?;
        w.ask(e, "advance").await?;
        let at_ck = w.ask(e, "advance").await?;
        ensure!(field(&at_ck, "counter")? == "2" && field(&at_ck, "bad")? == "0", "{at_ck}");
        let ck = w.checkpoint(e).await?;
        let bursts_ck = num(&w.ask(e, "bursts").await?, "bursts")?;
        let mut mutated: Option<String> = None;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            w.ask(e, "advance").await?;
            let m = w.ask(e, "advance").await?;
            c.eq("counter after advancing", &field(&m, "counter")?, "4");
            if let Some(prev) = &mutated {
                c.eq("state after the same advances from the restored state", &m, prev);
            }
            mutated = Some(m);
            w.rollback(e, &ck).await?;
            c.eq("state after rollback", &w.ask(e, "state").await?, &at_ck);
            // Let bursts that were cut by the checkpoint finish, and more run.
            sleep_ms(150).await;
            let b = w.ask(e, "bursts").await?;
            c.eq("bursts with a wrong result (xmm registers lost)", &field(&b, "bad")?, "0");
            c.that(num(&b, "bursts")? > bursts_ck, || format!("no burst ran after the rollback: {b}"));
            c.eq("state after rollback and bursts", &w.ask(e, "state").await?, &at_ck);
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// A rollback right after a checkpoint whose template is made from the
/// previous one's standby (`incremental.rs`): the 3,500 pages written
/// before it are still being written into that template when the rollback
/// asks for it, which waits for them; the memory comes back exactly.
fn rollback_while_pages_are_written(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("rollback_while_pages_are_written.py")).await?;
        let at_first = w.ask(e, "sum").await?;
        let first = w.checkpoint(e).await?;
        // (The standby the next checkpoint starts from.)
        sleep_ms(300).await;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            let at_ck = w.ask(e, "dirty").await?;
            let ck = w.checkpoint_once(e).await?;
            // At once: no request in between.
            w.rollback(e, &ck).await?;
            c.eq("memory after a rollback at once", &w.ask(e, "sum").await?, &at_ck);
            let later = w.ask(e, "dirty").await?;
            c.that(later != at_ck, || format!("dirty changed nothing: {later}"));
            w.rollback(e, &first).await?;
            c.eq("memory after a rollback to the first checkpoint", &w.ask(e, "sum").await?, &at_first);
            w.rollback(e, &ck).await?;
            c.eq("memory after a rollback to it again", &w.ask(e, "sum").await?, &at_ck);
            c.result(round)?;
            sleep_ms(300).await;
        }
        // The killed originals' userfaultfds are kept until their memory
        // is gone (`track.rs`, `Parked`), then closed: the restored
        // processes are not tracked until their next checkpoint, so none
        // stays open.
        let deadline = Instant::now() + Duration::from_secs(5);
        while userfaultfds()? > 0 {
            if Instant::now() > deadline {
                bail!("{} userfaultfd(s) still open 5 s after the last rollback", userfaultfds()?);
            }
            sleep_ms(20).await;
        }
        w.delete(e).await
    })
}

/// Userfaultfds this process (the engine) holds.
fn userfaultfds() -> Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if std::fs::read_link(entry?.path()).is_ok_and(|l| l.to_string_lossy().contains("userfaultfd")) {
            n += 1;
        }
    }
    Ok(n)
}

/// Checkpoints back to back of a process whose standbys take milliseconds
/// to fork: each finds the previous template's standby still being forked
/// (the fork, and the child it makes in the sandbox, run beside the
/// checkpoint, `holder.rs`), and takes it once it is done, or starts from
/// the standby of the template before (`incremental::OlderStandby`: the pages the
/// step before wrote are read from the previous template); every
/// checkpoint's memory comes back exactly, the pages each step wrote and
/// the ones it left as the step before wrote them.
fn checkpoints_while_standbys_fork(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("checkpoints_while_standbys_fork.py")).await?;
        w.checkpoint(e).await?;
        sleep_ms(500).await;
        let (from_prev, later) =
            (e.process_stats().templates_from_older_standbys, e.process_stats().templates_from_forks_under_way);
        let mut taken = Vec::new();
        for k in 1..=8 {
            w.ask(e, "dirty").await?;
            // At once: no pause for the standby.
            taken.push((w.checkpoint_now(e).await?, k));
        }
        let later = e.process_stats().templates_from_forks_under_way - later;
        println!(
            "  {} of 8 checkpoints started from the standby of the template before the previous one, {later} took a standby still being forked",
            e.process_stats().templates_from_older_standbys - from_prev
        );
        let mut c = Checks::default();
        for (ck, k) in taken.iter().rev() {
            w.rollback(e, ck).await?;
            c.eq("memory after a rollback", &w.ask(e, "check").await?, &format!("step={k} same=True"));
        }
        c.result(0)?;
        w.delete(e).await
    })
}

/// Checkpoints that take their previous template's standby while its fork
/// is (as far as they know) still under way (`incremental::ForkingStandby`; made
/// certain by `hold_standby_forks`): the frozen window does not wait for
/// it, the template stands in for its standby until the tracer collects
/// the fork after the reply. Every checkpoint's memory comes back exactly,
/// also after the one before was deleted, and the next checkpoints start
/// from the standbys so taken.
fn standbys_taken_while_forking(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let _hold = Switch::on(e, sandtree_runtime::TestSwitches::hold_standby_forks);
        let w = Workload::start_python(e, program!("checkpoints_while_standbys_fork.py")).await?;
        w.checkpoint(e).await?;
        let later = e.process_stats().templates_from_forks_under_way;
        let mut taken = Vec::new();
        for k in 1..=6 {
            w.ask(e, "dirty").await?;
            // (The previous template's pages written, its standby's fork
            // started: held.)
            sleep_ms(300).await;
            taken.push((w.checkpoint_now(e).await?, k));
            if k == 4 {
                let (ck3, _) = taken.remove(2);
                e.delete_checkpoint(&ck3, true).await.context("delete checkpoint 3")?;
            }
        }
        let later = e.process_stats().templates_from_forks_under_way - later;
        let mut c = Checks::default();
        c.that(later >= 5, || format!("{later} of 6 checkpoints took a standby still being forked"));
        let mut order: Vec<&(String, usize)> = taken.iter().rev().collect();
        order.extend(taken.iter().step_by(2));
        for (ck, k) in order {
            w.rollback(e, ck).await?;
            c.eq(
                &format!("memory after a rollback to step {k}"),
                &w.ask(e, "check").await?,
                &format!("step={k} same=True"),
            );
        }
        c.result(0)?;
        w.delete(e).await
    })
}

/// A standby taken while it was still being forked that is lost once
/// forked, after the checkpoint's reply (`lose_next_standby_taken_while_forking`,
/// as a fork that fails): that checkpoint's templates are dropped, so it
/// shows as evicted and a rollback to it restarts the processes and says
/// so; the template that stood in for the standby (the checkpoint
/// before's) is not touched, and rollbacks to that one and to the next
/// checkpoint bring the memory back exactly.
fn standby_lost_after_the_reply(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let _hold = Switch::on(e, sandtree_runtime::TestSwitches::hold_standby_forks);
        let w = Workload::start_python(e, program!("checkpoints_while_standbys_fork.py")).await?;
        let ck0 = w.checkpoint(e).await?;
        w.ask(e, "dirty").await?;
        sleep_ms(300).await;
        let later = e.process_stats().templates_from_forks_under_way;
        e.test_switches().lose_next_standby_taken_while_forking(true);
        let ck1 = w.checkpoint_now(e).await;
        let taken = e.process_stats().templates_from_forks_under_way - later;
        // (The tracer collects the fork after the reply, before its next
        // job: the next checkpoint's.)
        let both = async {
            let ck1 = ck1?;
            w.ask(e, "dirty").await?;
            sleep_ms(300).await;
            Ok::<_, anyhow::Error>((ck1, w.checkpoint_now(e).await?))
        }
        .await;
        e.test_switches().lose_next_standby_taken_while_forking(false);
        let (ck1, ck2) = both?;
        let mut c = Checks::default();
        c.that(taken == 1, || format!("{taken} checkpoints took a standby still being forked, want 1"));
        let state = e.get_checkpoint(&ck1).await?.process_state;
        c.that(state == ProcessState::Evicted, || format!("the checkpoint whose standby was lost: {state:?}"));
        for (ck, k) in [(&ck0, 0), (&ck2, 2)] {
            w.rollback(e, ck).await?;
            c.eq(
                &format!("memory after a rollback to step {k}"),
                &w.ask(e, "check").await?,
                &format!("step={k} same=True"),
            );
        }
        let refused = e.rollback(&w.sb, RollbackRequest { checkpoint: ck1.clone(), allow_restart: false }).await;
        c.that(matches!(&refused, Err(err) if err.code() == ErrorCode::ProcessesLost), || {
            format!("a rollback to it without allow_restart: {:?}", refused.as_ref().map(|r| &r.note))
        });
        let r = e
            .rollback(&w.sb, RollbackRequest { checkpoint: ck1.clone(), allow_restart: true })
            .await
            .context("rollback")?;
        c.that(r.processes_restarted && r.note.contains("evicted"), || format!("rollback to it: {}", r.note));
        c.result(0)?;
        w.delete(e).await
    })
}

/// A process-wide test switch of the engine (`prefer_older_standbys`,
/// `hold_standby_forks`), on for as long as this lives.
struct Switch<'e>(&'e sandtree_runtime::TestSwitches, fn(&sandtree_runtime::TestSwitches, bool));

impl<'e> Switch<'e> {
    fn on(e: &'e Engine, set: fn(&sandtree_runtime::TestSwitches, bool)) -> Switch<'e> {
        set(e.test_switches(), true);
        Switch(e.test_switches(), set)
    }
}

impl Drop for Switch<'_> {
    fn drop(&mut self) {
        (self.1)(self.0, false);
    }
}

/// Templates made from the standby of the template before the previous one
/// (`incremental::OlderStandby`, taken here whenever it is ready): the previous
/// template's changes (the pages the step before wrote, read from it, and
/// the pages it dropped) go into the standby before the checkpoint's own.
/// Every checkpoint's memory comes back exactly: pages each step wrote,
/// pages it left as the step before wrote them, pages dropped (read back
/// as zeros) and pages written again after they were dropped; also the
/// one whose previous checkpoint was deleted right after it was made.
fn templates_from_older_standbys(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let _prefer = Switch::on(e, sandtree_runtime::TestSwitches::prefer_older_standbys);
        let w = Workload::start_python(e, program!("templates_from_older_standbys.py")).await?;
        w.checkpoint(e).await?;
        sleep_ms(300).await;
        let from_prev = e.process_stats().templates_from_older_standbys;
        let mut taken = Vec::new();
        for k in 1..=8 {
            w.ask(e, "dirty").await?;
            taken.push((w.checkpoint_now(e).await?, k));
            // The checkpoint before, deleted at once: this one's pages are
            // still to be read from its template (written first).
            if k == 5 {
                let (ck4, _) = taken.remove(3);
                e.delete_checkpoint(&ck4, true).await.context("delete checkpoint 4")?;
            }
            // (The pages written into the templates, and the standbys forked.)
            sleep_ms(200).await;
        }
        let used = e.process_stats().templates_from_older_standbys - from_prev;
        let mut c = Checks::default();
        // From the second on: the first's previous template was a fork.
        c.that(used >= 6, || format!("{used} of 8 checkpoints started from the older standby"));
        let mut order: Vec<&(String, usize)> = taken.iter().rev().collect();
        order.extend(taken.iter().step_by(3));
        for (ck, k) in order {
            w.rollback(e, ck).await?;
            let dropped = if k % 2 == 0 { "True" } else { "False" };
            c.eq(
                &format!("memory after a rollback to step {k}"),
                &w.ask(e, "check").await?,
                &format!("step={k} same=True dropped={dropped}"),
            );
        }
        c.result(0)?;
        w.delete(e).await
    })
}

/// PostgreSQL and its `psql` client through checkpoints made from
/// standbys: a step (the client commits and opens another transaction
/// with a row inserted) before each of five checkpoints taken a moment
/// apart, then a rollback to each, each followed by a step, which must
/// find the rows of its checkpoint and add one (the client's templates
/// made from standbys lost the pages it wrote across two adjacent
/// mappings, and the insert waited forever for a transaction of the
/// future: `incremental::scan`).
fn postgresql_through_checkpoints(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("postgresql_with_a_client.py")).await?;
        let mut c = Checks::default();
        let mut taken = Vec::new();
        for _ in 0..5 {
            let rows = w.ask(e, "step").await?;
            taken.push((w.checkpoint_once(e).await?, rows));
            // (The standbys forked meanwhile.)
            sleep_ms(150).await;
        }
        w.ask(e, "step").await?;
        let order = [4, 2, 0, 3, 1, 4];
        for i in order {
            let (ck, rows) = &taken[i];
            w.rollback(e, ck).await?;
            let want = rows.trim().parse::<u64>().context("rows")? + 1;
            c.eq(
                &format!("a step after a rollback to checkpoint {}", i + 1),
                &w.ask(e, "step").await?,
                &want.to_string(),
            );
        }
        c.result(0)?;
        w.delete(e).await
    })
}

/// A descriptor's close-on-exec flag flipped between two checkpoints: the
/// second checkpoint cannot take the first one's standby as it is (the flag
/// is the descriptor table's, which the standby copied), and its checks
/// compare the flag with the first template's image. Each of three
/// checkpoints brings its own flag back.
fn close_on_exec_flipped_between_checkpoints(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("close_on_exec_flipped_between_checkpoints.py")).await?;
        let mut c = Checks::default();
        c.eq("at the first checkpoint", &w.ask(e, "state").await?, "inheritable=False");
        let first = w.checkpoint(e).await?;
        c.eq("flipped", &w.ask(e, "flip").await?, "inheritable=True");
        // (The first one's standby is made meanwhile.)
        sleep_ms(100).await;
        let second = w.checkpoint_once(e).await?;
        sleep_ms(100).await;
        // Unchanged since the second: from its standby.
        let third = w.checkpoint_once(e).await?;
        c.eq("flipped back", &w.ask(e, "flip").await?, "inheritable=False");
        for (ck, want) in [(&second, "True"), (&first, "False"), (&third, "True"), (&first, "False")] {
            w.rollback(e, ck).await?;
            c.eq(&format!("after a rollback to {ck}"), &w.ask(e, "state").await?, &format!("inheritable={want}"));
        }
        c.result(0)?;
        w.delete(e).await
    })
}

/// Files sent in flight between two checkpoints of a process: the second
/// checkpoint would make its template from the first's standby, which
/// cannot be given them; it forks the process instead
/// (`checkpoint::unix_data_queued`). Both checkpoints come back exactly.
fn descriptors_in_flight_after_a_checkpoint(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("descriptors_in_flight.py")).await?;
        let mut c = Checks::default();
        let before = w.checkpoint(e).await?;
        // (Its descriptors as they were: the standby would do.)
        c.eq("sent", &w.ask(e, "light").await?, "sent");
        // (The first one's standby is made meanwhile.)
        sleep_ms(100).await;
        let sent = w.checkpoint_once(e).await?;
        let file = "d:file[1]=345 s: q: c: u:";
        for (ck, want) in [(&sent, file), (&before, "d: s: q: c: u:"), (&sent, file)] {
            w.rollback(e, ck).await?;
            c.eq(&format!("after a rollback to {ck}"), &w.ask(e, "drain").await?, want);
        }
        c.result(0)?;
        w.delete(e).await
    })
}

/// A sleeping loop comes back with the checkpoint's tick count (not 0, not
/// the count before the rollback) and keeps ticking.
fn sleep_loop_keeps_ticking(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("sleep_loop_keeps_ticking.py")).await?;
        sleep_ms(200).await;
        let before_ck = num(&w.ask(e, "state").await?, "ticks")?;
        let ck = w.checkpoint(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            sleep_ms(400).await;
            let before_rb = num(&w.ask(e, "state").await?, "ticks")?;
            w.rollback(e, &ck).await?;
            let after = num(&w.ask(e, "state").await?, "ticks")?;
            // From the checkpoint's count, not from 0 and not from where the
            // rolled-back process was.
            c.that(after >= before_ck && after < before_rb, || {
                format!("ticks {after} after rollback: checkpoint at >= {before_ck}, before the rollback {before_rb}")
            });
            sleep_ms(200).await;
            let later = num(&w.ask(e, "state").await?, "ticks")?;
            c.that(later > after, || format!("not ticking after rollback: {after} then {later}"));
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// A child subreaper is one again after a rollback, from a template made
/// by a fork and from one made while the process ran no code (the quiet
/// path, which reads nothing of it).
fn child_subreaper_survives_rollback(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("child_subreaper_survives_rollback.py")).await?;
        ensure!(w.ask(e, "state").await? == "subreaper=1");
        let ck1 = w.checkpoint(e).await?;
        // Nothing ran in between: the second template comes from the first.
        let ck2 = w.checkpoint(e).await?;
        let mut c = Checks::default();
        c.eq("after the checkpoints", &w.ask(e, "state").await?, "subreaper=1");
        for (round, ck) in [&ck1, &ck2, &ck1].into_iter().enumerate() {
            c.eq("cleared", &w.ask(e, "mutate").await?, "cleared");
            w.rollback(e, ck).await?;
            c.eq(&format!("after a rollback to {ck}"), &w.ask(e, "state").await?, "subreaper=1");
            c.result(round)?;
            c = Checks::default();
        }
        w.delete(e).await
    })
}

/// A server's port is free again once the server exits after a checkpoint
/// (its template does not hold the listener), another server can take it,
/// and a rollback brings the original back on it.
fn port_is_free_after_the_server_exits(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let who = program!("port_is_free_after_the_server_exits.py");
        let w = Workload::start(e, python(who, &["first"])).await?;
        ensure!(field(&w.ask(e, "who").await?, "who")? == "first");
        let ck = w.checkpoint(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            e.kill_process(&w.sb, w.pid, 9).await?;
            sleep_ms(50).await;
            let second = Workload::start_in(e, w.sb.clone(), python(who, &["second"])).await?;
            c.eq("a new server on the port", &field(&second.ask(e, "who").await?, "who")?, "second");
            w.rollback(e, &ck).await?;
            c.eq("the original after rollback", &w.ask(e, "who").await?, &format!("who=first pid={}", w.pid));
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// A bash session's cwd, variables, options, alias and history come back.
fn session_shell_state(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let s = e.create_session(&sb, Default::default()).await?;
        let w = Workload { sb, pid: s.pid };
        let run = |cmd: &str| {
            let cmd = cmd.to_string();
            let (sb, sid) = (w.sb.clone(), s.id.clone());
            async move {
                let out = e
                    .session_run(&sb, &sid, SessionRunRequest { command: cmd.clone(), timeout_ms: Some(10_000) })
                    .await?;
                ensure!(!out.timed_out, "`{cmd}` timed out: {}", out.output);
                Ok::<_, anyhow::Error>(out.output.trim().to_string())
            }
        };
        for line in typed_lines(program!("session_shell_state.sh")) {
            run(line).await?;
        }
        let report = "echo \"$PWD|$SV|$LV|$([[ -o noclobber ]] && echo noclobber || echo clobber)|$(type -t hi || echo none)|$(history | grep -c 'ck-mark[e]r')|$(history | grep -c 'mut-mark[e]r')\"";
        let at_ck = run(report).await?;
        ensure!(at_ck == "/root/sess|ck|local-ck|noclobber|alias|1|0", "{at_ck}");
        ensure!(run("hi").await? == "alias-ck", "alias");
        let ck = w.checkpoint(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            run("cd / && export SV=mut && LV=mut && set +o noclobber && unalias hi && echo mut-marker").await?;
            c.eq("mutated", &run(report).await?, "/|mut|mut|clobber|none|1|1");
            w.rollback(e, &ck).await?;
            // The report line itself went into the history at the checkpoint.
            c.eq("shell state after rollback", &run(report).await?, &at_ck);
            c.eq("alias after rollback", &run("hi").await?, "alias-ck");
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// A session's shell that exits after a checkpoint ends the session's
/// output (its terminal hangs up: before, the shell's template held the
/// terminal's slave, and the output never ended; issue 36, class 1). A
/// rollback brings the shell back on the same terminal, and the session
/// runs commands again.
fn session_ends_when_its_shell_exits(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let s = e.create_session(&sb, Default::default()).await?;
        let w = Workload { sb: sb.clone(), pid: s.pid };
        let run = |cmd: &'static str| {
            let (sb, sid) = (sb.clone(), s.id.clone());
            async move {
                let req = SessionRunRequest { command: cmd.into(), timeout_ms: Some(10_000) };
                let out = e.session_run(&sb, &sid, req).await?;
                ensure!(!out.timed_out, "`{cmd}` timed out: {}", out.output);
                Ok::<_, anyhow::Error>(out.output.trim().to_string())
            }
        };
        run("cd /root && T=kept").await?;
        let ck = w.checkpoint(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            let mut io = e.session_io(&sb, &s.id).await?;
            io.write(b"exit\n").await?;
            let ended = tokio::time::timeout(Duration::from_secs(3), async {
                loop {
                    match io.output.recv().await {
                        Ok(bytes) if bytes.is_empty() => return true,
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return true,
                    }
                }
            })
            .await
            .unwrap_or(false);
            c.eq("session output after `exit`", if ended { "ended" } else { "still open" }, "ended");
            w.rollback(e, &ck).await?;
            c.eq("shell after rollback", &run("echo \"$PWD $T\"").await?, "/root kept");
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// A session closed after a checkpoint (its terminal gone): a rollback
/// still restores its shell, on a hung-up terminal in place of its own
/// (before templates held no slave, theirs was that terminal, hung up),
/// and the shell ends as it would have had it run on (before this, the
/// rollback failed: the terminal could not be opened again, EIO).
fn session_closed_since_the_checkpoint(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let s = e.create_session(&sb, Default::default()).await?;
        let w = Workload { sb: sb.clone(), pid: s.pid };
        let req = SessionRunRequest { command: "cd /root".into(), timeout_ms: Some(10_000) };
        e.session_run(&sb, &s.id, req).await?;
        let ck = w.checkpoint(e).await?;
        e.close_session(&sb, &s.id).await?;
        for round in 0..ROUNDS {
            w.rollback(e, &ck).await?;
            let deadline = Instant::now() + Duration::from_secs(3);
            let gone = loop {
                let running = e.processes(&sb).await?.processes.iter().any(|p| p.pid == w.pid && p.running);
                if !running || Instant::now() > deadline {
                    break !running;
                }
                sleep_ms(50).await;
            };
            ensure!(gone, "round {round}: the restored shell did not end on its hung-up terminal");
        }
        w.delete(e).await
    })
}

/// A guard region installed between two checkpoints is in the second's
/// restore, whose template is made from the first's standby (issue 36,
/// class 2).
fn guard_region_between_checkpoints(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("guard_region_between_checkpoints.py")).await?;
        ensure!(w.ask(e, "probe").await? == "faults=none", "probe before");
        w.checkpoint_once(e).await?;
        // (The tracer makes the first one's standby meanwhile.)
        sleep_ms(100).await;
        ensure!(w.ask(e, "guard").await? == "guarded", "guard");
        ensure!(w.ask(e, "probe").await? == "faults=1", "probe after guard");
        let ck = w.checkpoint_once(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            w.rollback(e, &ck).await?;
            c.eq("guard pages after rollback", &w.ask(e, "probe").await?, "faults=1");
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// A mount made by a command that exited (the sandbox's init alone runs)
/// is refused by name too: a rollback would lose it while saying the
/// sandbox came back exactly (issue 36, class 7). So is one under the
/// kept `/dev` or `/proc` (a rollback detaches the sandbox's mounts there;
/// before, the checkpoint did not look there), and one stacked on
/// setup's `/dev/shm`. Unmounted, the checkpoint is taken.
fn mount_with_only_init_running(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        for (dir, make) in [
            ("/root/m", "mkdir -p /root/m && mount -t tmpfs scratch /root/m"),
            ("/dev/m", "mkdir -p /dev/m && mount -t tmpfs scratch /dev/m"),
            ("/dev/shm", "mount -t tmpfs scratch /dev/shm"),
        ] {
            sh(e, &sb, make).await?;
            let refused = e.checkpoint(&sb, CheckpointRequest::default()).await;
            let msg = match refused {
                Ok(r) => bail!("checkpoint with a tmpfs on {dir} accepted: {}", r.note),
                Err(err) => err.to_string(),
            };
            ensure!(msg.contains(&format!("mount {dir}")) && msg.contains("tmpfs"), "refused, but with {msg:?}");
            sh(e, &sb, &format!("umount {dir}")).await?;
        }
        e.checkpoint(&sb, CheckpointRequest::default()).await.context("checkpoint once unmounted")?;
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// The issue's first refusal as a user met it: `sh -c 'nohup python3
/// server.py &'` through exec, the server with a `multiprocessing` pool of
/// workers (`nohup_server_with_workers.py`). Checkpointed, changed, rolled
/// back: the server answers with the checkpoint's counter, its workers
/// compute, it is in sh's group again; so once more after that group was
/// killed whole (issue 38, item 1: refused before).
fn nohup_server_with_workers(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let program = format!("{PRELUDE}\n{}", program!("nohup_server_with_workers.py"));
        let start = "nohup python3 -c \"$PROGRAM\" > /root/server.log 2>&1 &";
        let env = BTreeMap::from([("PROGRAM".to_string(), program)]);
        sh_with(e, &sb, start, None, env).await?;
        let pid =
            sh(e, &sb, "sleep 0.5; pgrep -o -f 'python3 -c'").await?.trim().parse().context("the server's pid")?;
        let w = Workload { sb: sb.clone(), pid };
        let deadline = Instant::now() + Duration::from_secs(15);
        while w.ask_raw(e, "ping").await.ok().as_deref() != Some("pong") {
            ensure!(Instant::now() < deadline, "the server never answered: {}", w.diagnose(e).await);
            sleep_ms(50).await;
        }
        ensure!(w.ask(e, "bump").await? == "n=1", "bump");
        let state = w.ask(e, "state").await?;
        ensure!(state == "n=1 pool=30 ppid=1 group=True", "before the checkpoint: {state}");
        let ck = w.checkpoint(e).await?;
        for mutate in ["bump", "kill the group"] {
            match mutate {
                "bump" => ensure!(w.ask(e, "bump").await? == "n=2", "bump after the checkpoint"),
                _ => {
                    sh(e, &sb, &format!("kill -9 -$(ps -o pgid= -p {pid} | tr -d ' ')")).await?;
                }
            }
            w.rollback(e, &ck).await.with_context(|| format!("rollback after {mutate}"))?;
            let again = w.ask(e, "state").await?;
            ensure!(again == state, "after {mutate} and the rollback: {again}, want {state}");
        }
        w.delete(e).await
    })
}

/// Files left in `/dev/shm` (a tmpfs of its own, which a rollback in place
/// replaces and a fork boots without) come back as they were at the
/// checkpoint: contents, holes, mode, owner, times, hard and symbolic
/// links, FIFOs, and the directory's own mode; files made since are gone.
/// Once with init alone (a layered checkpoint by restack), once beside a
/// running process (moved to the new layer), once beside a process holding
/// a deleted file (which cannot move: a snapshot checkpoint).
fn dev_shm_files_come_back(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let make = "cd /dev/shm && mkdir d && printf kept > d/f && ln d/f hard && ln -s d/f sym && mkfifo -m 640 p \
                    && printf x | dd of=sparse bs=1 seek=1048575 2>/dev/null && chmod 645 d/f && chown 1000:1001 d/f \
                    && touch -d @1000000 d/f d && chmod 1770 /dev/shm";
        let state =
            "cd /dev/shm && stat -c '%n %F %a %u %g %s %h %Y' $(find . | sort) && cat d/f && echo && du -k sparse";
        let besides: [(&str, Option<&str>); 3] = [
            ("init alone", None),
            ("beside a process", Some("echo $$ > /root/bg.pid; exec sleep 1000")),
            (
                "beside a deleted file",
                Some("exec 3>/root/gone; rm /root/gone; echo $$ > /root/bg.pid; exec sleep 1000"),
            ),
        ];
        for (round, (what, beside)) in besides.into_iter().enumerate() {
            let mut c = Checks::default();
            if let Some(cmd) = beside {
                let req = ExecRequest { cmd: argv(&["sh", "-c", cmd]), background: true, ..Default::default() };
                exec(e, &sb, req).await?;
                let deadline = Instant::now() + Duration::from_secs(10);
                while sh(e, &sb, "cat /root/bg.pid 2>/dev/null || true").await?.trim().is_empty() {
                    ensure!(Instant::now() < deadline, "{what}: the process did not start");
                    sleep_ms(20).await;
                }
            }
            sh(e, &sb, make).await.with_context(|| what.to_string())?;
            let before = sh(e, &sb, state).await?;
            let ck = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
            sh(e, &sb, "cd /dev/shm && rm -r d sparse && echo new > new && chmod 1777 /dev/shm").await?;
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            c.that(!r.processes_restarted, || format!("{what}: processes restarted: {}", r.note));
            c.eq(&format!("{what}: /dev/shm after the rollback"), &sh(e, &sb, state).await?, &before);
            let forked = e
                .fork(&ck, ForkRequest { count: 1, labels: Default::default(), limits: None, files_only: true })
                .await?;
            let fork = forked.results[0].sandbox.as_ref().context("the fork failed")?.id.clone();
            c.eq(&format!("{what}: /dev/shm in a fork"), &sh(e, &fork, state).await?, &before);
            e.delete_sandbox(&fork, true).await?;
            sh(e, &sb, "kill $(cat /root/bg.pid 2>/dev/null) 2>/dev/null; rm -f /root/bg.pid; rm -rf /dev/shm/* && chmod 1777 /dev/shm")
                .await?;
            c.result(round)?;
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// The SysV IPC objects of the sandbox's namespace (a semaphore set, a
/// private one owned by another user, a message queue with a binary
/// message, a 1 MiB segment; `sysv_ipc.c`) come back with a rollback, as
/// at the checkpoint (ids, keys, owners, creators, modes, values,
/// messages, contents, next ids), and in a fork: made again when removed
/// since (made by a process that exited: init alone at the checkpoint),
/// set again in place when a process holds the segment attached; objects
/// made since are gone, and the next program finds what it expects
/// (issue 38, item 3).
fn sysv_ipc_objects_come_back(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let rounds: [(&str, bool, &str); 2] =
            [("init alone, objects removed since", false, "rm"), ("beside a process holding the segment", true, "")];
        for (round, (what, hold, rm)) in rounds.into_iter().enumerate() {
            let mut c = Checks::default();
            let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
            let build = "cat > /root/ipc.c && gcc -O2 -o /root/ipc /root/ipc.c && /root/ipc make";
            sh_with(e, &sb, build, Some(program!("sysv_ipc.c")), BTreeMap::new()).await?;
            if hold {
                let req = ExecRequest {
                    cmd: argv(&["sh", "-c", "/root/ipc hold > /root/held"]),
                    background: true,
                    ..Default::default()
                };
                exec(e, &sb, req).await?;
                let deadline = Instant::now() + Duration::from_secs(10);
                while sh(e, &sb, "cat /root/held 2>/dev/null; true").await?.trim().is_empty() {
                    ensure!(Instant::now() < deadline, "{what}: the holder did not start");
                    sleep_ms(20).await;
                }
            }
            let before = sh(e, &sb, "/root/ipc state").await?;
            ensure!(before.contains("values=1,2,3,") && before.contains("key=0x5a03"), "{what}: {before}");
            let ck = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
            sh(e, &sb, &format!("/root/ipc mutate {rm}")).await?;
            let mutated = sh(e, &sb, "/root/ipc state").await?;
            c.that(mutated != before, || format!("{what}: the mutation changed nothing"));
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            c.that(!r.processes_restarted, || format!("{what}: processes restarted: {}", r.note));
            c.eq(&format!("{what}: the objects after the rollback"), &sh(e, &sb, "/root/ipc state").await?, &before);
            c.eq(
                &format!("{what}: the next program"),
                &sh(e, &sb, "/root/ipc use 2>&1 || true").await?,
                "used: alpha omega 0\n",
            );
            let forked = e
                .fork(&ck, ForkRequest { count: 1, labels: Default::default(), limits: None, files_only: true })
                .await?;
            let fork = forked.results[0].sandbox.as_ref().context("the fork failed")?.id.clone();
            c.eq(&format!("{what}: the objects in a fork"), &sh(e, &fork, "/root/ipc state").await?, &before);
            e.delete_sandbox(&fork, true).await?;
            e.delete_sandbox(&sb, true).await?;
            c.result(round)?;
        }
        // Back and forth: a rollback to a checkpoint of before the objects
        // removes them (the segment stays, marked for removal, held by the
        // later checkpoint's templates); a rollback to that later one then
        // brings its process back with its segment attached (its key is
        // private from then on: not kept) and the other objects as they
        // were (before, it failed and restarted the sandbox).
        let mut c = Checks::default();
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        sh_with(
            e,
            &sb,
            "cat > /root/ipc.c && gcc -O2 -o /root/ipc /root/ipc.c",
            Some(program!("sysv_ipc.c")),
            BTreeMap::new(),
        )
        .await?;
        let before_objects = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
        sh(e, &sb, "/root/ipc make").await?;
        let req = ExecRequest {
            cmd: argv(&["sh", "-c", "/root/ipc hold > /root/held"]),
            background: true,
            ..Default::default()
        };
        exec(e, &sb, req).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while sh(e, &sb, "cat /root/held 2>/dev/null; true").await?.trim().is_empty() {
            ensure!(Instant::now() < deadline, "back and forth: the holder did not start");
            sleep_ms(20).await;
        }
        let with = sh(e, &sb, "/root/ipc state").await?;
        let with_objects = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
        let r = e.rollback(&sb, RollbackRequest { checkpoint: before_objects, allow_restart: false }).await?;
        c.that(!r.processes_restarted, || format!("back: processes restarted: {}", r.note));
        let none = sh(e, &sb, "/root/ipc state").await?;
        c.that(!none.contains("sem ") && !none.contains("msg ") && !none.contains("key=0x5a03"), || {
            format!("back: objects left: {none}")
        });
        let r = e.rollback(&sb, RollbackRequest { checkpoint: with_objects, allow_restart: false }).await?;
        c.that(!r.processes_restarted, || format!("forth: processes restarted: {}", r.note));
        let again = sh(e, &sb, "/root/ipc state").await?;
        let not_shm = |s: &str| s.lines().filter(|l| !l.starts_with("shm ")).collect::<Vec<_>>().join("\n");
        c.eq("forth: the semaphore sets and queues", &not_shm(&again), &not_shm(&with));
        c.that(again.contains(" size=1048676 contents=432f389793a7596a"), || format!("forth: the segment: {again}"));
        e.delete_sandbox(&sb, true).await?;
        c.result(2)?;
        Ok(())
    })
}

/// `exec`'s `user` (and a session's): a command runs as a user of the sandbox (by name from
/// its `/etc/passwd`, or by uid), with its groups, HOME, USER and LOGNAME,
/// in its home (`/` when that does not exist); an unknown name exits 126
/// saying so, as a command that cannot start. A background process started so is checkpointed and comes back
/// on its pid, as that user, with its memory (issue 38, any user); so does
/// a job of the user's session shell, as that shell's child and job
/// (process trees of any user).
fn exec_as_a_user(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        sh(e, &sb, "useradd -m -G users agent").await?;
        let as_user = |user: &str, script: &str| ExecRequest {
            cmd: argv(&["sh", "-c", script]),
            user: Some(user.to_string()),
            ..Default::default()
        };
        let who = "id -un; id -Gn; echo $HOME $USER $LOGNAME; pwd; touch mine; stat -c %U mine";
        let out = exec(e, &sb, as_user("agent", who)).await?;
        ensure!(
            out.stdout == "agent\nagent users\n/home/agent agent agent\n/home/agent\nagent\n",
            "as agent: {:?} {:?}",
            out.stdout,
            out.stderr
        );
        let out = exec(e, &sb, as_user("nobody", "id -u; pwd")).await?;
        ensure!(out.stdout == "65534\n/\n", "as nobody: {:?} {:?}", out.stdout, out.stderr);
        let out = exec(e, &sb, as_user("4242", "id -u; id -g")).await?;
        ensure!(out.stdout == "4242\n4242\n", "as uid 4242: {:?} {:?}", out.stdout, out.stderr);
        // (As a command that cannot start: exit 126, the reason on stderr.)
        let unknown = exec(e, &sb, as_user("ghost", "true")).await?;
        ensure!(
            unknown.exit_code == Some(126) && unknown.stderr.contains("no user \"ghost\""),
            "unknown user: {unknown:?}"
        );
        // A session's shell, as the user.
        let req = sandtree_api::CreateSessionRequest { user: Some("agent".into()), ..Default::default() };
        let session = e.create_session(&sb, req).await?;
        let (sid, shell) = (session.id, session.pid);
        let run = SessionRunRequest { command: "echo \"$(id -un) $(pwd) $HOME\"".into(), timeout_ms: Some(10_000) };
        let out = e.session_run(&sb, &sid, run).await?;
        ensure!(out.output.contains("agent /home/agent /home/agent"), "session as agent: {:?}", out.output);
        // A job of the user's shell (issue 38: process trees of any user).
        let start = "python3 -c 'import time\nwhile True: time.sleep(0.05)' & echo job=$!";
        let out =
            e.session_run(&sb, &sid, SessionRunRequest { command: start.into(), timeout_ms: Some(10_000) }).await?;
        let job: i32 = out.output.split("job=").nth(1).context("no job pid")?.trim().parse()?;
        // In the background, checkpointed, changed, rolled back.
        let counter = "exec python3 -c 'import time\nwhile True: time.sleep(0.05)'";
        let bg = exec(e, &sb, ExecRequest { background: true, ..as_user("agent", counter) }).await?;
        sleep_ms(200).await;
        let ck = e.checkpoint(&sb, CheckpointRequest::default()).await?;
        ensure!(ck.checkpoint.processes.contains(&bg.pid), "not captured: {}", ck.note);
        sleep_ms(300).await;
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.checkpoint.id, allow_restart: false }).await?;
        ensure!(r.restored_pids.contains(&bg.pid) && r.restored_pids.contains(&job), "not restored: {}", r.note);
        let owner = sh(e, &sb, &format!("stat -c %U /proc/{}", bg.pid)).await?;
        ensure!(owner.trim() == "agent", "restored as {owner:?}");
        let of_job = sh(e, &sb, &format!("stat -c %U /proc/{job}; awk '{{print $4}}' /proc/{job}/stat")).await?;
        ensure!(
            of_job == format!("agent\n{shell}\n"),
            "the job restored as {of_job:?}, want agent's, the shell's child"
        );
        let jobs = SessionRunRequest { command: "jobs".into(), timeout_ms: Some(10_000) };
        let out = e.session_run(&sb, &sid, jobs).await?;
        ensure!(out.output.contains("Running") && out.output.contains("python3"), "jobs: {:?}", out.output);
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A process that inherited the daemon's output pipe of a background
/// process (a server its shell started; the shell gone) keeps a reader
/// there across a rollback: restored, it goes on writing (before the
/// daemon held read ends of every background process's pipes across the
/// kill, the pipe had none after it, and the restored writer died of
/// SIGPIPE).
fn orphan_writes_to_the_daemons_pipe(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let script = program!("orphan_writes_to_the_daemons_pipe.sh");
        exec(e, &sb, ExecRequest { cmd: argv(&["sh", "-c", script]), background: true, ..Default::default() }).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while sh(e, &sb, "cat /root/orphan.pid 2>/dev/null || true").await?.is_empty() {
            ensure!(Instant::now() < deadline, "the loop did not start");
            sleep_ms(50).await;
        }
        let pid: i32 = sh(e, &sb, "cat /root/orphan.pid").await?.trim().parse()?;
        sleep_ms(200).await;
        let ck = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
        let w = Workload { sb: sb.clone(), pid };
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            sleep_ms(100).await;
            w.rollback(e, &ck).await?;
            sleep_ms(400).await;
            let alive = sh(
                e,
                &sb,
                &format!(
                    "kill -0 {pid} 2>/dev/null && echo alive || echo gone; cat /root/orphan.err 2>/dev/null || true"
                ),
            )
            .await?;
            c.eq("the loop after the rollback", alive.trim(), "alive");
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// Types `line` into a session and returns what follows `want` in its
/// output, up to the end of that line.
async fn type_line(e: &Engine, sb: &str, sid: &str, line: &str, want: &str) -> Result<String> {
    use tokio::sync::broadcast::error::RecvError;
    let mut io = e.session_io(sb, sid).await?;
    io.write(format!("{line}\r").as_bytes()).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut buf = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, io.output.recv()).await {
            Ok(Ok(chunk)) => buf.extend_from_slice(&chunk),
            Ok(Err(RecvError::Lagged(_))) => continue,
            Ok(Err(RecvError::Closed)) => bail!("session closed; output {:?}", String::from_utf8_lossy(&buf)),
            Err(_) => bail!("`{line}`: no {want:?} within 10 s; output {:?}", String::from_utf8_lossy(&buf)),
        }
        let text = String::from_utf8_lossy(&buf);
        if let Some(i) = text.find(want) {
            let rest = &text[i + want.len()..];
            // A prompt (`>>> `): nothing follows it.
            if want.ends_with(' ') {
                return Ok(String::new());
            }
            if let Some(end) = rest.find(['\r', '\n']) {
                return Ok(rest[..end].to_string());
            }
        }
    }
}

/// A Python REPL in a session (its bash exec'd into it) comes back with its
/// variables and cwd.
fn session_python_repl(e: &Engine) -> CaseFuture<'_> {
    // The shell becomes the REPL: same pid, session leader on the pty.
    python_repl(e, "exec python3 -q -i")
}

/// `python3 -i` run from a session's bash, as its foreground job (a child
/// of bash, in a process group of its own, which the pty's foreground
/// group is): after a rollback it reads the terminal again (its group is
/// the foreground one again: else a read stops it with `SIGTTIN`), and
/// its state is the checkpoint's (issue 38, process trees).
fn repl_run_from_the_session_shell(e: &Engine) -> CaseFuture<'_> {
    python_repl(e, "python3 -q -i")
}

/// A Python REPL in a session, started by `launch` typed into its bash
/// (see [`session_python_repl`]).
fn python_repl<'a>(e: &'a Engine, launch: &'static str) -> CaseFuture<'a> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let s = e.create_session(&sb, Default::default()).await?;
        let w = Workload { sb, pid: s.pid };
        let (sb, sid) = (w.sb.as_str(), s.id.as_str());
        type_line(e, sb, sid, launch, ">>> ").await?;
        for line in typed_lines(program!("session_python_repl.py")) {
            type_line(e, sb, sid, line, ">>> ").await?;
        }
        // The echo of this line has no `X=`; its output does.
        let query = "print('X' + '=' + repr(x), os.getcwd())";
        let at_ck = type_line(e, sb, sid, query, "X=").await?;
        ensure!(at_ck == "[41, 42] /tmp", "{at_ck}");
        type_line(e, sb, sid, "", ">>> ").await?;
        let ck = w.checkpoint(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            type_line(e, sb, sid, "x = None; os.chdir('/')", ">>> ").await?;
            c.eq("mutated", &type_line(e, sb, sid, query, "X=").await?, "None /");
            type_line(e, sb, sid, "", ">>> ").await?;
            w.rollback(e, &ck).await?;
            c.eq("REPL state after rollback", &type_line(e, sb, sid, query, "X=").await?, &at_ck);
            type_line(e, sb, sid, "", ">>> ").await?;
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// git in a repository, driven from a session: history and the shell's
/// cwd come back together.
fn git_repo_in_session(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let s = e.create_session(&sb, Default::default()).await?;
        let w = Workload { sb: sb.clone(), pid: s.pid };
        let run = |cmd: &str| {
            let (cmd, sb, sid) = (cmd.to_string(), sb.clone(), s.id.clone());
            async move {
                let out = e
                    .session_run(&sb, &sid, SessionRunRequest { command: cmd.clone(), timeout_ms: Some(10_000) })
                    .await?;
                ensure!(out.exit_code == Some(0), "`{cmd}`: {}", out.output);
                Ok::<_, anyhow::Error>(out.output.trim().to_string())
            }
        };
        for line in typed_lines(program!("git_repo_in_session.sh")) {
            run(line).await?;
        }
        let git = "git -c user.name=t -c user.email=t@localhost";
        let ck = w.checkpoint(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            run(&format!("echo b >> f && {git} commit -qam two && cd /")).await?;
            w.rollback(e, &ck).await?;
            c.eq("history after rollback", &run("git log --format=%s | tr '\\n' ' '").await?, "one");
            c.eq(
                "cwd and worktree",
                &run("echo $PWD $(cat f) $(git status --porcelain | wc -l)").await?,
                "/root/r a 0",
            );
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// bash with three background jobs (`sleep`, children of bash, each in a
/// process group of its own): one running, one stopped, one `nohup`'d:
/// captured as they are, and back after each rollback as bash's children
/// and jobs (issue 38, process trees, job control): bash's `jobs` lists
/// them, running and stopped, bash reports nothing new, `fg` brings the
/// stopped one to the terminal and waits for it, and bash waits for the
/// running one.
fn bash_job_comes_back(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let s = e.create_session(&sb, Default::default()).await?;
        let run = |cmd: &str| SessionRunRequest { command: cmd.into(), timeout_ms: Some(10_000) };
        for line in typed_lines(program!("bash_job_comes_back.sh")) {
            e.session_run(&sb, &s.id, run(line)).await?;
        }
        let job: i32 = sh(e, &sb, "cat /root/job").await?.trim().parse()?;
        sleep_ms(50).await;
        let r = e.checkpoint(&sb, CheckpointRequest::default()).await?;
        ensure!(r.checkpoint.process_state == ProcessState::Captured, "{r:?}");
        ensure!(r.checkpoint.reparented.is_empty(), "{r:?}");
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            e.session_run(&sb, &s.id, run("kill %1; kill -9 %2; kill %3; wait; X=changed")).await?;
            let rb =
                e.rollback(&sb, RollbackRequest { checkpoint: r.checkpoint.id.clone(), allow_restart: false }).await?;
            c.that(rb.restored_pids.contains(&s.pid) && rb.restored_pids.contains(&job), || format!("{rb:?}"));
            // (Nothing new to report: the stopped job's stop was reported.)
            let out = e.session_run(&sb, &s.id, run("echo $X")).await?;
            c.eq("shell variable", out.output.trim(), "kept");
            c.eq(
                "job runs, bash's child, in a group of its own",
                sh(e, &sb, &format!("cat /proc/{job}/comm; awk '{{print $4, $5}}' /proc/{job}/stat")).await?.trim(),
                &format!("sleep\n{} {job}", s.pid),
            );
            let jobs = e.session_run(&sb, &s.id, run("jobs")).await?;
            let stopped = jobs.output.lines().any(|l| l.contains("Stopped") && l.trim_end().ends_with("sleep 1"));
            let listed = stopped && ["sleep 1000", "nohup sleep 3000"].iter().all(|w| jobs.output.contains(w));
            c.that(listed, || jobs.output.clone());
            // The stopped job, in the foreground: continued, on the
            // terminal, and waited for.
            let fg = e.session_run(&sb, &s.id, run("fg %2 > /dev/null; echo fg=$?")).await?;
            c.that(fg.output.trim().ends_with("fg=0"), || format!("fg: {}", fg.output));
            let out = e.session_run(&sb, &s.id, run("kill %3; kill %1; wait %1; echo status=$?")).await?;
            let out = out.output.trim();
            c.that(out.contains("Terminated") && out.ends_with("status=143"), || format!("bash's wait: {out}"));
            c.result(round)?;
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// Servers a session's bash leaves outside its jobs
/// (`shell_servers_outside_their_jobs.sh`): `(server &)` (a child of init
/// in a gone subshell's group, in bash's session: made again by the
/// restored bash) and a pipeline whose first command ended (its second in
/// the group of the gone one: made again by bash after a surrogate). After
/// each rollback the server serves the rolled-back file from its group and
/// session, the pipeline is bash's running job in its group, and the shell
/// keeps its variable (issue 38, item 1: both refused before).
fn shell_servers_outside_their_jobs(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let s = e.create_session(&sb, Default::default()).await?;
        let run = |cmd: &str| SessionRunRequest { command: cmd.into(), timeout_ms: Some(10_000) };
        for line in typed_lines(program!("shell_servers_outside_their_jobs.sh")) {
            e.session_run(&sb, &s.id, run(line)).await?;
        }
        let server: i32 = sh(e, &sb, "cat /root/server").await?.trim().parse()?;
        let job: i32 = sh(e, &sb, "cat /root/job").await?.trim().parse()?;
        // ppid pgrp session, and whether the group is the process's own.
        let place = |p: i32| format!("awk '{{print $4, $5 == {p}, $6}}' /proc/{p}/stat");
        let get = "exec 3<>/dev/tcp/127.0.0.1/7000 && printf 'GET /v.txt HTTP/1.0\\r\\n\\r\\n' >&3 && tail -n 1 <&3";
        let state = || async {
            let server_at = sh(e, &sb, &place(server)).await?;
            let job_at = sh(e, &sb, &place(job)).await?;
            let served = exec(e, &sb, ExecRequest { cmd: argv(&["bash", "-c", get]), ..Default::default() }).await?;
            let x = e.session_run(&sb, &s.id, run("echo $X; jobs -r | wc -l")).await?;
            Ok::<_, anyhow::Error>(format!(
                "server={} job={} served={} shell={}",
                server_at.trim(),
                job_at.trim(),
                served.stdout.trim(),
                x.output.trim().replace('\n', ",")
            ))
        };
        let want = format!("server=1 0 {0} job={0} 0 {0} served=one shell=kept,1", s.pid);
        let before = state().await?;
        ensure!(before == want, "before the checkpoint: {before}, want {want}");
        let r = e.checkpoint(&sb, CheckpointRequest::default()).await?;
        ensure!(r.checkpoint.process_state == ProcessState::Captured, "{r:?}");
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            e.session_run(&sb, &s.id, run("echo two > v.txt; kill %1; X=changed")).await?;
            sh(e, &sb, &format!("kill {server}")).await?;
            let rb =
                e.rollback(&sb, RollbackRequest { checkpoint: r.checkpoint.id.clone(), allow_restart: false }).await?;
            c.that([server, job, s.pid].iter().all(|p| rb.restored_pids.contains(p)), || format!("{rb:?}"));
            c.eq("after the rollback", &state().await?, &want);
            c.result(round)?;
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// `python3 -m http.server` serves the rolled-back files right after the
/// rollback, from the same process.
fn http_server_serves_rolled_back_files(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let server = program!("http_server_serves_rolled_back_files.sh");
        let bg = exec(e, &sb, ExecRequest { cmd: argv(&["sh", "-c", server]), background: true, ..Default::default() })
            .await?;
        let get = "exec 3<>/dev/tcp/127.0.0.1/7000 && printf 'GET /v.txt HTTP/1.0\\r\\n\\r\\n' >&3 && tail -n 1 <&3";
        let fetch = || async {
            let out = exec(e, &sb, ExecRequest { cmd: argv(&["bash", "-c", get]), ..Default::default() }).await?;
            Ok::<_, anyhow::Error>(out.stdout.trim().to_string())
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while fetch().await.unwrap_or_default() != "version-one" {
            ensure!(Instant::now() < deadline, "http.server does not answer");
            sleep_ms(50).await;
        }
        let w = Workload { sb: sb.clone(), pid: bg.pid };
        // Its request threads are gone before the checkpoint.
        sleep_ms(100).await;
        let ck = w.checkpoint(e).await?;
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            sh(e, &sb, "echo version-two > /root/www/v.txt").await?;
            c.eq("served before rollback", &fetch().await?, "version-two");
            sleep_ms(50).await;
            w.rollback(e, &ck).await?;
            c.eq("served after rollback", &fetch().await?, "version-one");
            sleep_ms(50).await;
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// `make -j4` of a small C project, checkpointed mid-build (make, the
/// shells of its recipes and their `sleep`s: a tree four processes deep,
/// every process but the first a child of another), rolled back after the
/// build finished: the build goes on from the checkpoint and ends with a
/// correct binary (issue 38, process trees).
fn make_mid_build(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let build = program!("make_mid_build.sh");
        let bg = exec(e, &sb, ExecRequest { cmd: argv(&["sh", "-c", build]), background: true, ..Default::default() })
            .await?;
        // Mid-build: the four first compiles' `sleep`s run.
        let deadline = Instant::now() + Duration::from_secs(10);
        // (Sleeping ones: templates are stopped, `t`.)
        let sleeps = "ps -eo stat=,comm= | awk '$1 ~ /^S/ && $2 == \"sleep\"' | wc -l";
        while sh(e, &sb, sleeps).await?.trim() != "4" {
            ensure!(Instant::now() < deadline, "make does not start its compiles");
            sleep_ms(20).await;
        }
        let w = Workload { sb: sb.clone(), pid: bg.pid };
        let ck = w.checkpoint(e).await?;
        let finished = || async {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let done = sh(e, &sb, "cat /root/proj/done 2>/dev/null || true").await?;
                if !done.trim().is_empty() {
                    return Ok::<_, anyhow::Error>(done.trim().to_string());
                }
                if Instant::now() >= deadline {
                    let ps = sh(e, &sb, "ps -eo pid,ppid,pgid,stat,wchan:20,args; cat /root/proj/log").await?;
                    anyhow::bail!("make does not finish:\n{ps}");
                }
                sleep_ms(50).await;
            }
        };
        for round in 0..ROUNDS {
            let mut c = Checks::default();
            c.eq("make's exit status, before the rollback", &finished().await?, "0");
            sh(e, &sb, "rm -f /root/proj/done /root/proj/prog").await?;
            w.rollback(e, &ck).await?;
            c.eq("make's compiles back, waiting", sh(e, &sb, sleeps).await?.trim(), "4");
            c.eq("make's exit status, after", &finished().await?, "0");
            c.eq("the binary", sh(e, &sb, "/root/proj/prog").await?.trim(), "sum=10");
            c.result(round)?;
        }
        w.delete(e).await
    })
}

/// A restored process is a child of init like any other: when it dies
/// (here killed through the engine, with no other process exiting to wake
/// init up), the engine reports it as exited.
fn restored_process_exit_is_reported(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let w = Workload::start_python(e, program!("restored_process_exit_is_reported.py")).await?;
        let ck = w.checkpoint(e).await?;
        w.rollback(e, &ck).await?;
        ensure!(w.ask(e, "x").await? == "ok", "restored process does not answer");
        e.kill_process(&w.sb, w.pid, 15).await?;
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let procs = e.processes(&w.sb).await?;
            let p = procs.processes.iter().find(|p| p.pid == w.pid).context("background entry lost")?;
            if !p.running {
                ensure!(p.signal == Some(15), "exit reported as {p:?}");
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "pid {} was killed but is still reported running after 3 s (not reaped by init?)",
                w.pid
            );
            sleep_ms(50).await;
        }
        w.delete(e).await
    })
}

fn main() {
    let cases: Vec<(&str, Case)> = vec![
        ("memory_and_registers", memory_and_registers),
        ("signal_mask_and_handlers", declared!(SIGNAL_MASK_AND_HANDLERS)),
        ("pending_signal", declared!(PENDING_SIGNAL)),
        ("pending_signal_siginfo", declared!(PENDING_SIGNAL_SIGINFO)),
        ("umask_and_cwd", declared!(UMASK_AND_CWD)),
        ("file_offset", declared!(FILE_OFFSET)),
        ("dup_shares_offset", declared!(DUP_SHARES_OFFSET)),
        ("pipe_keeps_buffered_bytes", declared!(PIPE_KEEPS_BUFFERED_BYTES)),
        ("pipe_ends_closed_after_a_checkpoint", declared!(PIPE_ENDS_CLOSED_AFTER_A_CHECKPOINT)),
        ("fifo_on_layer", declared!(FIFO_ON_LAYER)),
        ("memfd_state", declared!(MEMFD_STATE)),
        ("inotify_watches", declared!(INOTIFY_WATCHES)),
        ("inotify_unread_events_are_refused", declared!(INOTIFY_UNREAD_EVENTS_ARE_REFUSED)),
        ("threads_come_back", declared!(THREADS_COME_BACK)),
        ("no_writable_code", declared!(NO_WRITABLE_CODE)),
        ("unix_socketpair_and_listener", declared!(UNIX_SOCKETPAIR_AND_LISTENER)),
        ("eventfd_counter", declared!(EVENTFD_COUNTER)),
        ("eventfd_shared_with_a_child", declared!(EVENTFD_SHARED_WITH_A_CHILD)),
        ("close_on_exec_flipped_between_checkpoints", close_on_exec_flipped_between_checkpoints),
        ("sleep_loop_keeps_ticking", sleep_loop_keeps_ticking),
        ("timerfd_stays_armed", declared!(TIMERFD_STAYS_ARMED)),
        ("epoll_and_signalfd", declared!(EPOLL_AND_SIGNALFD)),
        ("session_shell_state", session_shell_state),
        ("session_python_repl", session_python_repl),
        ("repl_run_from_the_session_shell", repl_run_from_the_session_shell),
        ("session_ends_when_its_shell_exits", session_ends_when_its_shell_exits),
        ("guard_region_between_checkpoints", guard_region_between_checkpoints),
        ("session_closed_since_the_checkpoint", session_closed_since_the_checkpoint),
        ("restored_process_exit_is_reported", restored_process_exit_is_reported),
        ("interval_timer_keeps_firing", declared!(INTERVAL_TIMER_KEEPS_FIRING)),
        ("child_subreaper_survives_rollback", child_subreaper_survives_rollback),
        ("rollback_while_pages_are_written", rollback_while_pages_are_written),
        ("checkpoints_while_standbys_fork", checkpoints_while_standbys_fork),
        ("templates_from_older_standbys", templates_from_older_standbys),
        ("standbys_taken_while_forking", standbys_taken_while_forking),
        ("standby_lost_after_the_reply", standby_lost_after_the_reply),
        ("deleted_open_files", declared!(DELETED_OPEN_FILES)),
        ("deleted_fifo", declared!(DELETED_FIFO)),
        ("hung_up_terminal", declared!(HUNG_UP_TERMINAL)),
        ("inotify_on_a_deleted_file", declared!(INOTIFY_ON_A_DELETED_FILE)),
        ("orphaned_process_group", declared!(ORPHANED_PROCESS_GROUP)),
        ("orphan_in_a_gone_session", declared!(ORPHAN_IN_A_GONE_SESSION)),
        ("orphan_in_a_live_session", declared!(ORPHAN_IN_A_LIVE_SESSION)),
        ("child_in_a_gone_group", declared!(CHILD_IN_A_GONE_GROUP)),
        ("nohup_server_with_workers", nohup_server_with_workers),
        ("shell_servers_outside_their_jobs", shell_servers_outside_their_jobs),
        ("deleted_directory", declared!(DELETED_DIRECTORY)),
        ("port_is_free_after_the_server_exits", port_is_free_after_the_server_exits),
        ("stopped_process_comes_back_stopped", declared!(STOPPED_PROCESS_COMES_BACK_STOPPED)),
        ("zombie_of_another_user_is_refused", declared!(ZOMBIE_OF_ANOTHER_USER_IS_REFUSED)),
        ("zombie_children_come_back", declared!(ZOMBIE_CHILDREN_COME_BACK)),
        ("zombie_in_a_live_leaders_group_is_refused", declared!(ZOMBIE_IN_A_LIVE_LEADERS_GROUP_IS_REFUSED)),
        ("children_come_back", declared!(CHILDREN_COME_BACK)),
        ("stopped_children", declared!(STOPPED_CHILDREN)),
        ("inet_socket_options", declared!(INET_SOCKET_OPTIONS)),
        ("tcp_connections", declared!(TCP_CONNECTIONS)),
        ("node_keep_alive_client", declared!(NODE_KEEP_ALIVE_CLIENT)),
        ("redis_with_a_client", declared!(REDIS_WITH_A_CLIENT)),
        ("dont_fork_mapping", declared!(DONT_FORK_MAPPING)),
        ("file_locks", declared!(FILE_LOCKS)),
        ("file_leases", declared!(FILE_LEASES)),
        ("shared_file_mapping", declared!(SHARED_FILE_MAPPING)),
        ("sqlite_wal", declared!(SQLITE_WAL)),
        ("shared_memory", declared!(SHARED_MEMORY)),
        ("postgresql_with_a_client", declared!(POSTGRESQL_WITH_A_CLIENT)),
        ("postgresql_through_checkpoints", postgresql_through_checkpoints),
        ("ipykernel_with_a_client", declared!(IPYKERNEL_WITH_A_CLIENT)),
        ("posix_timers", declared!(POSIX_TIMERS)),
        ("signal_pending_for_a_thread", declared!(SIGNAL_PENDING_FOR_A_THREAD)),
        ("deleted_working_directory", declared!(DELETED_WORKING_DIRECTORY)),
        ("reuseport_group", declared!(REUSEPORT_GROUP)),
        ("pidfd_of_itself", declared!(PIDFD_OF_ITSELF)),
        ("deleted_file_identity", declared!(DELETED_FILE_IDENTITY)),
        ("mapping_not_copied_by_fork", declared!(MAPPING_NOT_COPIED_BY_FORK)),
        ("mapping_advice", declared!(MAPPING_ADVICE)),
        ("unix_listener_file_removed", declared!(UNIX_LISTENER_FILE_REMOVED)),
        ("mount_in_the_sandbox", declared!(MOUNT_IN_THE_SANDBOX)),
        ("mount_with_only_init_running", mount_with_only_init_running),
        ("dev_shm_files_come_back", dev_shm_files_come_back),
        ("sysv_ipc_objects_come_back", sysv_ipc_objects_come_back),
        ("exec_as_a_user", exec_as_a_user),
        ("orphan_writes_to_the_daemons_pipe", orphan_writes_to_the_daemons_pipe),
        ("unix_shutdown", declared!(UNIX_SHUTDOWN)),
        ("unix_datagram_bound_to_a_path", declared!(UNIX_DATAGRAM_BOUND_TO_A_PATH)),
        ("unix_relative_paths", declared!(UNIX_RELATIVE_PATHS)),
        ("udp_queued_datagrams", declared!(UDP_QUEUED_DATAGRAMS)),
        ("unix_datagrams_from_senders", declared!(UNIX_DATAGRAMS_FROM_SENDERS)),
        ("descriptors_in_flight", declared!(DESCRIPTORS_IN_FLIGHT)),
        ("descriptors_in_flight_between_processes", declared!(DESCRIPTORS_IN_FLIGHT_BETWEEN_PROCESSES)),
        ("descriptors_in_flight_after_a_checkpoint", descriptors_in_flight_after_a_checkpoint),
        ("replies_from_a_gone_child", declared!(REPLIES_FROM_A_GONE_CHILD)),
        ("abstract_unix_connections", declared!(ABSTRACT_UNIX_CONNECTIONS)),
        ("xvfb_with_clients", declared!(XVFB_WITH_CLIENTS)),
        ("pty_master_closed_after_a_checkpoint", declared!(PTY_MASTER_CLOSED_AFTER_A_CHECKPOINT)),
        ("socketpair_peer_closed_after_a_checkpoint", declared!(SOCKETPAIR_PEER_CLOSED_AFTER_A_CHECKPOINT)),
        ("unix_connection_closed_after_a_checkpoint", declared!(UNIX_CONNECTION_CLOSED_AFTER_A_CHECKPOINT)),
        ("unix_connection_not_made_again", declared!(UNIX_CONNECTION_NOT_MADE_AGAIN)),
        ("fifo_on_dev", declared!(FIFO_ON_DEV)),
        ("private_mapping_of_a_written_file", declared!(PRIVATE_MAPPING_OF_A_WRITTEN_FILE)),
        ("non_root_user", declared!(NON_ROOT_USER)),
        ("thread_with_its_own_user", declared!(THREAD_WITH_ITS_OWN_USER)),
        ("pty_output_not_read_yet", declared!(PTY_OUTPUT_NOT_READ_YET)),
        ("epoll_watch_of_a_closed_number", declared!(EPOLL_WATCH_OF_A_CLOSED_NUMBER)),
        ("memfd_exec", declared!(MEMFD_EXEC)),
        ("memfd_mapped", declared!(MEMFD_MAPPED)),
        ("posix_message_queue", declared!(POSIX_MESSAGE_QUEUE)),
        ("sqlite_open_database", declared!(SQLITE_OPEN_DATABASE)),
        ("http_server_serves_rolled_back_files", http_server_serves_rolled_back_files),
        ("make_mid_build", make_mid_build),
        ("bash_job_comes_back", bash_job_comes_back),
        ("git_repo_in_session", git_repo_in_session),
    ];
    // Every process tracked: the second of each case's two checkpoints
    // makes its template from the first's where it can (`incremental.rs`),
    // so each case checks restores from both kinds of template.
    // SANDTREE_TEST_INCREMENTAL=off: forks only.
    let off = std::env::var("SANDTREE_TEST_INCREMENTAL").is_ok_and(|v| v == "off");
    let min = if off { None } else { Some(0) };
    common::run("sandtree-workloads-test", "sandtree-workloads", |cfg| cfg.incremental_min_rss = min, cases);
}
