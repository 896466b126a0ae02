#![forbid(unsafe_code)]
//! `sandtree-meta`: the durable record of what exists.
//!
//! One SQLite database (`<data_dir>/meta.db`, WAL journal) holds three tables:
//!
//! ```text
//! images       name PK | kind | source | created_at | layers (JSON) | size_bytes
//! sandboxes    id PK | image | tree_id | created_at | labels | limits | subvol
//!              | base_checkpoint | base_transid | state | status_reason | lowers
//!              | network
//! checkpoints  id PK | sandbox_id | tree_id | parent | image | label | labels
//!              | created_at | transid | size_bytes | frozen_ms | duration_ms
//!              | processes | layer | lowers
//! ```
//!
//! # Layers
//!
//! A sandbox's files are a stack of btrfs subvolumes, named by their path
//! under the volume root (`sandboxes/<id>/<gen>`, `checkpoints/<ck>`): its
//! writable `subvol` on top, then `lowers` (JSON list, top first), then the
//! image. A checkpoint is the same without the writable top: its own `layer`
//! (NULL in rows older than v3: `checkpoints/<id>`) over its `lowers`. A
//! layer is never written once a checkpoint names it; several checkpoints
//! and sandboxes share lower layers, and a layer goes only when no row
//! names it ([`Meta::layer_in_use`]).
//!
//! # Crash safety
//!
//! The database is the *commit point* of every operation. The runtime first
//! creates what an operation needs on disk (a btrfs subvolume, a process),
//! then commits the row(s) in one transaction, and only after that removes
//! what the operation replaced. A daemon killed at any moment therefore leaves
//! either the old rows (the operation is invisible) or the new ones (it is
//! complete); anything on disk that no row names is an orphan that GC deletes.
//!
//! `synchronous=NORMAL` in WAL mode makes a committed transaction survive the
//! death of the process (the WAL is written before `COMMIT` returns) without an
//! fsync per commit; only a power loss may roll back the newest commits, which
//! then look exactly like operations that never happened.
//!
//! # Trees
//!
//! Every sandbox started from an image begins a *tree* (`tree_id` = its id).
//! Its checkpoints, the sandboxes forked from them and their checkpoints share
//! that `tree_id`; a sandbox may roll back to any checkpoint of its tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};

/// Schema version stored in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 3;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("metadata database {path} could not be opened")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "metadata database {path} has schema version {found}, this daemon understands {SCHEMA_VERSION}: upgrade sandtree"
    )]
    SchemaTooNew { path: PathBuf, found: i64 },
    #[error("metadata query failed")]
    Sql(#[from] rusqlite::Error),
    #[error("metadata field {field} is not valid JSON")]
    Json {
        field: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Whether the daemon should keep a sandbox's processes running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DesiredState {
    Running,
    Stopped,
}

impl DesiredState {
    fn as_str(self) -> &'static str {
        match self {
            DesiredState::Running => "running",
            DesiredState::Stopped => "stopped",
        }
    }
    fn parse(s: &str) -> Self {
        if s == "stopped" { DesiredState::Stopped } else { DesiredState::Running }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SandboxRecord {
    pub id: String,
    pub image: String,
    pub tree_id: String,
    pub created_at: String,
    pub labels: BTreeMap<String, String>,
    /// Limits as JSON (the runtime's `Limits` type).
    pub limits: serde_json::Value,
    /// Name of the writable subvolume under `sandboxes/`.
    pub subvol: String,
    pub base_checkpoint: Option<String>,
    /// btrfs transid of the base the subvolume was snapshotted from (0 for an image).
    pub base_transid: u64,
    pub state: DesiredState,
    pub status_reason: Option<String>,
    /// Read-only layers under `subvol`, top first (paths under the volume root).
    pub lowers: Vec<String>,
    /// Network mode and policy as JSON (the API's `NetworkSpec`; `{}`:
    /// its defaults).
    pub network: serde_json::Value,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointRecord {
    pub id: String,
    pub sandbox_id: String,
    pub tree_id: String,
    pub parent: Option<String>,
    pub image: String,
    pub label: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub created_at: String,
    /// btrfs transid in which the snapshot was created.
    pub transid: u64,
    pub size_bytes: Option<u64>,
    pub frozen_ms: f64,
    pub duration_ms: f64,
    /// What was captured of the processes (JSON; `Null`: nothing), written
    /// by the engine and read back as it is.
    pub processes: serde_json::Value,
    /// Its own read-only layer (path under the volume root).
    pub layer: String,
    /// The layers under it, top first.
    pub lowers: Vec<String>,
}

impl CheckpointRecord {
    /// Every layer of the checkpoint's files, top first (image excluded).
    pub fn stack(&self) -> Vec<String> {
        std::iter::once(self.layer.clone()).chain(self.lowers.iter().cloned()).collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ImageRecord {
    pub name: String,
    pub kind: String,
    pub source: Option<String>,
    pub created_at: String,
    /// Lower layers as JSON (the state store's layer list).
    pub layers: serde_json::Value,
    pub size_bytes: u64,
}

/// The metadata store. Cheap calls (tens of microseconds); safe to share.
pub struct Meta {
    path: PathBuf,
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS images (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    source TEXT,
    created_at TEXT NOT NULL,
    layers TEXT NOT NULL,
    size_bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    image TEXT NOT NULL,
    tree_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    labels TEXT NOT NULL,
    limits TEXT NOT NULL,
    subvol TEXT NOT NULL UNIQUE,
    base_checkpoint TEXT,
    base_transid INTEGER NOT NULL,
    state TEXT NOT NULL,
    status_reason TEXT,
    lowers TEXT NOT NULL DEFAULT '[]',
    network TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    tree_id TEXT NOT NULL,
    parent TEXT,
    image TEXT NOT NULL,
    label TEXT,
    labels TEXT NOT NULL,
    created_at TEXT NOT NULL,
    transid INTEGER NOT NULL,
    size_bytes INTEGER,
    frozen_ms REAL NOT NULL,
    duration_ms REAL NOT NULL,
    processes TEXT,
    layer TEXT,
    lowers TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS checkpoints_tree ON checkpoints(tree_id);
CREATE INDEX IF NOT EXISTS checkpoints_parent ON checkpoints(parent);
";

const SANDBOX_COLS: &str = "id, image, tree_id, created_at, labels, limits, subvol, base_checkpoint, base_transid, state, status_reason, lowers, network";
const CHECKPOINT_COLS: &str = "id, sandbox_id, tree_id, parent, image, label, labels, created_at, transid, size_bytes, frozen_ms, duration_ms, processes, layer, lowers";

fn labels_json(labels: &BTreeMap<String, String>) -> String {
    serde_json::to_string(labels).unwrap_or_else(|_| "{}".into())
}

/// `lowers` with the run `old` (two layers or more, contiguous) replaced by
/// `squashed`, if it holds that run.
pub fn squash_run(lowers: &[String], old: &[String], squashed: &str) -> Option<Vec<String>> {
    if old.len() < 2 {
        return None;
    }
    let at = lowers.windows(old.len()).position(|w| w == old)?;
    let mut v = lowers[..at].to_vec();
    v.push(squashed.to_string());
    v.extend_from_slice(&lowers[at + old.len()..]);
    Some(v)
}

/// `ALTER TABLE table ADD COLUMN column decl` unless it is there.
fn add_column(conn: &Connection, table: &str, column: &str, decl: &str) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
    let names = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
    if !names.iter().any(|n| n == column) {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

fn list_json(list: &[String]) -> String {
    serde_json::to_string(list).unwrap_or_else(|_| "[]".into())
}

fn parse_json<T: serde::de::DeserializeOwned>(field: &'static str, s: &str) -> Result<T> {
    serde_json::from_str(s).map_err(|source| Error::Json { field, source })
}

struct RawSandbox(SandboxRecord, String, String, String, String);

fn sandbox_from_row(row: &Row<'_>) -> rusqlite::Result<RawSandbox> {
    let labels: String = row.get(4)?;
    let limits: String = row.get(5)?;
    let state: String = row.get(9)?;
    Ok(RawSandbox(
        SandboxRecord {
            id: row.get(0)?,
            image: row.get(1)?,
            tree_id: row.get(2)?,
            created_at: row.get(3)?,
            labels: BTreeMap::new(),
            limits: serde_json::Value::Null,
            subvol: row.get(6)?,
            base_checkpoint: row.get(7)?,
            base_transid: row.get::<_, i64>(8)? as u64,
            state: DesiredState::parse(&state),
            status_reason: row.get(10)?,
            lowers: Vec::new(),
            network: serde_json::Value::Null,
        },
        labels,
        limits,
        row.get(11)?,
        row.get(12)?,
    ))
}

impl RawSandbox {
    fn finish(self) -> Result<SandboxRecord> {
        let RawSandbox(mut rec, labels, limits, lowers, network) = self;
        rec.network = parse_json("sandboxes.network", &network)?;
        rec.labels = parse_json("sandboxes.labels", &labels)?;
        rec.limits = parse_json("sandboxes.limits", &limits)?;
        rec.lowers = parse_json("sandboxes.lowers", &lowers)?;
        Ok(rec)
    }
}

struct RawCheckpoint(CheckpointRecord, String, Option<String>, Option<String>, String);

fn checkpoint_from_row(row: &Row<'_>) -> rusqlite::Result<RawCheckpoint> {
    let labels: String = row.get(6)?;
    Ok(RawCheckpoint(
        CheckpointRecord {
            id: row.get(0)?,
            sandbox_id: row.get(1)?,
            tree_id: row.get(2)?,
            parent: row.get(3)?,
            image: row.get(4)?,
            label: row.get(5)?,
            labels: BTreeMap::new(),
            created_at: row.get(7)?,
            transid: row.get::<_, i64>(8)? as u64,
            size_bytes: row.get::<_, Option<i64>>(9)?.map(|v| v as u64),
            frozen_ms: row.get(10)?,
            duration_ms: row.get(11)?,
            processes: serde_json::Value::Null,
            layer: String::new(),
            lowers: Vec::new(),
        },
        labels,
        row.get(12)?,
        row.get(13)?,
        row.get(14)?,
    ))
}

impl RawCheckpoint {
    fn finish(self) -> Result<CheckpointRecord> {
        let RawCheckpoint(mut rec, labels, processes, layer, lowers) = self;
        rec.labels = parse_json("checkpoints.labels", &labels)?;
        rec.layer = layer.unwrap_or_else(|| format!("checkpoints/{}", rec.id));
        rec.lowers = parse_json("checkpoints.lowers", &lowers)?;
        if let Some(p) = processes {
            rec.processes = parse_json("checkpoints.processes", &p)?;
        }
        Ok(rec)
    }
}

fn insert_sandbox_tx(tx: &Connection, s: &SandboxRecord) -> Result<()> {
    tx.execute(
        &format!(
            "INSERT INTO sandboxes ({SANDBOX_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
        ),
        params![
            s.id,
            s.image,
            s.tree_id,
            s.created_at,
            labels_json(&s.labels),
            s.limits.to_string(),
            s.subvol,
            s.base_checkpoint,
            s.base_transid as i64,
            s.state.as_str(),
            s.status_reason,
            list_json(&s.lowers),
            s.network.to_string(),
        ],
    )?;
    Ok(())
}

impl Meta {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Meta> {
        let open_err = |source| Error::Open { path: path.to_path_buf(), source };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(open_err)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(open_err)?;
        if version > SCHEMA_VERSION {
            return Err(Error::SchemaTooNew { path: path.to_path_buf(), found: version });
        }
        conn.execute_batch(SCHEMA).map_err(open_err)?;
        // Columns added since v1 (tables made by SCHEMA above have them).
        for (table, column, decl) in [
            ("checkpoints", "processes", "TEXT"),
            ("sandboxes", "lowers", "TEXT NOT NULL DEFAULT '[]'"),
            ("checkpoints", "layer", "TEXT"),
            ("checkpoints", "lowers", "TEXT NOT NULL DEFAULT '[]'"),
            ("checkpoints", "durable", "TEXT"),
            ("sandboxes", "network", "TEXT NOT NULL DEFAULT '{}'"),
        ] {
            add_column(&conn, table, column, decl).map_err(open_err)?;
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(open_err)?;
        Ok(Meta { path: path.to_path_buf(), conn: Mutex::new(conn) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent (each
        // statement is atomic), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Size of the database files (main + WAL) in bytes.
    pub fn size_bytes(&self) -> u64 {
        let mut total = 0;
        for suffix in ["", "-wal"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            total += std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        }
        total
    }

    /// Bytes of database pages in use (WAL included, free pages excluded):
    /// the logical size of the metadata, independent of WAL checkpointing.
    pub fn used_bytes(&self) -> Result<u64> {
        let conn = self.conn();
        let pragma = |name: &str| -> rusqlite::Result<i64> { conn.pragma_query_value(None, name, |r| r.get(0)) };
        let used = pragma("page_count")? - pragma("freelist_count")?;
        Ok((used * pragma("page_size")?) as u64)
    }

    // ---- images ----

    pub fn put_image(&self, img: &ImageRecord) -> Result<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO images (name, kind, source, created_at, layers, size_bytes) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![img.name, img.kind, img.source, img.created_at, img.layers.to_string(), img.size_bytes as i64],
        )?;
        Ok(())
    }

    pub fn image(&self, name: &str) -> Result<Option<ImageRecord>> {
        let conn = self.conn();
        let raw = conn
            .query_row(
                "SELECT name, kind, source, created_at, layers, size_bytes FROM images WHERE name = ?1",
                [name],
                image_from_row,
            )
            .optional()?;
        raw.map(RawImage::finish).transpose()
    }

    pub fn images(&self) -> Result<Vec<ImageRecord>> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT name, kind, source, created_at, layers, size_bytes FROM images ORDER BY name")?;
        let rows = stmt.query_map([], image_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter().map(RawImage::finish).collect()
    }

    pub fn delete_image(&self, name: &str) -> Result<bool> {
        Ok(self.conn().execute("DELETE FROM images WHERE name = ?1", [name])? > 0)
    }

    /// How many sandboxes and checkpoints use an image.
    pub fn image_users(&self, name: &str) -> Result<(u64, u64)> {
        let conn = self.conn();
        let sb: i64 = conn.query_row("SELECT COUNT(*) FROM sandboxes WHERE image = ?1", [name], |r| r.get(0))?;
        let ck: i64 = conn.query_row("SELECT COUNT(*) FROM checkpoints WHERE image = ?1", [name], |r| r.get(0))?;
        Ok((sb as u64, ck as u64))
    }

    // ---- sandboxes ----

    pub fn insert_sandbox(&self, s: &SandboxRecord) -> Result<()> {
        insert_sandbox_tx(&self.conn(), s)
    }

    /// Inserts several sandboxes in one transaction (a fork commits all its
    /// successful children at once).
    pub fn insert_sandboxes(&self, list: &[SandboxRecord]) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for s in list {
            insert_sandbox_tx(&tx, s)?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn sandbox(&self, id: &str) -> Result<Option<SandboxRecord>> {
        let conn = self.conn();
        let raw = conn
            .prepare_cached(&format!("SELECT {SANDBOX_COLS} FROM sandboxes WHERE id = ?1"))?
            .query_row([id], sandbox_from_row)
            .optional()?;
        raw.map(RawSandbox::finish).transpose()
    }

    pub fn sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!("SELECT {SANDBOX_COLS} FROM sandboxes ORDER BY created_at, id"))?;
        let rows = stmt.query_map([], sandbox_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter().map(RawSandbox::finish).collect()
    }

    /// Points a sandbox at a new writable subvolume over `lowers` (the
    /// commit point of a rollback).
    pub fn set_sandbox_subvol(
        &self,
        id: &str,
        subvol: &str,
        lowers: &[String],
        base_checkpoint: Option<&str>,
        base_transid: u64,
    ) -> Result<()> {
        self.conn()
            .prepare_cached(
                "UPDATE sandboxes SET subvol = ?2, base_checkpoint = ?3, base_transid = ?4, lowers = ?5 WHERE id = ?1",
            )?
            .execute(params![id, subvol, base_checkpoint, base_transid as i64, list_json(lowers)])?;
        Ok(())
    }

    pub fn set_sandbox_state(&self, id: &str, state: DesiredState, reason: Option<&str>) -> Result<()> {
        self.conn().execute(
            "UPDATE sandboxes SET state = ?2, status_reason = ?3 WHERE id = ?1",
            params![id, state.as_str(), reason],
        )?;
        Ok(())
    }

    /// Replaces a sandbox's network (mode and policy, as JSON).
    pub fn set_sandbox_network(&self, id: &str, network: &serde_json::Value) -> Result<()> {
        self.conn().execute("UPDATE sandboxes SET network = ?2 WHERE id = ?1", params![id, network.to_string()])?;
        Ok(())
    }

    pub fn delete_sandbox(&self, id: &str) -> Result<bool> {
        Ok(self.conn().execute("DELETE FROM sandboxes WHERE id = ?1", [id])? > 0)
    }

    // ---- checkpoints ----

    /// Commits a checkpoint; with `rebase`, that sandbox now derives from it
    /// (same transaction: its next checkpoint will name this one as parent),
    /// and with `switch`, it writes from now on to a new subvolume over
    /// these lowers (the checkpoint took its old one as its layer).
    pub fn insert_checkpoint(
        &self,
        c: &CheckpointRecord,
        rebase: Option<&str>,
        switch: Option<(&str, &[String])>,
    ) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.prepare_cached(&format!(
            "INSERT INTO checkpoints ({CHECKPOINT_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
        ))?
        .execute(params![
                c.id,
                c.sandbox_id,
                c.tree_id,
                c.parent,
                c.image,
                c.label,
                labels_json(&c.labels),
                c.created_at,
                c.transid as i64,
                c.size_bytes.map(|v| v as i64),
                c.frozen_ms,
                c.duration_ms,
                (!c.processes.is_null()).then(|| c.processes.to_string()),
                c.layer,
                list_json(&c.lowers),
            ],
        )?;
        if let Some(sandbox) = rebase {
            tx.prepare_cached("UPDATE sandboxes SET base_checkpoint = ?2, base_transid = ?3 WHERE id = ?1")?
                .execute(params![sandbox, c.id, c.transid as i64])?;
            if let Some((subvol, lowers)) = switch {
                tx.prepare_cached("UPDATE sandboxes SET subvol = ?2, lowers = ?3, base_transid = 0 WHERE id = ?1")?
                    .execute(params![sandbox, subvol, list_json(lowers)])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn checkpoint(&self, id: &str) -> Result<Option<CheckpointRecord>> {
        let conn = self.conn();
        let raw = conn
            .prepare_cached(&format!("SELECT {CHECKPOINT_COLS} FROM checkpoints WHERE id = ?1"))?
            .query_row([id], checkpoint_from_row)
            .optional()?;
        raw.map(RawCheckpoint::finish).transpose()
    }

    /// Checkpoints, all or of one tree, oldest first (so parents precede children).
    pub fn checkpoints(&self, tree_id: Option<&str>) -> Result<Vec<CheckpointRecord>> {
        let conn = self.conn();
        let rows = match tree_id {
            Some(t) => {
                let mut stmt = conn
                    .prepare(&format!("SELECT {CHECKPOINT_COLS} FROM checkpoints WHERE tree_id = ?1 ORDER BY rowid"))?;
                stmt.query_map([t], checkpoint_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?
            }
            None => {
                let mut stmt = conn.prepare(&format!("SELECT {CHECKPOINT_COLS} FROM checkpoints ORDER BY rowid"))?;
                stmt.query_map([], checkpoint_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?
            }
        };
        rows.into_iter().map(RawCheckpoint::finish).collect()
    }

    pub fn set_checkpoint_size(&self, id: &str, size: u64) -> Result<()> {
        self.conn().execute("UPDATE checkpoints SET size_bytes = ?2 WHERE id = ?1", params![id, size as i64])?;
        Ok(())
    }

    /// What depends on a checkpoint: child checkpoints and sandboxes based on it.
    /// Store what is known of checkpoint `id`'s durable process image
    /// (JSON, as the runtime writes it). False if there is no such row.
    pub fn set_checkpoint_durable(&self, id: &str, durable: &serde_json::Value) -> Result<bool> {
        let n = self
            .conn()
            .prepare_cached("UPDATE checkpoints SET durable = ?2 WHERE id = ?1")?
            .execute(params![id, durable.to_string()])?;
        Ok(n > 0)
    }

    /// What is known of checkpoint `id`'s durable process image (`Null`:
    /// nothing).
    pub fn checkpoint_durable(&self, id: &str) -> Result<serde_json::Value> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT durable FROM checkpoints WHERE id = ?1")?;
        let text: Option<Option<String>> = stmt.query_row(params![id], |r| r.get(0)).optional()?;
        Ok(text
            .flatten()
            .map_or(serde_json::Value::Null, |t| parse_json("checkpoints.durable", &t).unwrap_or_default()))
    }

    /// Every checkpoint with what is known of its durable image.
    pub fn checkpoint_durables(&self) -> Result<Vec<(String, serde_json::Value)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT id, durable FROM checkpoints")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, text) = row?;
            let v = text.map_or(serde_json::Value::Null, |t| parse_json("checkpoints.durable", &t).unwrap_or_default());
            out.push((id, v));
        }
        Ok(out)
    }

    pub fn checkpoint_dependents(&self, id: &str) -> Result<(Vec<String>, Vec<String>)> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT id FROM checkpoints WHERE parent = ?1 ORDER BY rowid")?;
        let children = stmt.query_map([id], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
        let mut stmt = conn.prepare("SELECT id FROM sandboxes WHERE base_checkpoint = ?1 ORDER BY id")?;
        let sandboxes = stmt.query_map([id], |r| r.get(0))?.collect::<rusqlite::Result<Vec<String>>>()?;
        Ok((children, sandboxes))
    }

    /// Deletes a checkpoint row; its children and dependent sandboxes are
    /// re-linked to its parent in the same transaction.
    pub fn delete_checkpoint(&self, id: &str) -> Result<bool> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let parent: Option<Option<String>> =
            tx.query_row("SELECT parent FROM checkpoints WHERE id = ?1", [id], |r| r.get(0)).optional()?;
        let Some(parent) = parent else {
            return Ok(false);
        };
        tx.execute("UPDATE checkpoints SET parent = ?2 WHERE parent = ?1", params![id, parent])?;
        tx.execute("UPDATE sandboxes SET base_checkpoint = ?2 WHERE base_checkpoint = ?1", params![id, parent])?;
        tx.execute("DELETE FROM checkpoints WHERE id = ?1", [id])?;
        tx.commit()?;
        Ok(true)
    }

    /// Every layer some row names, as paths under the volume root
    /// (sandboxes' writable subvolumes as `sandboxes/<subvol>`). Reads only
    /// the layer columns.
    pub fn layers_in_use(&self) -> Result<std::collections::HashSet<String>> {
        let conn = self.conn();
        let mut used = std::collections::HashSet::new();
        let mut stmt = conn.prepare("SELECT subvol, lowers FROM sandboxes")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        for row in rows {
            let (subvol, lowers) = row?;
            used.insert(format!("sandboxes/{subvol}"));
            used.extend(parse_json::<Vec<String>>("sandboxes.lowers", &lowers)?);
        }
        let mut stmt = conn.prepare("SELECT id, layer, lowers FROM checkpoints")?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?, r.get::<_, String>(2)?)))?;
        for row in rows {
            let (id, layer, lowers) = row?;
            used.insert(layer.unwrap_or_else(|| format!("checkpoints/{id}")));
            used.extend(parse_json::<Vec<String>>("checkpoints.lowers", &lowers)?);
        }
        Ok(used)
    }

    /// Replaces the run `old` (top first) in every checkpoint's lowers by
    /// the single layer `squashed`, which shows the same files at that place
    /// of the stack (one transaction). Sandbox rows keep naming what their
    /// overlays are mounted on. Returns how many rows changed.
    pub fn squash_lowers(&self, old: &[String], squashed: &str) -> Result<usize> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut changed = 0;
        let rows: Vec<(String, String)> = {
            let mut stmt = tx.prepare("SELECT id, lowers FROM checkpoints")?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?
        };
        for (id, lowers) in rows {
            let lowers: Vec<String> = parse_json("checkpoints.lowers", &lowers)?;
            if let Some(new) = squash_run(&lowers, old, squashed) {
                tx.execute("UPDATE checkpoints SET lowers = ?2 WHERE id = ?1", params![id, list_json(&new)])?;
                changed += 1;
            }
        }
        tx.commit()?;
        Ok(changed)
    }

    pub fn counts(&self) -> Result<(u64, u64, u64)> {
        let conn = self.conn();
        let count = |table: &str| -> rusqlite::Result<u64> {
            conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get::<_, i64>(0)).map(|v| v as u64)
        };
        Ok((count("sandboxes")?, count("checkpoints")?, count("images")?))
    }
}

struct RawImage(ImageRecord, String);

fn image_from_row(row: &Row<'_>) -> rusqlite::Result<RawImage> {
    let layers: String = row.get(4)?;
    Ok(RawImage(
        ImageRecord {
            name: row.get(0)?,
            kind: row.get(1)?,
            source: row.get(2)?,
            created_at: row.get(3)?,
            layers: serde_json::Value::Null,
            size_bytes: row.get::<_, i64>(5)? as u64,
        },
        layers,
    ))
}

impl RawImage {
    fn finish(self) -> Result<ImageRecord> {
        let RawImage(mut rec, layers) = self;
        rec.layers = parse_json("images.layers", &layers)?;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests;
