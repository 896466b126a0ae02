//! Durable process images of checkpoints (`sandtree_proc::durable`): each
//! checkpoint with processes gets its image written after it answered, in
//! the agent's think time, one sandbox's images one after the other (each
//! compared against its parent's: only changed pages are stored). The
//! checkpoint's row says where its image stands (`durable` column: the
//! API's `process_image`); a checkpoint asked with `wait_durable` answers
//! once it is written. Images no checkpoint needs any more (neither its
//! own nor a source of another's) are deleted by [`Engine::prune_images_later`].

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandtree_api::{ImageState, ProcessImageInfo};
use sandtree_proc::durable;

use crate::engine::Engine;
use crate::error::{Error, Result};

/// How long the engine must have been idle before an image is written
/// (as for an eviction: `sandbox_checkpoint.rs`).
const IDLE: Duration = Duration::from_millis(50);

/// How long a delete or a stop of a sandbox waits for its images.
pub(crate) const IMAGES_BEFORE_STOP: Duration = Duration::from_secs(30);

/// How long an image waits for the pool to finish its templates.
const SOURCES_WAIT: Duration = Duration::from_secs(60);

impl Engine {
    /// Where the process images live.
    pub fn process_images_dir(&self) -> PathBuf {
        self.volume.process_images_dir()
    }

    /// Write the image of checkpoint `ck` of sandbox `id` (whose parent
    /// checkpoint is `parent`) in the background: once the engine has been
    /// idle for a moment (the agent thinks), or at once when `urgent` (a
    /// caller waits for it). The receiver fires once it is written or
    /// failed.
    pub(crate) fn write_image_later(
        &self,
        id: &str,
        ck: &str,
        parent: Option<String>,
        urgent: bool,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.cfg.durable_images {
            return rx;
        }
        let Some(engine) = self.this.upgrade() else { return rx };
        let writing = serde_json::to_value(info(ImageState::Writing)).unwrap_or_default();
        if let Err(e) = self.meta.set_checkpoint_durable(ck, &writing) {
            tracing::warn!(checkpoint = ck, "cannot record its image: {e}");
            return rx;
        }
        let gate = self
            .image_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        let (id, ck) = (id.to_string(), ck.to_string());
        self.images_pending.lock().unwrap_or_else(|p| p.into_inner()).insert(ck.clone(), parent.clone());
        self.spawn_settled(async move {
            let _turn = gate.lock().await;
            let outcome = engine.write_image(&id, &ck, parent, urgent).await;
            let done = match outcome {
                Ok(r) => {
                    tracing::debug!(
                        checkpoint = ck,
                        bytes = r.bytes,
                        pages = r.pages,
                        written = r.pages_written,
                        same_frame = r.pages_same_frame,
                        unchanged = r.pages_unchanged,
                        from_parent = r.pages_from_parent,
                        took_ms = r.took_ms,
                        "process image written"
                    );
                    ProcessImageInfo {
                        bytes: Some(r.bytes),
                        pages: Some(r.pages),
                        pages_written: Some(r.pages_written),
                        write_ms: Some(r.took_ms),
                        ..info(ImageState::Durable)
                    }
                }
                Err(e) => {
                    tracing::warn!(checkpoint = ck, "process image not written: {e}");
                    ProcessImageInfo { error: Some(e), ..info(ImageState::Failed) }
                }
            };
            let _ = engine.meta.set_checkpoint_durable(&ck, &serde_json::to_value(done).unwrap_or_default());
            engine.images_pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&ck);
            // (An eviction kept its templates meanwhile: now they may go.)
            if engine.tracer_get(&id).is_some() {
                engine.evict_templates_later(&id);
            }
            let _ = tx.send(());
        });
        rx
    }

    /// Write the image of `ck` now (see [`Engine::write_image_later`]).
    async fn write_image(
        &self,
        id: &str,
        ck: &str,
        parent: Option<String>,
        urgent: bool,
    ) -> std::result::Result<durable::WriteReport, String> {
        let tracer = self.tracer_get(id).ok_or("the sandbox stopped before its image was written")?;
        let deadline = Instant::now() + SOURCES_WAIT;
        let sources = loop {
            // In the agent's think time: not beside its next steps.
            while !urgent && self.flusher.idle_for() < IDLE && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (t, ck2, parent2) = (tracer.clone(), ck.to_string(), parent.clone());
            match tokio::task::spawn_blocking(move || t.durable_sources(&ck2, parent2.as_deref()))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("its templates: {e}"))?
            {
                Some(s) => break s,
                None if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(10)).await,
                None => return Err(format!("its templates were not finished within {SOURCES_WAIT:?}")),
            }
        };
        let dir = self.process_images_dir();
        let flusher = self.flusher.clone();
        let mut sources = sources;
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            // (A background writer: below the sandbox's work on the CPU; the
            // pool's thread gets its policy back even if this panics.)
            struct Policy;
            impl Drop for Policy {
                fn drop(&mut self) {
                    let _ = sandtree_sys::process::set_policy(0, sandtree_sys::process::Policy::Normal);
                }
            }
            let _ = sandtree_sys::process::set_policy(0, sandtree_sys::process::Policy::Idle);
            let _normal = Policy;
            // While a checkpoint or rollback runs, the writer waits (it
            // would compete with it for the CPUs and the memory bus).
            let pause = || {
                while flusher.idle_for() < Duration::from_millis(2) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            };
            tracer.complete_fork_states(&mut sources, &pause).map_err(|e| format!("its templates: {e}"))?;
            durable::write_image(&sources, &dir, parent.as_deref(), &pause).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Checkpoints whose image is still to be written (their templates
    /// are read for it: not to be evicted).
    pub(crate) fn images_pending(&self) -> Vec<String> {
        self.images_pending.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    /// Waits, up to `limit`, for the images still being written of the
    /// checkpoints of sandbox `id` (of every sandbox with `None`): a
    /// sandbox about to stop (delete, stop, the daemon's exit) would take
    /// with it the templates they are read from, and a checkpoint taken
    /// just before would lose its processes for good.
    pub(crate) async fn settle_images_of(&self, id: Option<&str>, limit: Duration) {
        let pending: Vec<String> = self
            .images_pending()
            .into_iter()
            .filter(|ck| id.is_none_or(|id| self.checkpoint_record(ck).is_ok_and(|c| c.sandbox_id == id)))
            .collect();
        if pending.is_empty() {
            return;
        }
        let t0 = Instant::now();
        let settled = tokio::time::timeout(limit, async {
            for ck in &pending {
                self.image_settled(ck).await;
            }
        })
        .await;
        match settled {
            Ok(()) => tracing::debug!(sandbox = ?id, images = pending.len(), took = ?t0.elapsed(), "images settled"),
            Err(_) => tracing::warn!(sandbox = ?id, ?pending, "images still being written after {limit:?}"),
        }
    }

    /// What is known of `ck`'s image once it is no longer being written.
    pub(crate) async fn image_settled(&self, ck: &str) -> ProcessImageInfo {
        loop {
            match self.process_image_info(ck) {
                Some(i) if i.state != ImageState::Writing => return i,
                None => {
                    return ProcessImageInfo { error: Some("no image is written".into()), ..info(ImageState::Failed) };
                }
                Some(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    }

    /// What the API shows of checkpoint `ck`'s image.
    pub(crate) fn process_image_info(&self, ck: &str) -> Option<ProcessImageInfo> {
        let v = self.meta.checkpoint_durable(ck).ok()?;
        serde_json::from_value(v).ok()
    }

    /// The image of checkpoint `ck`, opened and checked, summed up.
    pub async fn inspect_image(&self, ck: &str) -> Result<durable::ImageSummary> {
        let rec = self.checkpoint_record(ck)?;
        let path = durable::image_path(&self.process_images_dir(), &rec.id);
        if !path.exists() {
            let why = match self.process_image_info(ck) {
                Some(i) if i.state == ImageState::Writing => "it is being written".to_string(),
                Some(i) => i.error.unwrap_or_else(|| "it was deleted".into()),
                None => "it has none (no processes captured, or taken before images were written)".into(),
            };
            return Err(Error::InvalidArgument(format!("checkpoint {ck} has no process image: {why}")));
        }
        let summary = tokio::task::spawn_blocking(move || durable::Image::open(&path).map(|i| i.summary()))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(|e| Error::Internal(e.to_string()))?;
        Ok(summary)
    }

    /// At start: images a stopped daemon was writing are failed (their
    /// checkpoints say so) and their partial files go.
    pub(crate) fn settle_images_at_start(&self) -> Result<()> {
        for (id, v) in self.meta.checkpoint_durables()? {
            if v.get("state").and_then(|s| s.as_str()) == Some("writing") {
                let failed = ProcessImageInfo {
                    error: Some("the daemon stopped while it was being written".into()),
                    ..info(ImageState::Failed)
                };
                self.meta.set_checkpoint_durable(&id, &serde_json::to_value(failed).unwrap_or_default())?;
            }
        }
        if let Ok(entries) = std::fs::read_dir(self.process_images_dir()) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().ends_with(".img.part") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(())
    }

    /// Delete, in the background, the images no checkpoint needs: neither
    /// a checkpoint's own nor a source of another's.
    pub(crate) fn prune_images_later(&self) {
        let Some(engine) = self.this.upgrade() else { return };
        self.spawn_settled(async move {
            let _ = tokio::task::spawn_blocking(move || engine.prune_images()).await;
        });
    }

    fn prune_images(&self) {
        let dir = self.process_images_dir();
        // Listed before the rows are read: an image renamed into place after
        // this is not in the list, and one listed has its row (marked
        // `writing` before its file exists) among the rows read after.
        let Ok(entries) = std::fs::read_dir(&dir) else { return };
        let listed: Vec<(String, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                // (A `.part` is an image being written: removed at start only.)
                Some((name.strip_suffix(".img")?.to_string(), e.path()))
            })
            .collect();
        let rows = match self.meta.checkpoint_durables() {
            Ok(rows) => rows,
            Err(e) => return tracing::warn!("cannot list checkpoints' images: {e}"),
        };
        let mut needed: HashSet<String> = HashSet::new();
        for (id, v) in &rows {
            if !v.is_null() {
                needed.insert(id.clone());
            }
        }
        // Images being written, and what they compare against and point into.
        for (ck, parent) in self.images_pending.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            needed.insert(ck.clone());
            needed.extend(parent.iter().cloned());
        }
        for id in needed.clone() {
            match durable::Image::sources_of(&durable::image_path(&dir, &id)) {
                Ok(sources) => needed.extend(sources),
                Err(durable::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e @ durable::Error::Io { .. }) => {
                    // (Which images it reads from is unknown: delete none.)
                    return tracing::warn!("images not pruned: {e}");
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        for (ck, path) in listed {
            if !needed.contains(&ck) {
                tracing::debug!(checkpoint = ck, "process image deleted");
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn info(state: ImageState) -> ProcessImageInfo {
    ProcessImageInfo { state, bytes: None, pages: None, pages_written: None, write_ms: None, error: None }
}
