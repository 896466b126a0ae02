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

use sandtree_api::{ImageState, ProcessImageInfo};
use sandtree_proc::durable;

use crate::engine::Engine;
use crate::error::{Error, Result};

impl Engine {
    /// Where the process images live.
    pub fn process_images_dir(&self) -> PathBuf {
        self.volume.process_images_dir()
    }

    /// Write the image of checkpoint `ck` of sandbox `id` (whose parent
    /// checkpoint is `parent`) in the background. The receiver fires once
    /// it is written or failed.
    pub(crate) fn write_image_later(
        &self,
        id: &str,
        ck: &str,
        parent: Option<String>,
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
        self.spawn_settled(async move {
            let _turn = gate.lock().await;
            let outcome = engine.write_image(&id, &ck, parent).await;
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
    ) -> std::result::Result<durable::WriteReport, String> {
        let tracer = self.tracer_get(id).ok_or("the sandbox stopped before its image was written")?;
        let (ck2, parent2) = (ck.to_string(), parent.clone());
        let sources = tokio::task::spawn_blocking(move || tracer.durable_sources(&ck2, parent2.as_deref()))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("its templates: {e}"))?;
        let dir = self.process_images_dir();
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            // (A background writer: below the sandbox's work on the CPU.)
            let _ = sandtree_sys::process::set_policy(0, sandtree_sys::process::Policy::Idle);
            let r = durable::write_image(&sources, &dir, parent.as_deref()).map_err(|e| e.to_string());
            let _ = sandtree_sys::process::set_policy(0, sandtree_sys::process::Policy::Normal);
            r
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Wait until no image of sandbox `id` is being written (an eviction
    /// must not take the templates an image is read from).
    pub(crate) async fn images_written(&self, id: &str) {
        let gate = self.image_writes.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        if let Some(gate) = gate {
            drop(gate.lock().await);
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
        let rows = match self.meta.checkpoint_durables() {
            Ok(rows) => rows,
            Err(e) => return tracing::warn!("cannot list checkpoints' images: {e}"),
        };
        let dir = self.process_images_dir();
        let mut needed: HashSet<String> = HashSet::new();
        for (id, v) in &rows {
            if v.is_null() {
                continue;
            }
            needed.insert(id.clone());
            if let Ok(image) = durable::Image::open(&durable::image_path(&dir, id)) {
                needed.extend(image.tree().sources.iter().cloned());
            }
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // (A `.part` is an image being written: removed at start only.)
            let Some(ck) = name.strip_suffix(".img") else { continue };
            if !needed.contains(ck) {
                tracing::debug!(checkpoint = ck, "process image deleted");
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

fn info(state: ImageState) -> ProcessImageInfo {
    ProcessImageInfo { state, bytes: None, pages: None, pages_written: None, write_ms: None, error: None }
}
