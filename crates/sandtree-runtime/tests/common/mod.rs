//! The runner shared by the kernel-level test files (`harness = false`:
//! the zygote must be forked while the process is still single-threaded,
//! which libtest's runner does not allow). Cases run in sequence on one
//! engine with its own data dir and cgroup; an optional first argument
//! filters them by name; the last line is `N passed, M failed`. With
//! `RUST_LOG` set, the engine's log goes to stderr.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use sandtree_runtime::{Config, Engine, Zygote};

pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + 'a>>;
pub type Case = for<'a> fn(&'a Engine) -> CaseFuture<'a>;

/// Runs `cases` on a fresh engine in `/var/tmp/<name>-<pid>` with cgroup
/// `cgroup` (`tune` adjusts the config); exits 1 if any failed. Skips, with
/// a message, when not root.
/// What a refusal of the restore from an image says
/// (`sandtree_proc::durable::templates`).
const IMAGE_REFUSAL: &str = "not restored from a process image yet";

pub fn run(name: &str, cgroup: &str, tune: impl FnOnce(&mut Config), cases: Vec<(&str, Case)>) {
    if !is_root() {
        println!("SKIP: {name} needs root (namespaces, btrfs, cgroups, ptrace)\n0 passed, 0 failed");
        return;
    }
    let dir = std::path::PathBuf::from(format!("/var/tmp/{name}-{}", std::process::id()));
    let mut cfg = Config::with_data_dir(&dir);
    cfg.image_size = 4 << 30;
    cfg.cgroup_name = cgroup.into();
    tune(&mut cfg);
    let zygote = Zygote::start(cfg.host_config()).expect("zygote");
    // The engine's log on stderr with RUST_LOG (e.g. `sandtree_proc=debug`).
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let (mut passed, mut failed) = (0, 0);
    rt.block_on(async {
        let engine = match Engine::open(cfg, zygote).await {
            Ok(e) => e,
            Err(e) => {
                println!("engine open failed: {e}");
                failed += 1;
                return;
            }
        };
        for (name, case) in cases {
            if filter.as_deref().is_some_and(|f| !name.contains(f)) {
                continue;
            }
            let t = Instant::now();
            match case(&engine).await {
                Ok(()) => {
                    passed += 1;
                    println!("test {name} ... ok ({:.0} ms)", t.elapsed().as_secs_f64() * 1e3);
                }
                // (Run with every rollback from the images, a case whose
                // rollback the image path refuses by name, before anything
                // changed, is what exact-or-refused asks of it.)
                Err(e)
                    if std::env::var("SANDTREE_WORKLOADS_FROM_IMAGES").is_ok_and(|v| v == "1")
                        && format!("{e:#}").contains(IMAGE_REFUSAL)
                        && format!("{e:#}").contains("nothing was changed") =>
                {
                    passed += 1;
                    let why = format!("{e:#}");
                    let why = why.split("cannot bring them back: ").nth(1).unwrap_or(&why);
                    println!("test {name} ... ok, refused by the image path: {why}");
                }
                Err(e) => {
                    failed += 1;
                    println!("test {name} ... FAILED: {e:#}");
                }
            }
            // A failed case leaves its sandbox (and its busy program) behind.
            if let Ok(list) = engine.list_sandboxes().await {
                for s in list.sandboxes {
                    let _ = engine.delete_sandbox(&s.id, true).await;
                }
            }
        }
        // Deleted sandboxes' cgroups go in the background: not cut short.
        let left = engine.settle(std::time::Duration::from_secs(10)).await;
        assert_eq!(left, 0, "cgroup removals still running after 10 s");
        // As a daemon's clean exit: the cgroups, the zygote, the mounts go.
        for left in engine.shutdown(false).await.left_behind {
            println!("left behind: {left}");
        }
    });
    rt.shutdown_background();
    unmount_all_under(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}

/// Lazily unmounts every mount under `dir`, deepest first: the btrfs volume
/// and the idmapped lower layers under `run/lower/` (left mounted, they keep
/// the directory and its 4 GiB sparse image from being removed).
fn unmount_all_under(dir: &std::path::Path) {
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = std::process::Command::new("umount").arg("-l").arg(&p).status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}
