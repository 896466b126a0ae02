//! Nothing of the host shows inside a sandbox (issue 35, items 3 and 4):
//! not the daemon's command line or environment through init, not the
//! daemon's paths in the mount table, before or after a checkpoint, a
//! rollback, in a fork.
//!
//! `harness = false`, like `engine.rs` (the zygote forks before any thread).

use anyhow::{Context, Result, ensure};
use sandtree_api::{CheckpointRequest, CreateSandboxRequest, ExecRequest, ForkRequest, RollbackRequest};
use sandtree_runtime::Engine;

mod common;
use common::{Case, CaseFuture};
#[allow(dead_code)]
mod in_sandbox;
use in_sandbox::sh;

/// What must not show inside: the data dir (as configured and
/// canonical), the run dir, the image file, the store's mount point and
/// its last word (`btrfs`), and the daemon's executable.
fn host_words(e: &Engine) -> Vec<String> {
    let cfg = e.config();
    let mut words = vec![
        cfg.data_dir.display().to_string(),
        cfg.run_dir().display().to_string(),
        cfg.data_dir.join("btrfs.img").display().to_string(),
        e.volume().root().display().to_string(),
        "btrfs".to_string(),
    ];
    if let Ok(p) = std::fs::canonicalize(&cfg.data_dir) {
        words.push(p.display().to_string());
    }
    if let Ok(exe) = std::env::current_exe() {
        words.push(exe.display().to_string());
    }
    words
}

/// The mount tables and the unix sockets a sandbox sees, and what it can
/// learn of init: none may name `words`.
async fn check_views(e: &Engine, sb: &str, when: &str, words: &[String]) -> Result<()> {
    let script = "cat /proc/self/mountinfo /proc/mounts /proc/1/mountinfo /proc/net/unix; \
                  tr '\\0' ' ' < /proc/1/cmdline; cat /proc/1/environ /proc/1/maps 2>/dev/null; \
                  readlink /proc/1/exe /proc/1/cwd /proc/1/root 2>/dev/null; true";
    let seen = sh(e, sb, script).await?;
    for w in words {
        ensure!(!seen.contains(w.as_str()), "{when}: the sandbox sees {w:?}:\n{seen}");
    }
    // (A neutral source, as container runtimes show.)
    ensure!(seen.contains(" - overlay overlay "), "{when}: no overlay root in the mount table:\n{seen}");
    Ok(())
}

/// Init shows its own name as its command line, no environment, and
/// nothing else of the daemon's process through `/proc/1`.
fn init_shows_only_its_name(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let cmdline = sh(e, &sb, "tr '\\0' '|' < /proc/1/cmdline").await?;
        ensure!(cmdline == "sandtree:[init]|", "init's command line: {cmdline:?}");
        ensure!(sh(e, &sb, "cat /proc/1/comm").await? == "sandtree:[init]\n");
        // Not dumpable: the sandbox's root may not read init's memory,
        // environment, map or descriptors (nor ptrace it).
        for f in ["environ", "maps", "mem", "exe", "fd"] {
            let out = sh(e, &sb, &format!("if cat /proc/1/{f} >/dev/null 2>&1 || ls /proc/1/{f}/ >/dev/null 2>&1 || readlink /proc/1/{f} >/dev/null 2>&1; then echo readable; else echo denied; fi")).await?;
            ensure!(out == "denied\n", "/proc/1/{f} of init is readable inside");
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// The mount tables name no host path: at create, after a checkpoint
/// (only init: the layers are restacked; with a live process: its files
/// are moved to the new stack), after a rollback, in a fork.
fn mount_tables_name_no_host_path(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let words = host_words(e);
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        check_views(e, &sb, "after create", &words).await?;
        sh(e, &sb, "echo one > /root/f").await?;
        let ck1 = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
        check_views(e, &sb, "after a checkpoint", &words).await?;
        let bg = ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), "exec sleep 1000 3>/root/open".into()],
            background: true,
            ..Default::default()
        };
        e.exec(&sb, bg).await?;
        sh(e, &sb, "echo two > /root/f").await?;
        let ck2 = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
        check_views(e, &sb, "after a checkpoint with a process", &words).await?;
        e.rollback(&sb, RollbackRequest { checkpoint: ck1.clone(), allow_restart: false }).await?;
        check_views(e, &sb, "after a rollback", &words).await?;
        ensure!(sh(e, &sb, "cat /root/f").await? == "one\n");
        e.rollback(&sb, RollbackRequest { checkpoint: ck2.clone(), allow_restart: false }).await?;
        check_views(e, &sb, "after a rollback with a process", &words).await?;
        let f =
            e.fork(&ck2, ForkRequest { count: 1, labels: Default::default(), limits: None, files_only: false }).await?;
        let fork = f.results[0].sandbox.as_ref().context("fork failed")?.id.clone();
        check_views(e, &fork, "in a fork", &words).await?;
        ensure!(sh(e, &fork, "cat /root/f").await? == "two\n");
        // The daemon still finds the layers by their names: the root's
        // upper directory is the one the sandbox's record names.
        e.delete_sandbox(&fork, true).await?;
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// What a program started in a sandbox finds in its environment: the
/// defaults and what the request set, nothing of the daemon's (here the
/// test process's), in an exec, a background process and a session.
fn programs_get_nothing_of_the_daemons_environment(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        // What an exec gets: the defaults, and what the request asks.
        const DEFAULTS: [&str; 7] = ["PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "SANDTREE_ASKED"];
        let daemon: Vec<String> =
            std::env::vars().map(|(k, _)| k).filter(|k| !DEFAULTS.contains(&k.as_str()) && k != "TERM").collect();
        ensure!(!daemon.is_empty(), "the test process has no variable of its own to look for");
        let names = |env: &str| -> Vec<String> {
            env.lines().filter_map(|l| l.split_once('=')).map(|(k, _)| k.to_string()).collect()
        };
        let check = |what: &str, env: &str| -> Result<()> {
            for k in names(env) {
                ensure!(!daemon.contains(&k), "{what}: the daemon's {k} is in the environment:\n{env}");
            }
            Ok(())
        };
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let asked = [("SANDTREE_ASKED".to_string(), "1".to_string())];
        let out = e
            .exec(
                &sb,
                ExecRequest { cmd: vec!["env".into()], env: asked.iter().cloned().collect(), ..Default::default() },
            )
            .await?;
        check("exec", &out.stdout)?;
        for k in names(&out.stdout) {
            ensure!(DEFAULTS.contains(&k.as_str()), "exec: {k} in the environment:\n{}", out.stdout);
        }
        ensure!(out.stdout.contains("SANDTREE_ASKED=1"), "the requested variable is missing:\n{}", out.stdout);
        let bg = ExecRequest { cmd: vec!["env".into()], background: true, ..Default::default() };
        let pid = e.exec(&sb, bg).await?.pid;
        let mut log = String::new();
        for _ in 0..100 {
            let p = e.process_output(&sb, pid).await?;
            log = p.stdout;
            if p.process.exit_code.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        ensure!(log.contains("PATH="), "no output of the background env: {log:?}");
        check("background process", &log)?;
        let s = e.create_session(&sb, Default::default()).await?;
        let run = e
            .session_run(&sb, &s.id, sandtree_api::SessionRunRequest { command: "env".into(), timeout_ms: None })
            .await?;
        ensure!(run.output.contains("PATH="), "no output of env in the session: {:?}", run.output);
        check("session", &run.output.replace('\r', ""))?;
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

fn main() {
    let cases: Vec<(&str, Case)> = vec![
        ("init_shows_only_its_name", init_shows_only_its_name),
        ("mount_tables_name_no_host_path", mount_tables_name_no_host_path),
        ("programs_get_nothing_of_the_daemons_environment", programs_get_nothing_of_the_daemons_environment),
    ];
    common::run("sandtree-host-details-test", "sandtree-host-details-test", |_| {}, cases);
}
