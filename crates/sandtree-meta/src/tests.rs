use super::*;

fn sandbox(id: &str, subvol: &str) -> SandboxRecord {
    SandboxRecord {
        id: id.into(),
        image: "default".into(),
        tree_id: id.into(),
        created_at: "2026-11-30T00:00:00Z".into(),
        labels: BTreeMap::from([("k".into(), "v".into())]),
        limits: serde_json::json!({"pids": 64}),
        subvol: subvol.into(),
        base_checkpoint: None,
        base_transid: 0,
        state: DesiredState::Running,
        status_reason: None,
        lowers: vec!["checkpoints/ck-0".into()],
        network: serde_json::json!({"mode": "none"}),
    }
}

fn checkpoint(id: &str, parent: Option<&str>) -> CheckpointRecord {
    CheckpointRecord {
        id: id.into(),
        sandbox_id: "sb-a".into(),
        tree_id: "sb-a".into(),
        parent: parent.map(Into::into),
        image: "default".into(),
        label: Some("l".into()),
        labels: BTreeMap::new(),
        created_at: "2026-11-30T00:00:00Z".into(),
        transid: 7,
        size_bytes: None,
        frozen_ms: 1.5,
        duration_ms: 3.0,
        processes: serde_json::json!({ "captured": [12], "unrestorable": [] }),
        layer: format!("sandboxes/sb-a/{id}"),
        lowers: vec!["checkpoints/ck-0".into()],
    }
}

fn open() -> (tempfile::TempDir, Meta) {
    let dir = tempfile::tempdir().unwrap();
    let meta = Meta::open(&dir.path().join("meta.db")).unwrap();
    (dir, meta)
}

#[test]
fn sandbox_round_trips_with_labels_and_limits() {
    let (_d, meta) = open();
    let s = sandbox("sb-a", "sb-a.1");
    meta.insert_sandbox(&s).unwrap();
    assert_eq!(meta.sandbox("sb-a").unwrap(), Some(s));
    assert_eq!(meta.sandbox("sb-missing").unwrap(), None);
}

#[test]
fn duplicate_subvolume_is_rejected() {
    let (_d, meta) = open();
    meta.insert_sandbox(&sandbox("sb-a", "x")).unwrap();
    assert!(meta.insert_sandbox(&sandbox("sb-b", "x")).is_err());
}

#[test]
fn insert_sandboxes_is_all_or_nothing() {
    let (_d, meta) = open();
    let list = vec![sandbox("sb-a", "a"), sandbox("sb-b", "b"), sandbox("sb-a", "c")];
    assert!(meta.insert_sandboxes(&list).is_err());
    assert!(meta.sandboxes().unwrap().is_empty());
}

#[test]
fn deleting_a_checkpoint_relinks_children_and_sandboxes_to_its_parent() {
    let (_d, meta) = open();
    meta.insert_checkpoint(&checkpoint("ck-1", None), None, None).unwrap();
    meta.insert_checkpoint(&checkpoint("ck-2", Some("ck-1")), None, None).unwrap();
    meta.insert_checkpoint(&checkpoint("ck-3", Some("ck-2")), None, None).unwrap();
    let mut s = sandbox("sb-a", "a");
    s.base_checkpoint = Some("ck-2".into());
    meta.insert_sandbox(&s).unwrap();

    assert_eq!(meta.checkpoint_dependents("ck-2").unwrap(), (vec!["ck-3".into()], vec!["sb-a".into()]));
    assert!(meta.delete_checkpoint("ck-2").unwrap());

    assert_eq!(meta.checkpoint("ck-3").unwrap().unwrap().parent.as_deref(), Some("ck-1"));
    assert_eq!(meta.sandbox("sb-a").unwrap().unwrap().base_checkpoint.as_deref(), Some("ck-1"));
    assert!(!meta.delete_checkpoint("ck-2").unwrap());
}

#[test]
fn checkpoints_list_parents_before_children_and_filter_by_tree() {
    let (_d, meta) = open();
    meta.insert_checkpoint(&checkpoint("ck-z", None), None, None).unwrap();
    meta.insert_checkpoint(&checkpoint("ck-a", Some("ck-z")), None, None).unwrap();
    let mut other = checkpoint("ck-o", None);
    other.tree_id = "sb-other".into();
    meta.insert_checkpoint(&other, None, None).unwrap();
    let ids: Vec<_> = meta.checkpoints(Some("sb-a")).unwrap().into_iter().map(|c| c.id).collect();
    assert_eq!(ids, vec!["ck-z", "ck-a"]);
    assert_eq!(meta.checkpoints(None).unwrap().len(), 3);
}

#[test]
fn committed_rows_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    {
        let meta = Meta::open(&path).unwrap();
        meta.insert_checkpoint(&checkpoint("ck-1", None), None, None).unwrap();
        meta.set_checkpoint_size("ck-1", 4096).unwrap();
        // Dropped without a clean shutdown of anything else.
    }
    let meta = Meta::open(&path).unwrap();
    assert_eq!(meta.checkpoint("ck-1").unwrap().unwrap().size_bytes, Some(4096));
}

#[test]
fn newer_schema_is_refused_with_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    }
    let err = Meta::open(&path).err().unwrap();
    assert!(err.to_string().contains("upgrade sandtree"), "{err}");
}

#[test]
fn image_users_count_sandboxes_and_checkpoints() {
    let (_d, meta) = open();
    meta.insert_sandbox(&sandbox("sb-a", "a")).unwrap();
    meta.insert_checkpoint(&checkpoint("ck-1", None), None, None).unwrap();
    assert_eq!(meta.image_users("default").unwrap(), (1, 1));
    assert_eq!(meta.image_users("other").unwrap(), (0, 0));
}

#[test]
fn checkpoint_with_rebase_moves_the_sandbox_base_in_the_same_commit() {
    let (_d, meta) = open();
    meta.insert_sandbox(&sandbox("sb-a", "a")).unwrap();
    meta.insert_checkpoint(&checkpoint("ck-1", None), Some("sb-a"), None).unwrap();
    let s = meta.sandbox("sb-a").unwrap().unwrap();
    assert_eq!(s.base_checkpoint.as_deref(), Some("ck-1"));
    assert_eq!(s.base_transid, 7);
}

#[test]
fn schema_v1_database_gains_the_processes_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE checkpoints (id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, tree_id TEXT NOT NULL,
             parent TEXT, image TEXT NOT NULL, label TEXT, labels TEXT NOT NULL, created_at TEXT NOT NULL,
             transid INTEGER NOT NULL, size_bytes INTEGER, frozen_ms REAL NOT NULL, duration_ms REAL NOT NULL);
             INSERT INTO checkpoints VALUES ('ck-old', 'sb-a', 'sb-a', NULL, 'default', NULL, '{}', 't', 1, NULL, 1.0, 2.0);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let meta = Meta::open(&path).unwrap();
    let old = meta.checkpoint("ck-old").unwrap().unwrap();
    assert_eq!(old.processes, serde_json::Value::Null);
    // A checkpoint from before stacked layers is one full layer.
    assert_eq!(old.stack(), vec!["checkpoints/ck-old".to_string()]);
    meta.insert_checkpoint(&checkpoint("ck-new", None), None, None).unwrap();
    assert_eq!(meta.checkpoint("ck-new").unwrap().unwrap(), checkpoint("ck-new", None));
}

#[test]
fn checkpoint_with_switch_moves_the_sandbox_onto_a_new_subvolume() {
    let (_d, meta) = open();
    meta.insert_sandbox(&sandbox("sb-a", "sb-a/1")).unwrap();
    let ck = CheckpointRecord { layer: "sandboxes/sb-a/1".into(), ..checkpoint("ck-1", None) };
    let lowers = ck.stack();
    meta.insert_checkpoint(&ck, Some("sb-a"), Some(("sb-a/2", &lowers))).unwrap();
    let s = meta.sandbox("sb-a").unwrap().unwrap();
    assert_eq!(
        (s.subvol.as_str(), s.lowers.clone()),
        ("sb-a/2", vec!["sandboxes/sb-a/1".into(), "checkpoints/ck-0".into()])
    );
    assert_eq!(s.base_checkpoint.as_deref(), Some("ck-1"));
    let used = meta.layers_in_use().unwrap();
    for l in ["sandboxes/sb-a/1", "sandboxes/sb-a/2", "checkpoints/ck-0"] {
        assert!(used.contains(l), "{l} in {used:?}");
    }
    assert!(!used.contains("sandboxes/sb-a/0"));
}

#[test]
fn squash_replaces_a_run_of_checkpoints_lowers() {
    let (_d, meta) = open();
    let mut sb = sandbox("sb-a", "sb-a/9");
    sb.lowers = vec!["l3".into(), "l2".into(), "l1".into()];
    meta.insert_sandbox(&sb).unwrap();
    let ck = CheckpointRecord { lowers: vec!["l2".into(), "l1".into()], ..checkpoint("ck-1", None) };
    meta.insert_checkpoint(&ck, None, None).unwrap();
    let other = CheckpointRecord { lowers: vec!["l1".into()], ..checkpoint("ck-2", None) };
    let middle = CheckpointRecord {
        lowers: vec!["l4".into(), "l2".into(), "l1".into(), "l0".into()],
        ..checkpoint("ck-3", None)
    };
    meta.insert_checkpoint(&middle, None, None).unwrap();
    meta.insert_checkpoint(&other, None, None).unwrap();
    let run = vec!["l2".to_string(), "l1".to_string()];
    assert_eq!(meta.squash_lowers(&run, "sq").unwrap(), 2);
    assert_eq!(meta.checkpoint("ck-3").unwrap().unwrap().lowers, ["l4", "sq", "l0"].map(String::from).to_vec());
    // The sandbox row names what its overlays are mounted on: unchanged.
    assert_eq!(meta.sandbox("sb-a").unwrap().unwrap().lowers, sb.lowers);
    assert_eq!(meta.checkpoint("ck-1").unwrap().unwrap().lowers, vec!["sq".to_string()]);
    // A stack that holds only part of the run keeps it.
    assert_eq!(meta.checkpoint("ck-2").unwrap().unwrap().lowers, vec!["l1".to_string()]);
}
