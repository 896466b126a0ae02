//! What the door keeps of each sandbox, on disk, so that a daemon restart
//! (clean, or a SIGKILL) loses none of it: the template it was made from,
//! its start, the end its timeout sets (and the timeout, and whether it
//! pauses rather than ends, and resumes at its first request), the
//! environment of its commands, the checkpoint a pause took (the resume
//! rolls back to it), and the `Idempotency-Key` that made it.
//!
//! One JSON file per sandbox, `<data-dir>/e2b/<sandbox id>.json`:
//!
//! ```text
//! {"version": 1, "template": "base", "started_ms": 1765148400000,
//!  "end_ms": 1765148700000, "envs": {"K": "v"}, "paused": "ck-…",
//!  "idempotency_key": null, "auto_pause": false, "auto_resume": false,
//!  "timeout_s": 300}
//! ```
//!
//! Times are milliseconds since the Unix epoch. A file is replaced whole
//! (written beside it, then renamed over it) whenever what it holds
//! changes; it is removed with its sandbox. When the door starts, it reads
//! them all back ([`super::E2b::open`]): a sandbox whose end has passed
//! meanwhile is deleted, as its timeout would have deleted it; the others'
//! timeouts are armed again for the time they had left; the files of
//! sandboxes that no longer exist are removed. A file that cannot be read
//! is set aside as `<id>.json.unreadable` with a warning, never fatal.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The format's version; a newer one is set aside, not misread.
const VERSION: u32 = 1;

/// A sandbox's door state as saved (the live one is `super::SandboxMeta`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SavedMeta {
    pub version: u32,
    pub template: Option<String>,
    pub started_ms: Option<u64>,
    pub end_ms: Option<u64>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    pub paused: Option<String>,
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub auto_pause: bool,
    #[serde(default)]
    pub auto_resume: bool,
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

pub(crate) fn to_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The directory of the saved states.
pub(crate) struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: PathBuf) -> StateDir {
        StateDir { dir }
    }

    /// The file of sandbox `id` (ids are the engine's: `[A-Za-z0-9_-]`).
    fn file(&self, id: &str) -> Option<PathBuf> {
        let plain = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        plain.then(|| self.dir.join(format!("{id}.json")))
    }

    /// Saves `meta` of sandbox `id`, replacing what was saved.
    pub fn save(&self, id: &str, meta: &SavedMeta) -> std::io::Result<()> {
        let Some(path) = self.file(id) else {
            return Err(std::io::Error::other(format!("{id:?} is not a sandbox id")));
        };
        std::fs::create_dir_all(&self.dir)?;
        let tmp = path.with_extension("json.new");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(meta).map_err(std::io::Error::other)?)?;
        drop(f);
        std::fs::rename(&tmp, &path)
    }

    pub fn remove(&self, id: &str) {
        if let Some(path) = self.file(id) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Every saved state, by sandbox id.
    pub fn load_all(&self) -> Vec<(String, SavedMeta)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(id) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if self.file(id).is_none() {
                continue;
            }
            let read = std::fs::read(&path).map_err(|e| e.to_string()).and_then(|bytes| {
                let meta: SavedMeta = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
                match meta.version {
                    VERSION => Ok(meta),
                    v => Err(format!("format version {v}, this daemon reads {VERSION}")),
                }
            });
            match read {
                Ok(meta) => out.push((id.to_string(), meta)),
                Err(e) => {
                    let aside = path.with_extension("json.unreadable");
                    tracing::warn!(sandbox = id, file = %path.display(), "the E2B door's state of the sandbox cannot be read ({e}): set aside as {}", aside.display());
                    let _ = std::fs::rename(&path, aside);
                }
            }
        }
        out
    }
}

impl SavedMeta {
    pub fn new() -> SavedMeta {
        SavedMeta { version: VERSION, ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_saved_read_back_and_bad_files_set_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path().join("e2b"));
        let meta = SavedMeta {
            template: Some("base".into()),
            started_ms: Some(1),
            end_ms: Some(2),
            envs: [("K".to_string(), "v".to_string())].into(),
            paused: Some("ck-1".into()),
            ..SavedMeta::new()
        };
        dir.save("sb-1", &meta).unwrap();
        dir.save("sb-2", &SavedMeta::new()).unwrap();
        assert!(dir.save("../x", &meta).is_err());
        std::fs::write(tmp.path().join("e2b/sb-3.json"), b"{not json").unwrap();
        std::fs::write(tmp.path().join("e2b/sb-4.json"), br#"{"version": 99}"#).unwrap();
        let mut all = dir.load_all();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(all, vec![("sb-1".to_string(), meta), ("sb-2".to_string(), SavedMeta::new())]);
        assert!(tmp.path().join("e2b/sb-3.json.unreadable").exists());
        assert!(tmp.path().join("e2b/sb-4.json.unreadable").exists());
        dir.remove("sb-1");
        assert_eq!(dir.load_all().len(), 1);
    }
}
