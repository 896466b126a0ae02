//! Command-line parsing: every verb and its flags.

use clap::Parser;
use sandtree::cli::{Cli, Command, ImagesCommand};

fn parse(args: &[&str]) -> Cli {
    let mut v = vec!["sandtree"];
    v.extend_from_slice(args);
    Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn fails(args: &[&str]) {
    let mut v = vec!["sandtree"];
    v.extend_from_slice(args);
    assert!(Cli::try_parse_from(v).is_err(), "{args:?} should not parse");
}

#[test]
fn clap_definition_is_consistent() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

#[test]
fn create_with_limits_and_labels() {
    let cli = parse(&[
        "create", "--image", "alpine", "--label", "a=b", "--label", "c=d=e", "--memory", "2G", "--pids", "100",
        "--cpus", "1.5",
    ]);
    let Command::Create(a) = cli.command else { panic!() };
    assert_eq!(a.image.as_deref(), Some("alpine"));
    assert_eq!(a.labels, vec![("a".into(), "b".into()), ("c".into(), "d=e".into())]);
    assert_eq!(a.memory, Some(2 << 30));
    assert_eq!(a.pids, Some(100));
    assert_eq!(a.cpus, Some(1500));
    fails(&["create", "--label", "novalue"]);
    fails(&["create", "--memory", "lots"]);
}

#[test]
fn exec_takes_the_command_after_dashes() {
    let cli = parse(&["exec", "sb-1", "--env", "A=1", "--cwd", "/tmp", "--timeout", "10s", "--", "ls", "-la", "/"]);
    let Command::Exec(a) = cli.command else { panic!() };
    assert_eq!(a.sandbox, "sb-1");
    assert_eq!(a.cmd, vec!["ls", "-la", "/"]);
    assert_eq!(a.env, vec![("A".into(), "1".into())]);
    assert_eq!(a.cwd.as_deref(), Some("/tmp"));
    assert_eq!(a.timeout, Some(std::time::Duration::from_secs(10)));
    assert!(!a.background);
    let cli = parse(&["exec", "sb-1", "--background", "--", "sleep", "100"]);
    let Command::Exec(a) = cli.command else { panic!() };
    assert!(a.background);
    fails(&["exec", "sb-1"]);
}

#[test]
fn shell_variants() {
    let Command::Shell(a) = parse(&["shell", "sb-1"]).command else { panic!() };
    assert!(a.session.is_none() && a.command.is_none());
    let Command::Shell(a) = parse(&["shell", "sb-1", "--session", "se-2", "-c", "cd /tmp && pwd"]).command else {
        panic!()
    };
    assert_eq!(a.session.as_deref(), Some("se-2"));
    assert_eq!(a.command.as_deref(), Some("cd /tmp && pwd"));
}

#[test]
fn checkpoint_rollback_fork_tree() {
    let Command::Checkpoint { action: None, sandbox, label, best_effort, durable } =
        parse(&["checkpoint", "sb-1", "--label", "before", "--best-effort", "--durable"]).command
    else {
        panic!()
    };
    assert_eq!(
        (sandbox.as_deref(), label.as_deref(), best_effort, durable),
        (Some("sb-1"), Some("before"), true, true)
    );
    let Command::Checkpoint { action: Some(sandtree::cli::CheckpointCommand::Inspect { checkpoint }), .. } =
        parse(&["checkpoint", "inspect", "ck-2"]).command
    else {
        panic!()
    };
    assert_eq!(checkpoint, "ck-2");
    assert!(sandtree::cli::Cli::try_parse_from(["sandtree", "checkpoint"]).is_err(), "a checkpoint needs a sandbox");
    let Command::Rollback { sandbox, checkpoint, allow_restart } =
        parse(&["rollback", "sb-1", "ck-2", "--allow-restart"]).command
    else {
        panic!()
    };
    assert_eq!((sandbox.as_str(), checkpoint.as_str(), allow_restart), ("sb-1", "ck-2", true));
    let Command::Fork { checkpoint, count, labels, files_only } =
        parse(&["fork", "ck-2", "-n", "8", "--label", "k=v", "--files-only"]).command
    else {
        panic!()
    };
    assert_eq!((checkpoint.as_str(), count, files_only), ("ck-2", 8, true));
    assert_eq!(labels.len(), 1);
    let Command::Fork { count, files_only, .. } = parse(&["fork", "ck-2"]).command else { panic!() };
    assert_eq!((count, files_only), (1, false));
    assert!(matches!(parse(&["tree"]).command, Command::Tree { sandbox: None, all: false }));
    assert!(matches!(parse(&["tree", "sb-1"]).command, Command::Tree { sandbox: Some(_), .. }));
    assert!(matches!(parse(&["tree", "--all"]).command, Command::Tree { all: true, .. }));
}

#[test]
fn management_verbs() {
    assert!(matches!(parse(&["ls"]).command, Command::Ls));
    assert!(matches!(parse(&["info"]).command, Command::Info { sandbox: None }));
    assert!(matches!(parse(&["info", "sb-1"]).command, Command::Info { sandbox: Some(_) }));
    let Command::Rm { ids, checkpoints, .. } = parse(&["rm", "sb-1", "sb-2", "--checkpoints"]).command else {
        panic!()
    };
    assert_eq!(ids.len(), 2);
    assert!(checkpoints);
    fails(&["rm"]);
    assert!(matches!(parse(&["rm-checkpoint", "ck-1", "--force"]).command, Command::RmCheckpoint { force: true, .. }));
    assert!(matches!(parse(&["start", "sb-1"]).command, Command::Start { .. }));
    assert!(matches!(parse(&["stop", "sb-1"]).command, Command::Stop { .. }));
    assert!(matches!(parse(&["gc"]).command, Command::Gc));
    assert!(matches!(parse(&["ps", "sb-1"]).command, Command::Ps { .. }));
    assert!(matches!(parse(&["logs", "sb-1", "12"]).command, Command::Logs { pid: 12, .. }));
    assert!(matches!(
        parse(&["kill", "sb-1", "12", "--signal", "15"]).command,
        Command::Kill { pid: 12, signal: 15, .. }
    ));
    assert!(matches!(parse(&["kill", "sb-1", "12"]).command, Command::Kill { signal: 9, .. }));
    fails(&["logs", "sb-1", "notapid"]);
    assert!(matches!(parse(&["images"]).command, Command::Images { action: None }));
    assert!(matches!(
        parse(&["images", "import", "alpine", "/tmp/a.tar"]).command,
        Command::Images { action: Some(ImagesCommand::Import { .. }) }
    ));
    assert!(matches!(
        parse(&["images", "rm", "alpine"]).command,
        Command::Images { action: Some(ImagesCommand::Rm { .. }) }
    ));
    assert!(matches!(parse(&["openapi"]).command, Command::Openapi));
}

#[test]
fn global_flags_and_daemon_flags() {
    let cli = parse(&["--json", "ls", "--socket", "/tmp/s.sock"]);
    assert!(cli.global.json);
    assert_eq!(cli.global.socket, Some(std::path::PathBuf::from("/tmp/s.sock")));
    let cli = parse(&["ls", "--url", "http://127.0.0.1:7000", "--token", "t"]);
    assert_eq!(cli.global.url.as_deref(), Some("http://127.0.0.1:7000"));
    let cli = parse(&[
        "daemon",
        "--data-dir",
        "/tmp/d",
        "--image-size",
        "8G",
        "--tcp",
        "127.0.0.1:7000",
        "--memory",
        "1G",
        "--pids",
        "64",
        "--cpus",
        "2",
    ]);
    let Command::Daemon(mut d) = cli.command else { panic!() };
    // (SANDTREE_SOCKET in the environment counts as --socket.)
    assert_eq!(cli.global.socket, std::env::var_os("SANDTREE_SOCKET").map(std::path::PathBuf::from));
    d.socket = None;
    assert_eq!(d.socket_path(), std::path::PathBuf::from("/tmp/d/sandtree.sock"));
    d.socket = Some("/tmp/other.sock".into());
    assert_eq!(d.socket_path(), std::path::PathBuf::from("/tmp/other.sock"));
    assert_eq!(d.token_path(), std::path::PathBuf::from("/tmp/d/token"));
    let cfg = d.config();
    assert_eq!(cfg.image_size, 8 << 30);
    assert_eq!(cfg.default_limits.memory_bytes, Some(1 << 30));
    assert_eq!(cfg.default_limits.pids, Some(64));
    assert_eq!(cfg.default_limits.cpu_millicores, Some(2000));
    fails(&["daemon", "--tcp", "not-an-addr"]);
    let cli = parse(&["daemon", "--data-dir", "/tmp/d", "--socket", "/tmp/d.sock"]);
    assert_eq!(cli.global.socket, Some(std::path::PathBuf::from("/tmp/d.sock")));
}
