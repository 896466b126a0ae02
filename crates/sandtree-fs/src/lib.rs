#![forbid(unsafe_code)]
//! `sandtree-fs`: the Sandtree state store, one btrfs volume holding images,
//! sandbox layers and checkpoints.
//!
//! On-disk layout:
//!
//! ```text
//! <data_dir>/                      default /var/lib/sandtree (host filesystem), mode 0700
//!   btrfs.img                      sparse image, created + mkfs.btrfs on first open (Backing::Image)
//!   btrfs/                         mount point of the volume (Volume::root())
//!     images/<name>                subvolume: an image's rootfs (read-only once built)
//!     sandboxes/<name>             subvolume: a sandbox's writable layers (layers/<i>/upper, layers/<i>/work)
//!     checkpoints/<id>             read-only snapshot of a sandbox subvolume
//! ```
//!
//! With `VolumeConfig::btrfs_mount` set, `images/ sandboxes/ checkpoints/`
//! live directly in that existing btrfs mount and no image is created.
//!
//! Checkpoint, rollback and fork are subvolume snapshots (O(1), copy on
//! write). Image files are owned by `uid_base + uid` on disk, so every
//! sandbox maps ids `0..65536` inside to `uid_base..` outside.
//!
//! | module   | what |
//! |----------|------|
//! | `volume` | create / loop-mount / re-open the volume, usage |
//! | `subvol` | subvolume create, snapshot (one or many), delete, info, list, bytes written since a transaction |
//! | `image`  | build the default image, import a directory or tarball with ownership shift |
//! | `copy_tree` | copy a tree between file systems with its attributes, links and holes (`/dev/shm`) |
//! | `squash` | merge a run of read-only overlay layers into one with the same view |

pub mod copy_tree;
mod error;
pub mod image;
pub mod squash;
pub mod subvol;
pub mod volume;

#[cfg(test)]
mod testutil;

pub use copy_tree::{Copied, copy_tree, is_empty_dir, open_dir_beneath};
pub use error::{Error, Result};
pub use image::{
    DEFAULT_IMAGE, LowerLayer, LowerSource, Progress, build_default_image, default_image_layers, import_dir,
    import_tar, remove_image,
};
pub use squash::{Below, squash};
pub use subvol::{
    SubvolInfo, bytes_written_since, create_subvolume, delete_subvolume, dir_size, is_subvolume, list_subvolumes,
    set_readonly, settle_deletions, snapshot, snapshot_many, subvolume_info, sync_fs,
};
pub use volume::{Backing, Volume, VolumeConfig, VolumeUsage};
