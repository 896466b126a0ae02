//! End-to-end: errors that say what to do, in the words of the interface
//! that was used, and results that never claim what did not happen.

mod common;

use std::process::Command;

use common::Daemon;
use serde_json::json;

/// A Python program that holds a half-closed TCP connection to itself
/// (only established ones are captured): a checkpoint refuses it by name.
const TCP_HOLDER: &str = "import socket, time\n\
    s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
    c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n\
    c.shutdown(socket.SHUT_WR)\n\
    open('/root/ready', 'w').write('1')\n\
    time.sleep(1000)";

/// A Python program that only sleeps (restorable).
const SLEEPER: &str = "import time\nwhile True: time.sleep(1)";

fn cli(d: &Daemon, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(common::BIN).arg("--socket").arg(&d.socket).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn start_python(d: &Daemon, sb: &str, program: &str) -> i64 {
    let v = d.ok(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(json!({"cmd": ["python3", "-c", program], "background": true})),
    );
    v["pid"].as_i64().unwrap()
}

#[test]
fn refusals_name_the_option_of_the_interface_used() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("errors-options");
    let sb = d.create();
    start_python(&d, &sb, TCP_HOLDER);
    d.sh_ok(&sb, "while [ ! -e /root/ready ]; do sleep 0.02; done");

    // Over HTTP: the request field.
    let (status, v) = d.req("POST", &format!("/v1/sandboxes/{sb}/checkpoints"), Some(json!({})));
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "process_not_restorable", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("\"best_effort\": true") && !msg.contains("--best-effort"), "{msg}");

    // From the CLI: its flag, and nothing of the request field.
    let (code, _, err) = cli(&d, &["checkpoint", &sb]);
    assert_ne!(code, 0);
    assert!(err.contains("--best-effort") && !err.contains("best_effort"), "{err}");
    assert!(err.contains("python3"), "the refusal names the process: {err}");
}

#[test]
fn rollback_without_the_checkpoint_processes_fails_and_says_which() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("errors-lost");
    let sb = d.create();
    let pid = start_python(&d, &sb, SLEEPER);
    let ck = d.checkpoint_durable(&sb, "with-python");
    // Kill the checkpoint's copies of the process from inside the sandbox,
    // and remove its durable image (which would bring it back).
    let killed =
        d.sh_ok(&sb, &format!("for p in $(pgrep -x python3); do [ $p = {pid} ] || {{ kill -9 $p; echo $p; }}; done"));
    assert!(!killed.trim().is_empty(), "no checkpoint copy of {pid} in the sandbox");
    std::fs::remove_file(d.image_file(&ck)).unwrap();

    let (status, v) = d.req("POST", &format!("/v1/sandboxes/{sb}/rollback"), Some(json!({"checkpoint": ck})));
    assert_eq!(status, 409, "a rollback that cannot restore the processes answered {status}: {v}");
    assert_eq!(v["error"]["code"], "processes_lost", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("{pid} (python3)")) && msg.contains("\"allow_restart\": true"), "{msg}");
    // Nothing changed: the process still runs.
    d.sh_ok(&sb, &format!("kill -0 {pid}"));

    let (code, _, err) = cli(&d, &["rollback", &sb, &ck]);
    assert_ne!(code, 0, "the CLI's rollback exited 0");
    assert!(err.contains("--allow-restart") && !err.contains("allow_restart"), "{err}");

    let (code, out, err) = cli(&d, &["rollback", &sb, &ck, "--allow-restart"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("NOT restored"), "{out}");
    let (status, v) =
        d.req("POST", &format!("/v1/sandboxes/{sb}/rollback"), Some(json!({"checkpoint": ck, "allow_restart": true})));
    assert_eq!(status, 200, "{v}");
    assert_eq!((v["processes"].as_str(), v["processes_restarted"].as_bool()), (Some("restarted"), Some(true)), "{v}");
}

#[test]
fn forks_copy_the_processes_or_say_why_not() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("errors-fork");
    let sb = d.create();
    let ck_alone = d.checkpoint(&sb, "init-only");
    start_python(&d, &sb, SLEEPER);
    let ck = d.checkpoint(&sb, "with-python");
    // By default each fork runs a copy (made from the image, waited for).
    let v = d.ok("POST", &format!("/v1/checkpoints/{ck}/fork"), Some(json!({"count": 2})));
    assert_eq!((v["processes"].as_str(), v["processes_restarted"].as_bool()), (Some("restored"), Some(false)), "{v}");
    for r in v["results"].as_array().unwrap() {
        let fork = r["sandbox"]["id"].as_str().unwrap().to_string();
        assert_eq!(r["restored_pids"].as_array().map(Vec::len), Some(1), "{v}");
        assert_eq!(d.sh_ok(&fork, "cat /proc/2/comm").trim(), "python3", "{v}");
    }
    // The files alone, asked: not copied, and said so.
    let v = d.ok("POST", &format!("/v1/checkpoints/{ck}/fork"), Some(json!({"count": 1, "files_only": true})));
    assert_eq!((v["processes"].as_str(), v["processes_restarted"].as_bool()), (Some("not_copied"), Some(false)), "{v}");
    assert!(v["note"].as_str().unwrap().contains("not copied"), "{v}");
    let fork = v["results"][0]["sandbox"]["id"].as_str().unwrap().to_string();
    assert_eq!(d.sh_ok(&fork, "pgrep -x python3 | wc -l").trim(), "0");
    // A rollback of that fork to the checkpoint brings the process in.
    let r = d.rollback(&fork, &ck);
    assert_eq!((r["processes"].as_str(), r["restored_from"].as_str()), (Some("restored"), Some("image")), "{r}");
    assert_eq!(d.sh_ok(&fork, "cat /proc/2/comm").trim(), "python3");
    let v = d.ok("POST", &format!("/v1/checkpoints/{ck_alone}/fork"), Some(json!({"count": 1})));
    assert_eq!(v["processes"].as_str(), Some("none_captured"), "{v}");
    // Without its image, the fork is refused by name, with the remedy,
    // and creates nothing.
    std::fs::remove_file(d.image_file(&ck)).unwrap();
    let before = d.ok("GET", "/v1/sandboxes", None)["sandboxes"].as_array().unwrap().len();
    let (status, v) = d.req("POST", &format!("/v1/checkpoints/{ck}/fork"), Some(json!({"count": 2})));
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("processes_lost")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&ck) && msg.contains("python3") && msg.contains("\"files_only\": true"), "{msg}");
    assert_eq!(d.ok("GET", "/v1/sandboxes", None)["sandboxes"].as_array().unwrap().len(), before);
    let (code, _, err) = cli(&d, &["fork", &ck, "-n", "1"]);
    assert_ne!(code, 0, "the CLI's fork exited 0");
    assert!(err.contains("--files-only") && !err.contains("files_only"), "{err}");
}

#[test]
fn task_limit_is_a_client_error_that_names_the_limit() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("errors-pids");
    let v = d.ok("POST", "/v1/sandboxes", Some(json!({"limits": {"pids": 12}})));
    let sb = v["sandbox"]["id"].as_str().unwrap().to_string();
    let mut answer = None;
    for _ in 0..20 {
        let (status, v) = d.req(
            "POST",
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": ["sleep", "1000"], "background": true})),
        );
        if status != 200 {
            answer = Some((status, v));
            break;
        }
    }
    let (status, v) = answer.expect("20 processes started in a sandbox limited to 12 tasks");
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "pid_limit_reached", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("limits.pids") && msg.contains("--pids"), "{msg}");
}

#[test]
fn a_program_that_cannot_start_exits_as_in_a_shell() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("errors-spawn");
    let sb = d.create();
    // The CLI streams: the same answer as the buffered API.
    let (code, _, err) = cli(&d, &["exec", &sb, "--", "no-such-program"]);
    assert_eq!(code, 127, "{err}");
    assert!(err.contains("command not found: no-such-program"), "{err}");
    let (code, _, err) = cli(&d, &["exec", "--cwd", "/no/such/dir", &sb, "--", "true"]);
    assert_eq!(code, 126, "{err}");
    assert!(err.contains("/no/such/dir"), "{err}");
    let v = d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": ["no-such-program"]})));
    assert_eq!(v["exit_code"], 127, "{v}");
}

#[test]
fn an_unknown_process_is_not_found_and_killing_an_ended_one_is_a_no_op() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("errors-process");
    let sb = d.create();
    let (status, v) = d.req("GET", &format!("/v1/sandboxes/{sb}/processes/4242"), None);
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("process_not_found")), "{v}");
    let (status, v) = d.req("DELETE", &format!("/v1/sandboxes/{sb}/processes/4242"), None);
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("process_not_found")), "{v}");
    let bg = d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": ["true"], "background": true})));
    let pid = bg["pid"].as_i64().unwrap();
    let t = std::time::Instant::now();
    while d.ok("GET", &format!("/v1/sandboxes/{sb}/processes/{pid}"), None)["process"]["running"] == json!(true) {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "true never ended");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (status, v) = d.req("DELETE", &format!("/v1/sandboxes/{sb}/processes/{pid}"), None);
    assert_eq!(status, 204, "killing an ended process: {v}");
}
