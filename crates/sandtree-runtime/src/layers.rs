//! How an image's lower layers are stored in metadata and turned into the
//! overlay mounts of a sandbox.
//!
//! A sandbox's writable subvolume holds one upper/work pair per layer:
//!
//! ```text
//! sandboxes/<sandbox-id>/<gen>/         btrfs subvolume
//!   layers/0/upper   layers/0/work       overlay for "/"    over the image rootfs
//!   layers/1/upper   layers/1/work       overlay for "/usr" over host /usr (idmapped)
//! ```
//!
//! Under that writable subvolume lie the sandbox's read-only layers (earlier
//! writable subvolumes frozen by checkpoints, or checkpoint snapshots), each
//! of the same shape: overlay `i` stacks `<layer>/layers/<i>/upper` of each,
//! top first, over the image's lower directory.

use std::path::{Path, PathBuf};

use sandtree_fs::{LowerLayer, LowerSource};
use sandtree_sandbox::{LowerDir, OverlayLayer};
use serde::{Deserialize, Serialize};

/// A lower layer as kept in the `images.layers` JSON column.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLayer {
    /// Mount point inside the sandbox ("/" first).
    pub target: String,
    /// `image`: a subvolume under `images/` named `path`; `host`: a host directory.
    pub kind: String,
    pub path: String,
}

/// Converts the state store's layer list into its stored form; image
/// subvolumes are kept by name so the volume may move.
pub fn store_layers(layers: &[LowerLayer], images_dir: &Path) -> Vec<StoredLayer> {
    layers
        .iter()
        .map(|l| {
            let (kind, path) = match &l.source {
                LowerSource::Subvolume(p) => {
                    ("image", p.strip_prefix(images_dir).unwrap_or(p).to_string_lossy().into_owned())
                }
                LowerSource::HostDir(p) => ("host", p.to_string_lossy().into_owned()),
            };
            StoredLayer { target: l.target.to_string_lossy().into_owned(), kind: kind.into(), path }
        })
        .collect()
}

/// The overlay mounts of a sandbox whose writable subvolume is `subvol`,
/// over the read-only layer subvolumes `lowers` (top first).
pub fn overlay_layers(
    stored: &[StoredLayer],
    images_dir: &Path,
    subvol: &Path,
    lowers: &[PathBuf],
) -> Vec<OverlayLayer> {
    stored
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let (path, idmap) =
                if l.kind == "host" { (PathBuf::from(&l.path), true) } else { (images_dir.join(&l.path), false) };
            let dir = subvol.join("layers").join(i.to_string());
            let mut lower: Vec<LowerDir> = lowers
                .iter()
                .map(|l| LowerDir { path: l.join("layers").join(i.to_string()).join("upper"), idmap: false })
                .collect();
            lower.push(LowerDir { path, idmap });
            OverlayLayer { target: PathBuf::from(&l.target), lower, upper: dir.join("upper"), work: dir.join("work") }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_layers_are_idmapped_and_image_layers_resolve_under_images_dir() {
        let images = Path::new("/vol/images");
        let layers = vec![
            LowerLayer { target: "/".into(), source: LowerSource::Subvolume(images.join("default")) },
            LowerLayer { target: "/usr".into(), source: LowerSource::HostDir("/usr".into()) },
        ];
        let stored = store_layers(&layers, images);
        assert_eq!(stored[0], StoredLayer { target: "/".into(), kind: "image".into(), path: "default".into() });
        let ovl = overlay_layers(&stored, Path::new("/vol2/images"), Path::new("/vol2/sandboxes/sb-x.1"), &[]);
        assert_eq!(ovl[0].lower[0].path, Path::new("/vol2/images/default"));
        assert!(!ovl[0].lower[0].idmap);
        assert!(ovl[1].lower[0].idmap);
        let lowers = [PathBuf::from("/vol2/checkpoints/ck-2"), PathBuf::from("/vol2/checkpoints/ck-1")];
        let ovl = overlay_layers(&stored, Path::new("/vol2/images"), Path::new("/vol2/sandboxes/sb-x.1"), &lowers);
        let paths: Vec<_> = ovl[1].lower.iter().map(|l| (l.path.clone(), l.idmap)).collect();
        assert_eq!(
            paths,
            [
                (PathBuf::from("/vol2/checkpoints/ck-2/layers/1/upper"), false),
                (PathBuf::from("/vol2/checkpoints/ck-1/layers/1/upper"), false),
                (PathBuf::from("/usr"), true),
            ]
        );
        assert_eq!(ovl[1].upper, Path::new("/vol2/sandboxes/sb-x.1/layers/1/upper"));
        assert_eq!(ovl[1].target, Path::new("/usr"));
    }
}
