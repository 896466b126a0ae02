#![forbid(unsafe_code)]
//! The `sandtree` binary: `sandtree daemon` runs the API server; every other
//! verb is a client of it (see `sandtree --help` and the library docs).
//!
//! `main` is a plain function: `daemon` and `bench` start the zygote, which
//! must fork while the process is still single-threaded, so the tokio runtime
//! is built by hand afterwards.

mod bench;
mod demo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sandtree::cli::{self, Command, GlobalArgs};
use sandtree::daemon;

#[derive(Parser, Debug)]
#[command(name = "sandtree", version, about = "Sandboxes for AI agents with millisecond checkpoint, rollback and fork")]
struct BinCli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: BinCommand,
}

#[derive(Subcommand, Debug)]
enum BinCommand {
    #[command(flatten)]
    Core(Command),
    /// Benchmark Sandtree against cp, tar, git and btrfs on this host (as root).
    Bench(bench::BenchArgs),
    /// The quickstart walk-through against a running daemon: create, install,
    /// checkpoint, fork 8, roll back, print the tree and the latencies.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = BinCli::parse();
    let result = match cli.command {
        BinCommand::Bench(args) => bench::run(args).map(|()| 0),
        BinCommand::Demo(args) => {
            let socket = cli.global.socket.clone().unwrap_or_else(|| "/var/lib/sandtree/sandtree.sock".into());
            demo::run(args, socket).map(|()| 0)
        }
        BinCommand::Core(Command::Daemon(mut args)) => {
            args.socket = cli.global.socket.clone();
            daemon::main(*args).map(|()| 0)
        }
        BinCommand::Core(Command::Openapi) => {
            print!("{}", daemon::openapi::document_json());
            Ok(0)
        }
        BinCommand::Core(command) => client(cli.global, command),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn client(global: GlobalArgs, command: Command) -> anyhow::Result<i32> {
    quiet_on_closed_stdout();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let code = rt.block_on(cli::run(global, command));
    // stdin readers (interactive shell) may still block a worker: don't wait for them.
    rt.shutdown_background();
    code
}

/// A client whose reader went away (`sandtree ls | head -1`) ends as a
/// shell command would, silently with 141 (128 + SIGPIPE), rather than
/// panicking: Rust ignores SIGPIPE, so `println!` to a closed pipe panics.
/// (SIGPIPE itself stays ignored: a daemon gone mid-request is an error
/// the client reports.)
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::BinCli::command().debug_assert();
    }
}
