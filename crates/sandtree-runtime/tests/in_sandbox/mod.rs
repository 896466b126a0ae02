//! Running programs in a sandbox, for the test files that need only this
//! (`engine.rs`, `eviction.rs`; `workloads.rs` has its own, with stdin).

use anyhow::{Result, ensure};
use sandtree_api::ExecRequest;
use sandtree_runtime::Engine;

/// `sh -c script` in sandbox `sb`: its stdout, or an error unless it
/// exited 0.
pub async fn sh(e: &Engine, sb: &str, script: &str) -> Result<String> {
    let out =
        e.exec(sb, ExecRequest { cmd: vec!["sh".into(), "-c".into(), script.into()], ..Default::default() }).await?;
    ensure!(out.exit_code == Some(0), "`{script}` exited {:?}: {}", out.exit_code, out.stderr);
    Ok(out.stdout)
}

/// `python3 -c code` started in the background in sandbox `sb`: its pid
/// there.
pub async fn start_python(e: &Engine, sb: &str, code: &str) -> Result<i32> {
    let bg =
        ExecRequest { cmd: vec!["python3".into(), "-c".into(), code.into()], background: true, ..Default::default() };
    Ok(e.exec(sb, bg).await?.pid)
}
