//! Test helper: a real btrfs volume in a tempdir (sparse image, mkfs, loop
//! mount through [`Volume::open`]), unmounted on drop.

use std::path::Path;

use crate::volume::{Volume, VolumeConfig};

/// A throwaway btrfs volume.
pub struct TestVolume {
    pub config: VolumeConfig,
    vol: Option<Volume>,
    // Dropped last: the image lives here.
    _dir: tempfile::TempDir,
}

impl TestVolume {
    /// Creates and mounts a volume of `size` bytes, or returns `None` (with a
    /// message) when this machine cannot run btrfs tests.
    pub fn new(size: u64) -> Option<TestVolume> {
        let has_btrfs = std::fs::read_to_string("/proc/filesystems").map(|s| s.contains("btrfs")).unwrap_or(false);
        if !has_btrfs {
            eprintln!("SKIPPING btrfs test: kernel has no btrfs (not in /proc/filesystems)");
            return None;
        }
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPING btrfs test: needs root (loop devices, mount)");
            return None;
        }
        let dir = tempfile::Builder::new().prefix("sandtree-fs-test").tempdir().expect("tempdir");
        let config = VolumeConfig { data_dir: dir.path().join("data"), btrfs_mount: None, image_size: size };
        let vol = Volume::open(&config).expect("open test volume");
        Some(TestVolume { config, vol: Some(vol), _dir: dir })
    }

    pub fn vol(&self) -> &Volume {
        self.vol.as_ref().expect("volume")
    }

    pub fn root(&self) -> &Path {
        self.vol().root()
    }
}

impl Drop for TestVolume {
    fn drop(&mut self) {
        let Some(vol) = self.vol.take() else { return };
        let root = vol.root().to_path_buf();
        // The test may have re-mounted through another handle: unmount
        // whatever is mounted there now.
        if let Err(e) = vol.unmount() {
            eprintln!("test volume unmount failed ({e}); lazy unmount");
            let _ = rustix::mount::unmount(&root, rustix::mount::UnmountFlags::DETACH);
        }
    }
}
