//! Durable process images (`sandtree_proc::durable`), against the real
//! kernel: each checkpoint's image holds the process's memory as it was
//! at that checkpoint, page for page, while storing only what changed
//! since its parent's; damage is refused naming the file; the images a
//! later one reads from outlive their checkpoints.
//!
//! `harness = false`, as `engine.rs`; the last line is `N passed, M failed`.

use anyhow::{Context, bail, ensure};
use sandtree_api::{
    CheckpointRequest, CreateSandboxRequest, ExecRequest, ForkRequest, ImageState, ProcessOutcome, RestoreSource,
    RollbackRequest,
};
use sandtree_proc::durable::{Image, PageSource, image_path};
use sandtree_runtime::Engine;

mod common;
use common::{Case, CaseFuture};
mod in_sandbox;
use in_sandbox::{sh, start_python};

/// Pages of the process's buffer, and of each step's rewrite.
const PAGES: u64 = 8192;
const STEP_PAGES: u64 = 1000;

/// Holds 32 MiB (page i starts with the bytes of i, then 1); at
/// `/root/go<n>` rewrites pages n*1000.. n*1000+999 (their byte 8 becomes
/// n + 1), then says `/root/done<n>`. Its buffer's address is in
/// `/root/addr`.
const WRITER: &str = r#"
import mmap, os, time, ctypes
PAGES = 8192
buf = mmap.mmap(-1, PAGES * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(PAGES):
    buf[i * 4096:i * 4096 + 9] = i.to_bytes(8, 'little') + b'\x01'
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
with open('/root/addr', 'w') as f:
    f.write(str(addr))
step = 0
while True:
    if os.path.exists(f'/root/go{step + 1}'):
        step += 1
        for i in range(step * 1000, step * 1000 + 1000):
            buf[i * 4096 + 8] = step + 1
        open(f'/root/done{step}', 'w').close()
    time.sleep(0.005)
"#;

/// What page `i` of the buffer holds after `step` steps.
fn expected(i: u64, step: u64) -> [u8; 9] {
    let mut b = [0u8; 9];
    b[..8].copy_from_slice(&i.to_le_bytes());
    b[8] = (1..=step).rev().find(|s| (s * STEP_PAGES..(s + 1) * STEP_PAGES).contains(&i)).map_or(1, |s| s as u8 + 1);
    b
}

/// Four checkpoints, one before the first rewrite and one after each of
/// three: every image has every page of the buffer as it was at its
/// checkpoint (read through the images it reads from); the first stores
/// them all, each later one little more than the 1,000 pages rewritten.
/// Then: a flipped byte of an image is refused naming it (by
/// `inspect_image` and by a read of its pages), and the first image
/// outlives its deleted checkpoint while later ones read from it, and goes
/// once none does.
fn images_hold_each_checkpoints_pages(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let pid = start_python(e, &sb, WRITER).await? as u32;
        sh(e, &sb, "while [ ! -s /root/addr ]; do sleep 0.01; done").await?;
        let addr: u64 = sh(e, &sb, "cat /root/addr").await?.trim().parse().context("the buffer's address")?;
        let mut cks = Vec::new();
        for step in 0..=3u64 {
            if step > 0 {
                sh(e, &sb, &format!("touch /root/go{step}; while [ ! -e /root/done{step} ]; do sleep 0.01; done"))
                    .await?;
            }
            let req = CheckpointRequest { wait_durable: true, ..Default::default() };
            let r = e.checkpoint(&sb, req).await?;
            let image = r.checkpoint.process_image.context("no process image")?;
            ensure!(image.state == ImageState::Durable, "step {step}: image {:?}: {:?}", image.state, image.error);
            let written = image.pages_written.unwrap_or(u64::MAX);
            if step == 0 {
                ensure!(written >= PAGES, "the first image stored {written} pages, fewer than the buffer's {PAGES}");
            } else {
                ensure!(
                    (STEP_PAGES..STEP_PAGES + 600).contains(&written),
                    "step {step}: {written} pages stored, where {STEP_PAGES} were rewritten"
                );
                ensure!(image.bytes.unwrap_or(u64::MAX) < 8 << 20, "step {step}: {:?} bytes", image.bytes);
            }
            cks.push(r.checkpoint.id);
        }
        let dir = e.process_images_dir();
        for (step, ck) in cks.iter().enumerate() {
            let image = Image::open(&image_path(&dir, ck))?;
            let mut seen = 0u64;
            PageSource::new(&image, &dir).each_page(pid, |at, page| {
                if (addr..addr + PAGES * 4096).contains(&at) {
                    let i = (at - addr) / 4096;
                    let want = expected(i, step as u64);
                    if page[..9] != want {
                        return Err(sandtree_proc::durable::Error::Corrupt {
                            path: image.path().into(),
                            what: format!("step {step}: page {i} starts {:?}, not {want:?}", &page[..9]),
                        });
                    }
                    seen += 1;
                }
                Ok(())
            })?;
            ensure!(seen == PAGES, "step {step}: {seen} of the buffer's {PAGES} pages in the image");
        }
        // A flipped byte in the last image's tree: refused, naming it.
        let last = image_path(&dir, &cks[3]);
        let good = std::fs::read(&last)?;
        let mut bad = good.clone();
        let at = bad.len() - 100;
        bad[at] ^= 0x20;
        std::fs::write(&last, &bad)?;
        match e.inspect_image(&cks[3]).await {
            Ok(_) => bail!("a damaged image was read"),
            Err(err) => ensure!(
                err.to_string().contains("corrupt") && err.to_string().contains(&cks[3]),
                "the error does not say which image is damaged: {err}"
            ),
        }
        std::fs::write(&last, &good)?;
        e.inspect_image(&cks[3]).await?;
        // A flipped byte in a page of the first image: a read of the last
        // one's pages (which reads most of them there) fails on it.
        let first = image_path(&dir, &cks[0]);
        let good_first = std::fs::read(&first)?;
        let mut bad = good_first.clone();
        bad[4096 * 3 + 17] ^= 1;
        std::fs::write(&first, &bad)?;
        let image = Image::open(&last)?;
        let read = PageSource::new(&image, &dir).each_page(pid, |_, _| Ok(()));
        ensure!(read.is_err_and(|e| e.to_string().contains("checksum")), "a damaged page was read");
        std::fs::write(&first, &good_first)?;
        // The first checkpoint deleted: its image stays while others read it.
        e.delete_checkpoint(&cks[0], true).await?;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        ensure!(first.exists(), "the first image went while later ones read from it");
        e.delete_sandbox(&sb, true).await?;
        for ck in cks.iter().rev() {
            e.delete_checkpoint(ck, true).await.ok();
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let left: Vec<_> = std::fs::read_dir(&dir)?.flatten().map(|d| d.file_name()).collect();
        ensure!(left.is_empty(), "images left after every checkpoint was deleted: {left:?}");
        Ok(())
    })
}

/// Keeps a counter and 32 MiB of pages in memory; at `/root/ask<n>`
/// answers `/root/answer<n>` with its counter (then counts one more) and a
/// checksum of its pages, writes a line to its stdout (a pipe the daemon
/// reads) and appends one to `/root/log` (a file it opened at its start),
/// and changes a page.
const KEEPER: &str = r#"
import os, time, zlib, sys
data = bytearray(os.urandom(1 << 20)) * 32
log = open('/root/log', 'a', buffering=1)
count = 0
n = 0
while True:
    n += 1
    while not os.path.exists(f'/root/ask{n}'):
        time.sleep(0.005)
    with open(f'/root/answer{n}.tmp', 'w') as f:
        f.write(f'{count} {zlib.crc32(data)}')
    os.rename(f'/root/answer{n}.tmp', f'/root/answer{n}')
    print('answered', n, flush=True)
    log.write(f'answer {n} count {count}\n')
    data[count * 4096] ^= 1
    count += 1
"#;

/// Ask the keeper (`n`-th question): its answer.
async fn ask(e: &Engine, sb: &str, n: u32) -> anyhow::Result<String> {
    let script =
        format!("touch /root/ask{n}; while [ ! -e /root/answer{n} ]; do sleep 0.01; done; cat /root/answer{n}");
    sh(e, sb, &script).await
}

/// A checkpoint's templates killed from inside the sandbox (`kill -9 -1`
/// reaches them): the rollback restores its process from the durable
/// image instead, says so, and the process has its memory (its counter,
/// its pages' checksum) as at the checkpoint, runs on and writes to its
/// output; a second rollback (from the templates the first made) too.
/// A damaged image is then refused naming the checkpoint, and nothing
/// runs but init.
fn restore_from_the_image_when_templates_are_killed(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let pid = start_python(e, &sb, KEEPER).await?;
        let first = ask(e, &sb, 1).await?;
        ensure!(first.starts_with("0 "), "{first}");
        let req = CheckpointRequest { wait_durable: true, ..Default::default() };
        let ck = e.checkpoint(&sb, req).await?.checkpoint;
        let image = ck.process_image.context("no process image")?;
        ensure!(image.state == ImageState::Durable, "image {:?}: {:?}", image.state, image.error);
        let at_ck = ask(e, &sb, 2).await?;
        // (`kill -9 -1` kills the shell that runs it too.)
        let _ = e
            .exec(&sb, ExecRequest { cmd: vec!["sh".into(), "-c".into(), "kill -9 -1".into()], ..Default::default() })
            .await;
        for round in 0..2 {
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.id.clone(), allow_restart: false }).await?;
            ensure!(r.processes == ProcessOutcome::Restored && r.restored_pids == vec![pid], "round {round}: {r:?}");
            let want = if round == 0 { RestoreSource::Image } else { RestoreSource::Templates };
            ensure!(r.restored_from == Some(want), "round {round}: restored from {:?}: {}", r.restored_from, r.note);
            sh(e, &sb, "rm -f /root/answer2").await?;
            let again = ask(e, &sb, 2).await?;
            ensure!(
                again == at_ck,
                "round {round}: answered {again:?} after the rollback, {at_ck:?} at the checkpoint"
            );
            let next = ask(e, &sb, 3).await?;
            ensure!(next.starts_with("2 "), "round {round}: {next}");
            sh(e, &sb, "rm -f /root/answer3").await?;
        }
        // A damaged image: the rollback fails naming the checkpoint.
        let _ = e
            .exec(&sb, ExecRequest { cmd: vec!["sh".into(), "-c".into(), "kill -9 -1".into()], ..Default::default() })
            .await;
        let path = image_path(&e.process_images_dir(), &ck.id);
        let mut bad = std::fs::read(&path)?;
        let at = bad.len() / 2;
        bad[at] ^= 0x40;
        std::fs::write(&path, &bad)?;
        match e.rollback(&sb, RollbackRequest { checkpoint: ck.id.clone(), allow_restart: false }).await {
            Ok(r) => bail!("a rollback from a damaged image answered {r:?}"),
            Err(err) => ensure!(err.to_string().contains(&ck.id), "the error does not name the checkpoint: {err}"),
        }
        let ps = sh(e, &sb, "cat /proc/[0-9]*/comm").await?;
        ensure!(!ps.contains("python3"), "after a failed rollback from a damaged image, a process runs: {ps}");
        e.delete_sandbox(&sb, true).await?;
        e.delete_checkpoint(&ck.id, true).await.ok();
        Ok(())
    })
}

/// `sandtree fork CK -n 3` of a checkpoint with a live process (not
/// waited durable: the fork waits for its image): each fork runs a copy
/// with the same pid, its memory (counter, pages) as at the checkpoint,
/// its open file re-pointed into the fork's own tree; the forks diverge
/// from each other and from the source, which goes on untouched. A
/// fork rolls back to that checkpoint with its process; the source rolls
/// back to a checkpoint taken in a fork (its process comes from that
/// checkpoint's image). `files_only` copies the files alone; a
/// checkpoint whose image cannot bring a process back refuses the fork by
/// name, and creates nothing.
fn forks_run_copies_of_the_checkpoints_processes(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let pid = start_python(e, &sb, KEEPER).await?;
        let first = ask(e, &sb, 1).await?;
        ensure!(first.starts_with("0 "), "{first}");
        // And a shell waiting for its job: a parent and its child.
        let job = ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), "sleep 1000 & wait".into()],
            background: true,
            ..Default::default()
        };
        let shell = e.exec(&sb, job).await?.pid;
        let tree = format!("while ! pgrep -P {shell} >/dev/null; do sleep 0.01; done; pgrep -P {shell}");
        let child: i32 = sh(e, &sb, &tree).await?.trim().parse()?;
        let family = format!("cut -d' ' -f2,4 /proc/{shell}/stat /proc/{child}/stat");
        let want_family = format!("(sh) 1\n(sleep) {shell}\n");
        let ck = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint;
        let at_ck = ask(e, &sb, 2).await?;
        sh(e, &sb, "rm -f /root/answer2").await?;
        let req = ForkRequest { count: 3, labels: Default::default(), limits: None, files_only: false };
        let f = e.fork(&ck.id, req).await?;
        ensure!(f.processes == ProcessOutcome::Restored, "{f:?}");
        let mut forks = Vec::new();
        for r in &f.results {
            let s = r.sandbox.as_ref().with_context(|| format!("a fork failed: {:?}", r.error))?;
            let mut pids = r.restored_pids.clone();
            pids.sort();
            ensure!(
                pids == vec![pid, shell, child],
                "fork {}: restored {pids:?}, want [{pid}, {shell}, {child}]",
                s.id
            );
            ensure!(sh(e, &s.id, &family).await? == want_family, "fork {}: the shell and its job", s.id);
            forks.push(s.id.clone());
        }
        // Each answers as the source did right after the checkpoint, then
        // goes its own way (fork i is asked i more times).
        for (i, fork) in forks.iter().enumerate() {
            let again = ask(e, fork, 2).await?;
            ensure!(again == at_ck, "fork {fork}: answered {again:?}, {at_ck:?} at the checkpoint");
            for n in 3..3 + i as u32 {
                ask(e, fork, n).await?;
            }
            let log = sh(e, fork, "cat /root/log").await?;
            let want: String = (0..=i + 1).map(|k| format!("answer {} count {k}\n", k + 1)).collect();
            ensure!(log == want, "fork {fork}: its log {log:?}, want {want:?}");
        }
        for (i, fork) in forks.iter().enumerate() {
            let n = 3 + i as u32;
            let next = ask(e, fork, n).await?;
            ensure!(next.starts_with(&format!("{} ", n - 1)), "fork {fork}: asked {n}: {next}");
        }
        // The source did not see any of it.
        ensure!(sh(e, &sb, "cat /root/log").await? == "answer 1 count 0\nanswer 2 count 1\n", "the source's log");
        let next = ask(e, &sb, 3).await?;
        ensure!(next.starts_with("2 "), "the source: {next}");
        // A fork back to the checkpoint: its process again.
        let r = e.rollback(&forks[0], RollbackRequest { checkpoint: ck.id.clone(), allow_restart: false }).await?;
        ensure!(r.processes == ProcessOutcome::Restored && r.restored_pids.len() == 3, "{r:?}");
        sh(e, &forks[0], "rm -f /root/answer2").await?;
        ensure!(ask(e, &forks[0], 2).await? == at_ck, "fork {} after its rollback", forks[0]);
        // The source to a checkpoint of the last fork: that fork's process.
        let last = forks.last().context("no fork")?;
        let ck_fork = e.checkpoint(last, CheckpointRequest { wait_durable: true, ..Default::default() }).await?;
        let in_fork = ask(e, last, 6).await?;
        let r = e
            .rollback(&sb, RollbackRequest { checkpoint: ck_fork.checkpoint.id.clone(), allow_restart: false })
            .await?;
        ensure!(r.processes == ProcessOutcome::Restored && r.restored_from == Some(RestoreSource::Image), "{r:?}");
        sh(e, &sb, "rm -f /root/answer6").await?;
        ensure!(ask(e, &sb, 6).await? == in_fork, "the source back to the fork's checkpoint");
        // The files alone.
        let req = ForkRequest { count: 1, labels: Default::default(), limits: None, files_only: true };
        let f = e.fork(&ck.id, req).await?;
        ensure!(f.processes == ProcessOutcome::NotCopied, "{f:?}");
        let alone = f.results[0].sandbox.as_ref().context("the files-only fork failed")?.id.clone();
        let ps = sh(e, &alone, "cat /proc/[0-9]*/comm").await?;
        ensure!(!ps.contains("python3"), "a files-only fork runs {ps}");
        forks.push(alone);
        // Refused by name: a process holding a FIFO (not in images yet).
        let fifo = "mkfifo /root/p && exec 3<>/root/p && echo > /root/fifo.ready && exec sleep 1000";
        let bg =
            ExecRequest { cmd: vec!["sh".into(), "-c".into(), fifo.into()], background: true, ..Default::default() };
        e.exec(&sb, bg).await?;
        sh(e, &sb, "while [ ! -e /root/fifo.ready ] || ! grep -qx sleep /proc/[0-9]*/comm; do sleep 0.01; done")
            .await?;
        let ck2 = e.checkpoint(&sb, CheckpointRequest { wait_durable: true, ..Default::default() }).await?.checkpoint;
        let before = e.list_sandboxes().await?.sandboxes.len();
        let req = ForkRequest { count: 2, labels: Default::default(), limits: None, files_only: false };
        match e.fork(&ck2.id, req).await {
            Ok(f) => bail!("a fork whose image cannot bring a FIFO back answered {f:?}"),
            Err(err) => {
                let text = err.to_string();
                ensure!(
                    text.contains(&ck2.id)
                        && text.to_lowercase().contains("fifo")
                        && text.contains("nothing was created"),
                    "{text}"
                );
            }
        }
        ensure!(e.list_sandboxes().await?.sandboxes.len() == before, "a refused fork created sandboxes");
        for id in forks.iter().chain([&sb]) {
            e.delete_sandbox(id, true).await?;
        }
        Ok(())
    })
}

/// A fork whose copies would not fit in the host's memory (256 copies of
/// a process holding 256 MiB: 64 GiB) is refused, naming the sizes, and
/// creates nothing; fewer copies of it fork.
fn a_fork_too_large_for_the_memory_is_refused(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let available: u64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .context("MemAvailable")?;
        if available * 1024 >= 64 << 30 {
            eprintln!("skipped: this host has 64 GiB or more available, which 256 copies of 256 MiB fit in");
            return Ok(());
        }
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        start_python(e, &sb, "import time\ndata = b'x' * (256 << 20)\nopen('/root/up', 'w').close()\ntime.sleep(1000)")
            .await?;
        sh(e, &sb, "while [ ! -e /root/up ]; do sleep 0.01; done").await?;
        let ck = e.checkpoint(&sb, CheckpointRequest { wait_durable: true, ..Default::default() }).await?.checkpoint;
        let before = e.list_sandboxes().await?.sandboxes.len();
        let req = ForkRequest { count: 256, labels: Default::default(), limits: None, files_only: false };
        match e.fork(&ck.id, req).await {
            Ok(f) => bail!("256 copies of 256 MiB answered {:?}", f.processes),
            Err(err) => {
                let text = err.to_string();
                let api = err.to_api();
                ensure!(api.code == sandtree_api::ErrorCode::NotEnoughMemory, "{api:?}");
                ensure!(
                    text.contains(&ck.id) && text.contains("256 copies") && text.contains("MB available"),
                    "{text}"
                );
            }
        }
        ensure!(e.list_sandboxes().await?.sandboxes.len() == before, "a refused fork created sandboxes");
        let req = ForkRequest { count: 2, labels: Default::default(), limits: None, files_only: false };
        let f = e.fork(&ck.id, req).await?;
        ensure!(f.processes == ProcessOutcome::Restored, "{f:?}");
        for r in &f.results {
            e.delete_sandbox(&r.sandbox.as_ref().context("a fork failed")?.id, true).await?;
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A checkpoint whose sandbox is deleted (or stopped) right after it, its
/// image not written yet: the delete waits for the image (written from
/// the templates it would end), so the checkpoint still seeds forks with
/// its processes. Before, the image failed ("the sandbox stopped before
/// its image was written") and the fork was refused.
fn a_sandbox_deleted_right_after_a_checkpoint_keeps_its_image(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        for stop in [false, true] {
            let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
            let pid = start_python(e, &sb, KEEPER).await?;
            ensure!(ask(e, &sb, 1).await?.starts_with("0 "), "the keeper did not answer");
            let ck = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
            if stop {
                e.stop_sandbox(&sb).await?;
            } else {
                e.delete_sandbox(&sb, false).await?;
            }
            let how = if stop { "stopped" } else { "deleted" };
            let image = e.get_checkpoint(&ck).await?.process_image.context("no image")?;
            ensure!(image.state == ImageState::Durable, "{how}: image {:?}: {:?}", image.state, image.error);
            let req = ForkRequest { count: 1, labels: Default::default(), limits: None, files_only: false };
            let f = e.fork(&ck, req).await?;
            ensure!(f.processes == ProcessOutcome::Restored && f.results[0].restored_pids == vec![pid], "{how}: {f:?}");
            let fork = f.results[0].sandbox.as_ref().context("the fork failed")?.id.clone();
            ensure!(ask(e, &fork, 2).await?.starts_with("1 "), "{how}: the fork's keeper");
            e.delete_sandbox(&fork, true).await?;
            if stop {
                e.delete_sandbox(&sb, true).await?;
            }
        }
        Ok(())
    })
}

/// A process an exec started (in init's session: sid 0 in the sandbox),
/// restored from the image after a stop and a start, is back in init's
/// session (before: in the session of the template the image made, whose
/// pid the next restore then could not take back), so a checkpoint of it
/// forks and restores again.
fn a_process_in_inits_session_keeps_it_through_an_image(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id;
        let cmd = vec!["sleep".to_string(), "1000".to_string()];
        let mut events = e.exec_stream(&sb, ExecRequest { cmd, ..Default::default() }).await?;
        let Some(sandtree_api::ExecEvent::Started { pid }) = events.recv().await else {
            bail!("no start event");
        };
        let sb_ref = &sb;
        let sid = |at: &'static str| async move {
            let out = sh(e, sb_ref, &format!("ps -o sid= -p {pid}")).await?;
            ensure!(out.trim() == "0", "{at}: sleep's session is {:?}, not init's (0)", out.trim());
            anyhow::Ok(())
        };
        sid("at the start").await?;
        let req = CheckpointRequest { wait_durable: true, ..Default::default() };
        let ck = e.checkpoint(&sb, req).await?.checkpoint.id;
        e.stop_sandbox(&sb).await?;
        e.start_sandbox(&sb).await?;
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
        ensure!(r.restored_from == Some(RestoreSource::Image) && r.restored_pids == vec![pid], "{r:?}");
        sid("restored from the image").await?;
        let again = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint.id;
        let forked = e
            .fork(&again, ForkRequest { count: 1, labels: Default::default(), limits: None, files_only: false })
            .await?;
        let f = &forked.results[0];
        ensure!(f.error.is_none() && f.restored_pids == vec![pid], "the fork after it: {forked:?}");
        if let Some(s) = &f.sandbox {
            e.delete_sandbox(&s.id, true).await?;
        }
        let r = e.rollback(&sb, RollbackRequest { checkpoint: again.clone(), allow_restart: false }).await?;
        ensure!(r.restored_pids == vec![pid], "a rollback after it: {r:?}");
        drop(events);
        e.delete_sandbox(&sb, true).await?;
        for c in [again, ck] {
            e.delete_checkpoint(&c, true).await.ok();
        }
        Ok(())
    })
}

fn main() {
    let cases: Vec<(&str, Case)> = vec![
        ("a_process_in_inits_session_keeps_it_through_an_image", a_process_in_inits_session_keeps_it_through_an_image),
        ("images_hold_each_checkpoints_pages", images_hold_each_checkpoints_pages),
        ("restore_from_the_image_when_templates_are_killed", restore_from_the_image_when_templates_are_killed),
        ("forks_run_copies_of_the_checkpoints_processes", forks_run_copies_of_the_checkpoints_processes),
        ("a_fork_too_large_for_the_memory_is_refused", a_fork_too_large_for_the_memory_is_refused),
        (
            "a_sandbox_deleted_right_after_a_checkpoint_keeps_its_image",
            a_sandbox_deleted_right_after_a_checkpoint_keeps_its_image,
        ),
    ];
    common::run("sandtree-images-test", "sandtree-images-test", |_| {}, cases);
}
