//! Images: the embedded default, imports from a directory or tarball, removal.

use std::path::PathBuf;

use sandtree_api::{ImageInfo, ImageList, ImportEvent, ImportImageRequest};
use sandtree_meta::ImageRecord;
use tokio::sync::mpsc;

use crate::layers::store_layers;
use crate::{Engine, Error, Result, util};

fn valid_image_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

fn image_info(r: &ImageRecord) -> ImageInfo {
    ImageInfo {
        name: r.name.clone(),
        kind: r.kind.clone(),
        source: r.source.clone(),
        created_at: r.created_at.clone(),
        size_bytes: r.size_bytes,
    }
}

impl Engine {
    /// Builds the embedded default image on first start (host userland, no download).
    pub(crate) async fn ensure_default_image(&self) -> Result<()> {
        let name = sandtree_fs::DEFAULT_IMAGE;
        let path = self.volume.images_dir().join(name);
        if self.meta.image(name)?.is_some() && path.exists() {
            return Ok(());
        }
        let uid_base = self.cfg.uid_base;
        let images_dir = self.volume.images_dir();
        let layers = tokio::task::spawn_blocking(move || {
            sandtree_fs::delete_subvolume(&path)?;
            sandtree_fs::build_default_image(&path, uid_base, &|_| {})
        })
        .await?
        .map_err(|e| Error::fs("build default image", e))?;
        let stored = store_layers(&layers, &images_dir);
        self.forget_image_layers(name);
        self.meta.put_image(&ImageRecord {
            name: name.into(),
            kind: "default".into(),
            source: Some("host /usr + generated /etc".into()),
            created_at: util::now_rfc3339(),
            layers: serde_json::to_value(stored).map_err(|e| Error::Internal(e.to_string()))?,
            size_bytes: 0,
        })?;
        Ok(())
    }

    pub async fn images(&self) -> Result<ImageList> {
        Ok(ImageList { images: self.meta.images()?.iter().map(image_info).collect() })
    }

    /// Imports a rootfs; progress goes to `progress` as it happens.
    pub async fn import_image(
        &self,
        req: ImportImageRequest,
        progress: mpsc::Sender<ImportEvent>,
    ) -> Result<ImageInfo> {
        if !valid_image_name(&req.name) {
            return Err(Error::InvalidArgument(format!(
                "image name {:?} is invalid: use 1-64 characters of a-z, 0-9, '.', '_', '-'",
                req.name
            )));
        }
        let source = PathBuf::from(&req.source);
        if !source.is_absolute() {
            return Err(Error::InvalidArgument(format!(
                "source {:?} must be an absolute path on the daemon's host",
                req.source
            )));
        }
        let meta = std::fs::metadata(&source)
            .map_err(|e| Error::InvalidArgument(format!("source {}: {e}", source.display())))?;
        if self.meta.image(&req.name)?.is_some() {
            return Err(Error::AlreadyExists(format!("image {}", req.name)));
        }
        let _store = self.store_lock.read().await;
        let dst = self.volume.images_dir().join(&req.name);
        if dst.exists() {
            return Err(Error::AlreadyExists(format!("image {} (being imported)", req.name)));
        }
        let uid_base = self.cfg.uid_base;
        let is_dir = meta.is_dir();
        let (src2, dst2) = (source.clone(), dst.clone());
        let layers = tokio::task::spawn_blocking(move || {
            let report = |p: sandtree_fs::Progress| {
                let _ = progress.try_send(ImportEvent::Progress {
                    phase: p.phase.to_string(),
                    done_bytes: p.done_bytes,
                    total_bytes: p.total_bytes,
                    files: p.files,
                });
            };
            if is_dir {
                sandtree_fs::import_dir(&src2, &dst2, uid_base, &report)
            } else {
                sandtree_fs::import_tar(&src2, &dst2, uid_base, &report)
            }
        })
        .await?
        .map_err(|e| Error::fs("import image", e))?;
        let size_bytes = tokio::task::block_in_place(|| sandtree_fs::dir_size(&dst)).unwrap_or(0);
        let rec = ImageRecord {
            name: req.name.clone(),
            kind: "imported".into(),
            source: Some(source.display().to_string()),
            created_at: util::now_rfc3339(),
            layers: serde_json::to_value(store_layers(&layers, &self.volume.images_dir()))
                .map_err(|e| Error::Internal(e.to_string()))?,
            size_bytes,
        };
        self.forget_image_layers(&rec.name);
        if let Err(e) = self.meta.put_image(&rec) {
            let _ = tokio::task::block_in_place(|| sandtree_fs::delete_subvolume(&dst));
            return Err(e.into());
        }
        Ok(image_info(&rec))
    }

    pub async fn delete_image(&self, name: &str) -> Result<()> {
        if name == sandtree_fs::DEFAULT_IMAGE {
            return Err(Error::InvalidArgument("the default image is built in and cannot be removed".into()));
        }
        if !valid_image_name(name) || self.meta.image(name)?.is_none() {
            return Err(Error::ImageNotFound(name.to_string()));
        }
        let _store = self.store_lock.read().await;
        let (sandboxes, checkpoints) = self.meta.image_users(name)?;
        if sandboxes > 0 || checkpoints > 0 {
            return Err(Error::ImageInUse { image: name.to_string(), sandboxes, checkpoints });
        }
        self.meta.delete_image(name)?;
        self.forget_image_layers(name);
        let path = self.volume.images_dir().join(name);
        tokio::task::block_in_place(|| sandtree_fs::remove_image(&path)).map_err(|e| Error::fs("delete image", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::valid_image_name;

    #[test]
    fn image_names_reject_paths_and_uppercase() {
        assert!(valid_image_name("alpine-3.20"));
        assert!(!valid_image_name("../etc"));
        assert!(!valid_image_name("a/b"));
        assert!(!valid_image_name("Alpine"));
        assert!(!valid_image_name(""));
        assert!(!valid_image_name(".hidden"));
    }
}
