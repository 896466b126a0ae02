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
        network: NetworkSpec {
            mode: a.network.map(|m| if m == "none" { NetworkMode::None } else { NetworkMode::Egress }),
            allow: a.allow,
            deny: a.deny,
        },
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
        print_network(&s.network);
    }
    Ok(0)
}

/// `network SB [--allow R]... [--deny R]... [--clear]`.
pub async fn network(ctx: &Ctx, id: &str, allow: Vec<String>, deny: Vec<String>, clear: bool) -> Result<i32> {
    let path = format!("/v1/sandboxes/{}/network", enc(id));
    let n: NetworkInfo = if clear || !allow.is_empty() || !deny.is_empty() {
        ctx.call(Method::PUT, &path, Some(&NetworkPolicy { allow, deny })).await?
    } else {
        ctx.get(Method::GET, &path).await?
    };
    if !ctx.json {
        print_network(&n);
    }
    Ok(0)
}

/// `port SB [PORT] [--close | --listen ADDR]`.
pub async fn port(
    ctx: &Ctx,
    id: &str,
    port: Option<u16>,
    close: bool,
    listen: Option<std::net::SocketAddr>,
) -> Result<i32> {
    let base = format!("/v1/sandboxes/{}/ports", enc(id));
    let Some(port) = port else {
        let l: PortList = ctx.get(Method::GET, &base).await?;
        if !ctx.json {
            let rows: Vec<Vec<String>> = l
                .ports
                .iter()
                .map(|p| vec![p.port.to_string(), p.address.clone(), p.connections.to_string()])
                .collect();
            table(&["PORT", "ADDRESS", "CONNECTIONS"], &rows);
        }
        return Ok(0);
    };
    if close {
        let _: serde_json::Value = ctx.get(Method::DELETE, &format!("{base}/{port}")).await?;
        return Ok(0);
    }
    if let Some(addr) = listen {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!("port {port} of {id} on {} (through the API; ^C ends)", listener.local_addr()?);
        let path = format!("{base}/{port}/connect");
        loop {
            let (mut local, _) = listener.accept().await?;
            let client = ctx.client.clone();
            let path = path.clone();
            tokio::spawn(async move {
                match client.upgrade_tcp(&path).await {
                    Ok(mut remote) => {
                        let _ = tokio::io::copy_bidirectional(&mut local, &mut remote).await;
                    }
                    Err(e) => eprintln!("a connection to port {port} failed: {e}"),
                }
            });
        }
    }
    let p: PortInfo = ctx.call(Method::POST, &base, Some(&ExposePortRequest { port })).await?;
    if !ctx.json {
        println!("{}", p.address);
    }
    Ok(0)
}

fn print_network(n: &NetworkInfo) {
    match n.mode {
        NetworkMode::None => println!("network:     none (loopback only)"),
        NetworkMode::Egress => {
            match (&n.address, &n.outward_address) {
                (Some(a), Some(o)) => println!(
                    "network:     egress, {a} (gateway and DNS {}), out as {o}; {} in, {} out",
                    n.gateway.as_deref().unwrap_or("-"),
                    human_bytes(n.rx_bytes),
                    human_bytes(n.tx_bytes)
                ),
                _ => println!("network:     egress (not running)"),
            }
            let list = |l: &[String]| if l.is_empty() { "-".to_string() } else { l.join(", ") };
            println!("allow:       {}", list(&n.allow));
            println!("deny:        {}", list(&n.deny));
        }
    }
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
                        eprint!("{}", deleted_checkpoints_text(&r, checkpoints));
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

/// What `rm SB` did with the sandbox's checkpoints, and what to do next.
pub fn deleted_checkpoints_text(r: &DeleteSandboxResponse, asked: bool) -> String {
    let mut out = String::new();
    if !r.checkpoints_deleted.is_empty() {
        out.push_str(&format!(
            "deleted {} checkpoint(s) of {} with it ({}): {}\n",
            r.checkpoints_deleted.len(),
            r.id,
            human_bytes(r.checkpoints_deleted_bytes),
            r.checkpoints_deleted.join(", ")
        ));
    }
    if r.checkpoints_kept.is_empty() {
        return out;
    }
    let pending = if r.checkpoints_kept.iter().any(|k| k.size_bytes.is_none()) { ", some still measured" } else { "" };
    let ids: Vec<&str> = r.checkpoints_kept.iter().map(|k| k.id.as_str()).collect();
    if asked {
        out.push_str(&format!(
            "kept {} checkpoint(s) of {} ({}{pending}) that others still need:\n",
            ids.len(),
            r.id,
            human_bytes(r.checkpoints_kept_bytes)
        ));
        for k in &r.checkpoints_kept {
            out.push_str(&format!("  {}  needed by {}\n", k.id, k.needed_by.join(", ")));
        }
        out.push_str("delete what needs them first, or delete them anyway with `sandtree rm --force ck-…` (their dependents are re-linked to their parents)\n");
    } else {
        out.push_str(&format!(
            "kept {} checkpoint(s) of {} ({}{pending}): they can still seed forks (`sandtree fork ck-…`)\n\
             to delete them: sandtree rm {}   (or `sandtree rm --checkpoints` with a sandbox)\n",
            ids.len(),
            r.id,
            human_bytes(r.checkpoints_kept_bytes),
            ids.join(" ")
        ));
    }
    out
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
        print!("{}", gc_text(&r));
    }
    Ok(0)
}

/// `sandtree gc`'s report: what was removed and freed, and what was not.
pub fn gc_text(r: &GcReport) -> String {
    let mut out = format!(
        "removed {} orphaned subvolume(s) and {} stale runtime entr(ies), freed {} in {}\n",
        r.orphans_removed.len(),
        r.stale_runtime_removed.len(),
        human_bytes(r.bytes_freed),
        ms(r.duration_ms)
    );
    for o in r.orphans_removed.iter().chain(&r.stale_runtime_removed) {
        out.push_str(&format!("  {o}\n"));
    }
    let kept = &r.checkpoints_of_deleted_sandboxes;
    if !kept.is_empty() {
        out.push_str(&format!(
            "kept {} checkpoint(s) of deleted sandboxes ({}): gc never deletes checkpoints, they can still seed forks; \
             `sandtree tree` shows them, `sandtree rm ck-…` deletes them\n",
            kept.len(),
            human_bytes(r.checkpoints_of_deleted_sandboxes_bytes)
        ));
    }
    out
}
