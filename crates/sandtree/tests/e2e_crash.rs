//! Crash safety: SIGKILL the daemon at many points while it creates,
//! checkpoints, rolls back, forks and deletes. After each restart every
//! completed operation must be intact, nothing half-made may be visible, and
//! no orphan may be left on disk.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Daemon, request};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

#[derive(Default, Debug)]
struct Ledger {
    /// Sandboxes whose create/fork response arrived and whose delete did not.
    sandboxes: BTreeSet<String>,
    deleted_sandboxes: BTreeSet<String>,
    checkpoints: BTreeSet<String>,
    deleted_checkpoints: BTreeSet<String>,
    /// A delete whose response had not arrived when the daemon died: it may
    /// or may not have happened.
    in_flight_delete: Option<String>,
    completed: usize,
}

fn post(sock: &std::path::Path, path: &str, body: Value) -> Option<(u16, Value)> {
    request(sock, "POST", path, Some(&body)).ok()
}

/// Issues random operations until a request fails (the daemon was killed).
fn worker(sock: std::path::PathBuf, ledger: Arc<Mutex<Ledger>>, root_ck: String, stop: Arc<AtomicBool>) {
    let mut rng = rand::rng();
    while !stop.load(Ordering::Relaxed) {
        let (sbs, cks): (Vec<String>, Vec<String>) = {
            let l = ledger.lock().unwrap();
            (l.sandboxes.iter().cloned().collect(), l.checkpoints.iter().cloned().collect())
        };
        let op = rng.random_range(0..100);
        let result = if op < 25 || sbs.is_empty() {
            post(&sock, "/v1/sandboxes", json!({})).map(|(s, v)| {
                if s == 201 || s == 200 {
                    let mut l = ledger.lock().unwrap();
                    l.sandboxes.insert(v["sandbox"]["id"].as_str().unwrap().to_string());
                    l.completed += 1;
                }
                s
            })
        } else if op < 55 {
            let sb = sbs.choose(&mut rng).unwrap();
            let _ =
                post(&sock, &format!("/v1/sandboxes/{sb}/exec"), json!({"cmd": ["sh", "-c", "date +%N >> /root/log"]}));
            post(&sock, &format!("/v1/sandboxes/{sb}/checkpoints"), json!({})).map(|(s, v)| {
                if s == 201 || s == 200 {
                    let mut l = ledger.lock().unwrap();
                    l.checkpoints.insert(v["checkpoint"]["id"].as_str().unwrap().to_string());
                    l.completed += 1;
                }
                s
            })
        } else if op < 70 {
            let sb = sbs.choose(&mut rng).unwrap();
            post(&sock, &format!("/v1/sandboxes/{sb}/rollback"), json!({"checkpoint": root_ck})).map(|(s, _)| {
                if s == 200 {
                    ledger.lock().unwrap().completed += 1;
                }
                s
            })
        } else if op < 82 {
            post(&sock, &format!("/v1/checkpoints/{root_ck}/fork"), json!({"count": 3})).map(|(s, v)| {
                if s == 200 {
                    let mut l = ledger.lock().unwrap();
                    for r in v["results"].as_array().unwrap() {
                        if let Some(id) = r["sandbox"]["id"].as_str() {
                            l.sandboxes.insert(id.to_string());
                        }
                    }
                    l.completed += 1;
                }
                s
            })
        } else if op < 92 && sbs.len() > 2 {
            let sb = sbs.choose(&mut rng).unwrap().clone();
            ledger.lock().unwrap().in_flight_delete = Some(sb.clone());
            request(&sock, "DELETE", &format!("/v1/sandboxes/{sb}"), None).ok().map(|(s, _)| {
                if s == 200 {
                    let mut l = ledger.lock().unwrap();
                    l.in_flight_delete = None;
                    l.sandboxes.remove(&sb);
                    l.deleted_sandboxes.insert(sb);
                    l.completed += 1;
                }
                s
            })
        } else if let Some(ck) = cks.iter().filter(|c| **c != root_ck).collect::<Vec<_>>().choose(&mut rng) {
            let ck = (*ck).clone();
            ledger.lock().unwrap().in_flight_delete = Some(ck.clone());
            request(&sock, "DELETE", &format!("/v1/checkpoints/{ck}?force=true"), None).ok().map(|(s, _)| {
                if s == 200 {
                    let mut l = ledger.lock().unwrap();
                    l.in_flight_delete = None;
                    l.checkpoints.remove(&ck);
                    l.deleted_checkpoints.insert(ck);
                    l.completed += 1;
                }
                s
            })
        } else {
            Some(200)
        };
        if result.is_none() {
            return; // daemon gone
        }
    }
}

#[test]
fn sigkill_during_operations_keeps_completed_ones_and_leaves_no_partial_state() {
    if common::must_skip() {
        return;
    }
    let mut d = Daemon::start("crash");
    let base = d.create();
    d.sh_ok(&base, "echo root > /root/f");
    let root_ck = d.checkpoint(&base, "root");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    {
        let mut l = ledger.lock().unwrap();
        l.sandboxes.insert(base.clone());
        l.checkpoints.insert(root_ck.clone());
    }
    let mut rng = rand::rng();
    let rounds = 30;
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (sock, ledger, root_ck, stop) = (d.socket.clone(), ledger.clone(), root_ck.clone(), stop.clone());
            std::thread::spawn(move || worker(sock, ledger, root_ck, stop))
        };
        // Kill at a different point each round: early rounds hit the first
        // milliseconds of an operation, later ones land deeper into a sequence.
        let delay = rng.random_range(5..40 + round * 40);
        std::thread::sleep(Duration::from_millis(delay as u64));
        d.kill9();
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
        d.spawn();

        // Completed operations are intact; deleted things stay deleted.
        let listed: BTreeSet<String> = d.sandbox_ids().into_iter().collect();
        let cks: BTreeSet<String> = d.checkpoint_ids().into_iter().collect();
        let mut l = ledger.lock().unwrap();
        if let Some(gone) = l.in_flight_delete.take() {
            // Either outcome is complete; drop it from what must exist.
            l.sandboxes.remove(&gone);
            l.checkpoints.remove(&gone);
        }
        for sb in &l.sandboxes {
            assert!(listed.contains(sb), "round {round}: completed sandbox {sb} lost; log:\n{}", d.log());
        }
        for sb in &l.deleted_sandboxes {
            assert!(!listed.contains(sb), "round {round}: deleted sandbox {sb} is back");
        }
        for ck in &l.checkpoints {
            assert!(cks.contains(ck), "round {round}: completed checkpoint {ck} lost");
        }
        for ck in &l.deleted_checkpoints {
            assert!(!cks.contains(ck), "round {round}: deleted checkpoint {ck} is back");
        }
        // Nothing lost: every layer a row names (a sandbox's writable
        // subvolume, a checkpoint's layer, any lower layer) is on disk.
        let meta = sandtree_meta::Meta::open(&d.dir.join("meta.db")).unwrap();
        let used = meta.layers_in_use().unwrap();
        for layer in &used {
            assert!(d.dir.join("btrfs").join(layer).exists(), "round {round}: layer {layer} is gone");
        }
        // Nothing partial (GC ran at start): a sandbox directory belongs to
        // a listed sandbox or holds layers rows name (a deleted sandbox's
        // checkpoints); a checkpoint snapshot is named by its row.
        for dir in d.on_disk("sandboxes") {
            let named = used.iter().any(|l| l.starts_with(&format!("sandboxes/{dir}/")));
            assert!(listed.contains(&dir) || named, "round {round}: sandbox directory {dir} is left over");
        }
        for ck in d.on_disk("checkpoints") {
            assert!(
                used.contains(&format!("checkpoints/{ck}")),
                "round {round}: checkpoint snapshot {ck} is left over"
            );
        }
        drop(meta);
        drop(l);
        // Every listed sandbox works (re-adopted or restarted).
        for sb in &listed {
            let (code, _) = d.sh(sb, "test -d /root && true");
            assert_eq!(code, 0, "round {round}: sandbox {sb} does not run commands");
        }
        // Adopt whatever completed in-flight so later rounds track it too.
        let mut l = ledger.lock().unwrap();
        l.sandboxes = listed;
        l.checkpoints = cks;
    }
    let l = ledger.lock().unwrap();
    assert!(l.completed >= rounds, "too few operations completed to mean anything: {}", l.completed);
    eprintln!("crash test: {} operations completed across {rounds} kills", l.completed);
}
