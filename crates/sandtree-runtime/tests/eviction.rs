//! The template pool's memory budget, against the real kernel: an engine
//! whose pool may hold 56 MiB evicts the least recently used checkpoints'
//! templates once it holds more, and only as many as it takes. (Its own
//! test binary: the budget is the engine's config.)
//!
//! `harness = false`, as `engine.rs`; the last line is `N passed, M failed`.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use sandtree_api::{
    CheckpointRequest, CreateSandboxRequest, ErrorCode, ImageState, ProcessOutcome, ProcessState, RestoreSource,
    RollbackRequest,
};
use sandtree_runtime::Engine;

mod common;
use common::{Case, CaseFuture};
mod in_sandbox;
use in_sandbox::{sh, start_python};

/// The pool's budget in this engine.
const BUDGET: u64 = 56 << 20;

/// Holds 64 MiB; at `/root/go<n>` rewrites the n-th 8 MiB of it, then
/// says `/root/done<n>`.
const WRITER: &str = r#"
import mmap, os, time
buf = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, 64 << 20, 4096):
    buf[off] = 1
open('/root/ready', 'w').close()
step = 0
while True:
    if os.path.exists(f'/root/go{step + 1}'):
        step += 1
        for off in range(step << 23, (step + 1) << 23, 4096):
            buf[off] = step + 1
        open(f'/root/done{step}', 'w').close()
    time.sleep(0.005)
"#;

/// Five checkpoints, each after 8 MiB of the process rewritten. The
/// first forks the process; the next ones are made from the template
/// before, with copies of the pages written (`incremental.rs`). So the
/// pool holds the old copy of regions 2-5 (each owned by the newest
/// checkpoint that has it, ~8.7 MiB with the interpreter's own pages) and
/// the newest template's copies of regions 2-5 (~34 MiB): ~69 MiB, over
/// the budget. Eviction takes the oldest checkpoints first, until the
/// pool is within its budget (the two oldest here), never the newest (the
/// sandbox's base); those checkpoints say so, a rollback to one restores
/// the process from its durable image (without the image it is refused,
/// or restarts the process and says why), one to a kept checkpoint from
/// its templates.
fn oldest_checkpoints_lose_their_templates_first(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        start_python(e, &sb, WRITER).await?;
        sh(e, &sb, "while [ ! -e /root/ready ]; do sleep 0.01; done").await?;
        let mut cks = Vec::new();
        for step in 1..=5 {
            sh(e, &sb, &format!("touch /root/go{step}; while [ ! -e /root/done{step} ]; do sleep 0.01; done")).await?;
            let r = e.checkpoint(&sb, CheckpointRequest::default()).await?;
            ensure!(r.checkpoint.process_state == ProcessState::Captured, "step {step}: {}", r.note);
            cks.push(r.checkpoint.id);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pool = e.template_memory(&sb)?;
            if pool <= BUDGET {
                break;
            }
            ensure!(Instant::now() < deadline, "the pool still holds {pool} bytes, over its budget of {BUDGET}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut states = Vec::new();
        for ck in &cks {
            states.push(e.get_checkpoint(ck).await?.process_state);
        }
        let evicted = states.iter().take_while(|s| **s == ProcessState::Evicted).count();
        ensure!(
            (1..4).contains(&evicted) && states[evicted..].iter().all(|s| *s == ProcessState::Captured),
            "not the oldest first, or not just enough of them: {states:?}"
        );
        for ck in [&cks[4], &cks[evicted]] {
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            ensure!(r.processes == ProcessOutcome::Restored && r.restored_pids.len() == 1, "{ck}: {}", r.note);
        }
        // Without its durable image, an evicted checkpoint's processes
        // cannot come back: refused, and nothing changed (the sandbox still
        // stands on the last one) ...
        // (Its image written in the background by now, or soon.)
        let deadline = Instant::now() + Duration::from_secs(30);
        while e.get_checkpoint(&cks[0]).await?.process_image.is_none_or(|i| i.state == ImageState::Writing) {
            ensure!(Instant::now() < deadline, "the image of {} was not written within 30 s", cks[0]);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let image = sandtree_proc::durable::image_path(&e.process_images_dir(), &cks[0]);
        let saved = std::fs::read(&image)?;
        std::fs::remove_file(&image)?;
        let base = e.get_sandbox(&sb).await?.base_checkpoint;
        let err = e.rollback(&sb, RollbackRequest { checkpoint: cks[0].clone(), allow_restart: false }).await.err();
        let err = err.context("a rollback to an evicted checkpoint without its image answered success")?;
        ensure!(err.code() == ErrorCode::ProcessesLost && err.to_string().contains("evicted"), "{err}");
        ensure!(e.get_sandbox(&sb).await?.base_checkpoint == base, "the refused rollback changed the sandbox");
        // ... unless a restart is allowed, and then said.
        let r = e.rollback(&sb, RollbackRequest { checkpoint: cks[0].clone(), allow_restart: true }).await?;
        ensure!(
            r.processes == ProcessOutcome::Restarted && r.processes_restarted && r.note.contains("evicted"),
            "{}",
            r.note
        );
        // With its image, the process comes back from it.
        std::fs::write(&image, saved)?;
        let r = e.rollback(&sb, RollbackRequest { checkpoint: cks[0].clone(), allow_restart: false }).await?;
        ensure!(
            r.processes == ProcessOutcome::Restored && r.restored_from == Some(RestoreSource::Image),
            "{}: {:?}",
            r.note,
            r.restored_from
        );
        sh(e, &sb, "touch /root/go2; while [ ! -e /root/done2 ]; do sleep 0.01; done").await?;
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

fn main() {
    let cases: Vec<(&str, Case)> =
        vec![("oldest_checkpoints_lose_their_templates_first", oldest_checkpoints_lose_their_templates_first)];
    common::run(
        "sandtree-eviction-test",
        "sandtree-eviction-test",
        |cfg| {
            cfg.template_memory_bytes = BUDGET;
        },
        cases,
    );
}
