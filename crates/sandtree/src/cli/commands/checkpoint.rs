//! `checkpoint`, `rollback`, `fork`, `tree`, `rm-checkpoint`.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use hyper::Method;
use sandtree_api::*;

use super::Ctx;
use crate::cli::client::enc;
use crate::cli::output::{checkpoint_tree, ms};

pub async fn checkpoint(
    ctx: &Ctx,
    sandbox: &str,
    label: Option<String>,
    best_effort: bool,
    durable: bool,
) -> Result<i32> {
    let req = CheckpointRequest { label, labels: BTreeMap::new(), best_effort, wait_durable: durable };
    let r: CheckpointResponse =
        ctx.call(Method::POST, &format!("/v1/sandboxes/{}/checkpoints", enc(sandbox)), Some(&req)).await?;
    if !ctx.json {
        let c = &r.checkpoint;
        println!("{}", c.id);
        eprintln!(
            "processes paused {}, total {}; {} process(es) captured",
            ms(c.frozen_ms),
            ms(c.duration_ms),
            c.processes.len()
        );
        eprintln!("note: {}", r.note);
        if let Some(i) = &c.process_image {
            match i.state {
                ImageState::Durable => eprintln!(
                    "process image: durable, {} written ({} of {} pages new) in {}",
                    crate::units::human_bytes(i.bytes.unwrap_or(0)),
                    i.pages_written.unwrap_or(0),
                    i.pages.unwrap_or(0),
                    ms(i.write_ms.unwrap_or(0.0))
                ),
                ImageState::Writing => eprintln!("process image: being written (`--durable` waits for it)"),
                ImageState::Failed => {
                    eprintln!("process image: NOT written: {}", i.error.as_deref().unwrap_or("unknown error"))
                }
            }
        }
    }
    Ok(0)
}

pub async fn inspect(ctx: &Ctx, checkpoint: &str) -> Result<i32> {
    let r: serde_json::Value =
        ctx.call(Method::GET, &format!("/v1/checkpoints/{}/image", enc(checkpoint)), None::<&()>).await?;
    if ctx.json {
        return Ok(0);
    }
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    println!("checkpoint      {}", s(&r["checkpoint"]));
    println!("format version  {}", n(&r["format_version"]));
    println!(
        "file            {} ({} pages stored, {} of other data)",
        crate::units::human_bytes(n(&r["file_bytes"])),
        n(&r["pages_written"]),
        crate::units::human_bytes(n(&r["blob_bytes"]))
    );
    println!("parent image    {}", r["parent"].as_str().unwrap_or("none (every page stored here)"));
    let sources: Vec<String> = r["sources"].as_array().into_iter().flatten().skip(1).map(s).collect();
    if !sources.is_empty() {
        println!("reads pages of  {}", sources.join(", "));
    }
    println!();
    println!(
        "{:>7} {:>7} {:<16} {:>7} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9}",
        "PID", "PPID", "COMM", "THREADS", "FDS", "MAPS", "PAGES", "HERE", "PARENTS", "ZERO"
    );
    for p in r["processes"].as_array().into_iter().flatten() {
        println!(
            "{:>7} {:>7} {:<16} {:>7} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9}",
            n(&p["pid"]),
            n(&p["ppid"]),
            s(&p["comm"]),
            n(&p["threads"]),
            n(&p["descriptors"]),
            n(&p["mappings"]),
            n(&p["pages"]),
            n(&p["pages_here"]),
            n(&p["pages_in_parents"]),
            n(&p["pages_zero"])
        );
    }
    Ok(0)
}

pub async fn rollback(ctx: &Ctx, sandbox: &str, checkpoint: &str, allow_restart: bool) -> Result<i32> {
    let req = RollbackRequest { checkpoint: checkpoint.to_string(), allow_restart };
    let r: RollbackResponse =
        ctx.call(Method::POST, &format!("/v1/sandboxes/{}/rollback", enc(sandbox)), Some(&req)).await?;
    if !ctx.json {
        println!("rolled {} back to {} in {}", r.sandbox.id, r.checkpoint, ms(r.duration_ms));
        match r.processes {
            ProcessOutcome::Restored => println!("processes restored: {:?}", r.restored_pids),
            ProcessOutcome::NoneCaptured => println!("processes: none but init at the checkpoint"),
            ProcessOutcome::NotCopied => println!("processes not copied: only init runs"),
            ProcessOutcome::Restarted => {
                println!("processes NOT restored: files restored, every process but init killed (--allow-restart)")
            }
        }
        for c in &r.connections_reset {
            println!("connection to the outside reset: {c}");
        }
        println!("note: {}", r.note);
    }
    Ok(0)
}

pub async fn fork(
    ctx: &Ctx,
    checkpoint: &str,
    count: u32,
    labels: Vec<(String, String)>,
    files_only: bool,
) -> Result<i32> {
    let req = ForkRequest { count, labels: labels.into_iter().collect(), limits: None, files_only };
    let r: ForkResponse =
        ctx.call(Method::POST, &format!("/v1/checkpoints/{}/fork", enc(checkpoint)), Some(&req)).await?;
    let mut failed = 0;
    if !ctx.json {
        for (i, res) in r.results.iter().enumerate() {
            match (&res.sandbox, &res.error) {
                (Some(s), _) => println!("{}", s.id),
                (None, Some(e)) => {
                    failed += 1;
                    eprintln!("error: fork {}: {}", i + 1, e.for_cli());
                }
                (None, None) => {
                    failed += 1;
                    eprintln!("error: fork {}: no result", i + 1);
                }
            }
        }
        eprintln!(
            "forked {} of {} from {} in {}",
            r.results.len() - failed,
            r.results.len(),
            r.checkpoint,
            ms(r.duration_ms)
        );
        if let Some(c) = r.results.iter().flat_map(|x| &x.connections_reset).next() {
            let n = r.results.first().map_or(0, |x| x.connections_reset.len());
            eprintln!("connections to the outside reset in each fork: {n} (e.g. {c})");
        }
        eprintln!("note: {}", r.note);
    } else {
        failed = r.results.iter().filter(|x| x.sandbox.is_none()).count();
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

pub async fn tree(ctx: &Ctx, sandbox: Option<String>, all: bool) -> Result<i32> {
    let path = match &sandbox {
        Some(s) => format!("/v1/sandboxes/{}/checkpoints", enc(s)),
        None => "/v1/checkpoints".to_string(),
    };
    let l: CheckpointList = ctx.get(Method::GET, &path).await?;
    if ctx.json {
        return Ok(0);
    }
    if l.checkpoints.is_empty() {
        eprintln!("no checkpoints");
        return Ok(0);
    }
    let sbs: SandboxList = ctx.client.call_as(Method::GET, "/v1/sandboxes", None::<&()>).await?;
    let mut based: HashMap<String, Vec<String>> = HashMap::new();
    for s in sbs.sandboxes {
        if let Some(b) = s.base_checkpoint {
            based.entry(b).or_default().push(s.id);
        }
    }
    let tree = checkpoint_tree(&l.checkpoints, &based, all);
    print!("{}", tree.text);
    if tree.folded > 0 {
        eprintln!("({} checkpoints of long linear runs folded: `sandtree tree --all` shows them)", tree.folded);
    }
    Ok(0)
}

pub async fn rm(ctx: &Ctx, checkpoint: &str, force: bool) -> Result<i32> {
    let r: DeleteCheckpointResponse =
        ctx.get(Method::DELETE, &format!("/v1/checkpoints/{}?force={force}", enc(checkpoint))).await?;
    if !ctx.json {
        for d in r.deleted {
            println!("{d}");
        }
    }
    Ok(0)
}
