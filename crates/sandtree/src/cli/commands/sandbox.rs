//! `create`, `ls`, `info`, `rm`, `start`, `stop`, `gc`.

use anyhow::Result;
use hyper::Method;
use sandtree_api::*;

use super::Ctx;
use crate::cli::CreateArgs;
use crate::cli::client::enc;
use crate::cli::output::{ago, labels, ms, table};
use crate::units::human_bytes;

pub async fn create(ctx: &Ctx, a: CreateArgs) -> Result<i32> {
    let req = CreateSandboxRequest {
        image: a.image,
        labels: a.labels.into_iter().collect(),
        limits: Limits { memory_bytes: a.memory, pids: a.pids, cpu_millicores: a.cpus },
    };
    let r: CreateSandboxResponse = ctx.call(Method::POST, "/v1/sandboxes", Some(&req)).await?;
    if !ctx.json {
        println!("{}", r.sandbox.id);
        eprintln!("created in {} (image {})", ms(r.duration_ms), r.sandbox.image);
    }
    Ok(0)
}

pub async fn ls(ctx: &Ctx) -> Result<i32> {
    let l: SandboxList = ctx.get(Method::GET, "/v1/sandboxes").await?;
    if !ctx.json {
        let rows: Vec<Vec<String>> = l
            .sandboxes
            .iter()
            .map(|s| {
                vec![
                    s.id.clone(),
                    s.image.clone(),
                    status(s.status).to_string(),
                    ago(&s.created_at),
                    s.base_checkpoint.clone().unwrap_or_else(|| "-".into()),
                    labels(&s.labels),
                ]
            })
            .collect();
        print!("{}", table(&["ID", "IMAGE", "STATUS", "CREATED", "BASE", "LABELS"], &rows));
    }
    Ok(0)
}

fn status(s: SandboxStatus) -> &'static str {
    match s {
        SandboxStatus::Running => "running",
        SandboxStatus::Stopped => "stopped",
    }
}

fn limit(v: Option<u64>, f: impl Fn(u64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "none".into())
}

pub async fn info(ctx: &Ctx, sandbox: Option<String>) -> Result<i32> {
    let Some(id) = sandbox else {
        let d: DaemonInfo = ctx.get(Method::GET, "/v1/info").await?;
        if !ctx.json {
            println!("version:     {}", d.version);
            println!("data dir:    {}", d.data_dir);
            println!(
                "volume:      {} ({}), {} used of {}, {} free",
                d.volume.path,
                d.volume.backing,
                human_bytes(d.volume.used_bytes),
                human_bytes(d.volume.total_bytes),
                human_bytes(d.volume.free_bytes)
            );
            println!("cgroup:      {}", d.cgroup);
            let claim = d.uid_claim.as_deref().map(|c| format!("; claimed in {c}")).unwrap_or_default();
            println!(
                "uid range:   {}-{} ({} ids{claim})",
                d.uid_base,
                d.uid_base as u64 + d.uid_count as u64 - 1,
                d.uid_count
            );
            println!("sandboxes:   {} ({} running)", d.sandboxes, d.running);
            println!("checkpoints: {}", d.checkpoints);
            println!("images:      {}", d.images);
            println!("metadata:    {}", human_bytes(d.metadata_bytes));
            println!("spares:      {} prepared rollback targets", d.spare_layers);
            println!(
                "processes:   {} checkpoints restorable in place, templates hold {:.1} MB",
                d.process_checkpoints,
                d.template_bytes as f64 / 1e6
            );
        }
        return Ok(0);
    };
    let s: SandboxInfo = ctx.get(Method::GET, &format!("/v1/sandboxes/{}", enc(&id))).await?;
    if !ctx.json {
        println!("id:          {}", s.id);
        println!("image:       {}", s.image);
        println!("status:      {}", status(s.status));
        if let Some(r) = &s.status_reason {
            println!("reason:      {r}");
        }
        println!("created:     {} ({})", s.created_at, ago(&s.created_at));
        println!("base:        {}", s.base_checkpoint.as_deref().unwrap_or("-"));
        println!("labels:      {}", labels(&s.labels));
        println!(
            "limits:      memory {}, pids {}, cpus {}",
            limit(s.limits.memory_bytes, human_bytes),
            limit(s.limits.pids, |p| p.to_string()),
            limit(s.limits.cpu_millicores, |m| format!("{:.2}", m as f64 / 1000.0))
        );
        if let Some(p) = s.init_pid {
            println!("init pid:    {p} (host)");
        }
        if let Some(u) = &s.usage {
            println!(
                "memory:      {}{}",
                human_bytes(u.memory_bytes),
                u.memory_limit_bytes.map(|l| format!(" / {}", human_bytes(l))).unwrap_or_default()
            );
            println!("pids:        {}{}", u.pids, u.pids_limit.map(|l| format!(" / {l}")).unwrap_or_default());
            println!("cpu:         {:.3} s", u.cpu_usec as f64 / 1e6);
            println!("disk:        {} written since base", human_bytes(u.disk_bytes));
        }
    }
    Ok(0)
}

pub async fn rm(ctx: &Ctx, ids: Vec<String>, checkpoints: bool, force: bool) -> Result<i32> {
    let mut failed = false;
    for id in ids {
        let r = if id.starts_with("ck-") {
            super::checkpoint::rm(ctx, &id, force).await
        } else {
            let path = format!("/v1/sandboxes/{}?checkpoints={checkpoints}", enc(&id));
            match ctx.get::<DeleteSandboxResponse>(Method::DELETE, &path).await {
                Ok(r) => {
                    if !ctx.json {
                        println!("{}", r.id);
                        if !r.checkpoints_deleted.is_empty() {
                            eprintln!("  deleted checkpoints: {}", r.checkpoints_deleted.join(", "));
                        }
                    }
                    Ok(0)
                }
                Err(e) => Err(e),
            }
        };
        if let Err(e) = r {
            eprintln!("error: {id}: {e}");
            failed = true;
        }
    }
    Ok(if failed { 1 } else { 0 })
}

pub async fn start_stop(ctx: &Ctx, id: &str, verb: &str) -> Result<i32> {
    let s: SandboxInfo = ctx.get(Method::POST, &format!("/v1/sandboxes/{}/{verb}", enc(id))).await?;
    if !ctx.json {
        println!("{} {}", s.id, status(s.status));
    }
    Ok(0)
}

pub async fn gc(ctx: &Ctx) -> Result<i32> {
    let r: GcReport = ctx.get(Method::POST, "/v1/gc").await?;
    if !ctx.json {
        println!(
            "removed {} orphaned subvolume(s), {} stale runtime entr(ies) in {}",
            r.orphans_removed.len(),
            r.stale_runtime_removed.len(),
            ms(r.duration_ms)
        );
        for o in r.orphans_removed.iter().chain(&r.stale_runtime_removed) {
            println!("  {o}");
        }
    }
    Ok(0)
}
