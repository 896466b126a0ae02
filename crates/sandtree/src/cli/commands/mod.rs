//! One file per group of verbs; [`run`] dispatches.

mod checkpoint;
mod exec;
mod images;
mod mcp;
mod sandbox;
mod shell;

use anyhow::Result;
use hyper::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::client::Client;
use super::output::print_json;
use super::{Command, GlobalArgs};

/// What every verb needs: the client and the output mode.
pub struct Ctx {
    pub client: Client,
    pub json: bool,
}

impl Ctx {
    /// Calls the API; with `--json` prints the raw response. Returns it decoded.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let v = self.client.call(method, path, body).await?;
        if self.json {
            print_json(&v);
        }
        Ok(serde_json::from_value(v)?)
    }

    /// A call without a body.
    pub async fn get<T: DeserializeOwned>(&self, method: Method, path: &str) -> Result<T> {
        self.call(method, path, None::<&()>).await
    }
}

pub async fn run(global: GlobalArgs, command: Command) -> Result<i32> {
    let ctx = Ctx { client: global.client()?, json: global.json };
    match command {
        Command::Daemon(_) | Command::Openapi => unreachable!("handled by main"),
        Command::Mcp => mcp::serve(ctx.client).await,
        Command::Create(a) => sandbox::create(&ctx, a).await,
        Command::Ls => sandbox::ls(&ctx).await,
        Command::Info { sandbox } => sandbox::info(&ctx, sandbox).await,
        Command::Network { sandbox: id, allow, deny, clear } => sandbox::network(&ctx, &id, allow, deny, clear).await,
        Command::Port { sandbox: id, port, close, listen } => sandbox::port(&ctx, &id, port, close, listen).await,
        Command::Rm { ids, checkpoints, force } => sandbox::rm(&ctx, ids, checkpoints, force).await,
        Command::Start { sandbox } => sandbox::start_stop(&ctx, &sandbox, "start").await,
        Command::Stop { sandbox } => sandbox::start_stop(&ctx, &sandbox, "stop").await,
        Command::Gc => sandbox::gc(&ctx).await,
        Command::Exec(a) => exec::exec(&ctx, a).await,
        Command::Ps { sandbox } => exec::ps(&ctx, &sandbox).await,
        Command::Logs { sandbox, pid } => exec::logs(&ctx, &sandbox, pid).await,
        Command::Kill { sandbox, pid, signal } => exec::kill(&ctx, &sandbox, pid, signal).await,
        Command::Shell(a) => shell::shell(&ctx, a).await,
        Command::Checkpoint { action: Some(crate::cli::CheckpointCommand::Inspect { checkpoint }), .. } => {
            checkpoint::inspect(&ctx, &checkpoint).await
        }
        Command::Checkpoint { action: None, sandbox, label, best_effort, durable } => {
            let sandbox = sandbox.unwrap_or_default();
            checkpoint::checkpoint(&ctx, &sandbox, label, best_effort, durable).await
        }
        Command::Rollback { sandbox, checkpoint, allow_restart } => {
            checkpoint::rollback(&ctx, &sandbox, &checkpoint, allow_restart).await
        }
        Command::Fork { checkpoint, count, labels, files_only } => {
            checkpoint::fork(&ctx, &checkpoint, count, labels, files_only).await
        }
        Command::Tree { sandbox, all } => checkpoint::tree(&ctx, sandbox, all).await,
        Command::RmCheckpoint { checkpoint, force } => checkpoint::rm(&ctx, &checkpoint, force).await,
        Command::Images { action } => images::images(&ctx, action).await,
    }
}
