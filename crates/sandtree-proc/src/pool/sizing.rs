//! The memory the pool holds, measured in physical pages off the tracer
//! thread ([`Sizing`]): pages of templates that no live process maps.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::{HostPid, procfs};

/// What to measure of the pool (outside the tracer thread): the
/// templates of each checkpoint, and the holders, which share the address
/// spaces of the live processes. Standbys are left out: each maps exactly
/// its template's pages (neither ever writes).
#[derive(Clone)]
pub(crate) struct Sizing {
    checkpoints: Vec<ToSize>,
    live: Vec<HostPid>,
    /// Operations in flight ([`crate::Tracer::begin`]): the walk waits while
    /// there is one.
    ops: Arc<AtomicU32>,
    frames: Arc<Mutex<FrameCache>>,
}

/// A checkpoint (id, last used) and its templates' host pids, each with
/// whether it is done changing (set up, its pages written).
type ToSize = (String, u64, Vec<(HostPid, bool)>);

/// The frames of templates done changing, by (checkpoint, host pid), as
/// read when: a template never writes, so its frames stay what they were
/// unless the kernel moves its pages (compaction), but for its scratch
/// page (the arguments of the forks we inject: one page copied on write
/// after a fork); an entry is read again after [`FRAMES_FRESH`]. Without it, each eviction check read every
/// template again: 30 checkpoints of a 1 GB process, 2.3 s a check.
pub(crate) type FrameCache = std::collections::HashMap<(String, HostPid), (std::time::Instant, Arc<Vec<u64>>)>;

/// How long a template's frames are taken as read.
const FRAMES_FRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// A hasher for page frame numbers (a multiply: they are spread evenly
/// enough, and the default hasher was a third of a walk's time).
#[derive(Default)]
struct FrameHasher(u64);

impl std::hash::Hasher for FrameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
}

type FrameMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<FrameHasher>>;

type FrameSet = std::collections::HashSet<u64, std::hash::BuildHasherDefault<FrameHasher>>;

/// The frames of the live processes, as a bitmap indexed by frame number
/// (a bit per page of the host's memory: 24 GiB, 768 KiB), with a hash set
/// for frame numbers beyond [`LiveFrames::BITMAP_MAX`]. A walk looks every
/// frame of every template up in it (30 checkpoints of a 1 GB process: ~8
/// million lookups); in a hash set that made a walk take 0.5-1.2 s of CPU,
/// beside the bench's steps and the standby forks they wait for.
#[derive(Default)]
struct LiveFrames {
    bits: Vec<u64>,
    high: FrameSet,
}

impl LiveFrames {
    /// Frame numbers up to here (16 TiB of memory, a 512 MiB bitmap at
    /// most, grown to the highest frame seen) go in the bitmap.
    const BITMAP_MAX: u64 = 1 << 32;

    fn insert(&mut self, f: u64) {
        if f >= Self::BITMAP_MAX {
            self.high.insert(f);
            return;
        }
        let w = (f / 64) as usize;
        if w >= self.bits.len() {
            self.bits.resize(w + 1, 0);
        }
        self.bits[w] |= 1 << (f % 64);
    }

    fn contains(&self, f: u64) -> bool {
        if f >= Self::BITMAP_MAX {
            return self.high.contains(&f);
        }
        self.bits.get((f / 64) as usize).is_some_and(|w| w & (1 << (f % 64)) != 0)
    }
}

/// Memory the pool holds.
pub(crate) struct PoolMemory {
    /// Pages of templates that no live process maps.
    pub(crate) total: u64,
    /// Per checkpoint (id, last used): the pages it is the most recently
    /// used holder of. Evicting least recently used first, that is what
    /// each eviction frees (a page shared with an older checkpoint is
    /// freed with the last of them).
    pub(crate) own: Vec<(String, u64, u64)>,
}

impl Sizing {
    /// [`Sizing::measure`] on a thread of its own at nice 19: it reads the
    /// page map of every template it has not read lately (the first walk
    /// after a bench's 30 checkpoints of a 1 GB Python: ~0.7 s of CPU; the
    /// next ones 35-150 ms, 12-20 at 100 MB) and, at the normal
    /// priority of a runtime thread, it held the tracer thread off its CPU
    /// for milliseconds in the rollbacks it ran beside.
    pub(crate) fn measure_aside(self) -> PoolMemory {
        let here = self.clone();
        let spawned = std::thread::Builder::new().name("sandtree:sizing".into()).spawn(move || {
            let _ = rustix::process::setpriority_process(None, 19);
            self.measure()
        });
        match spawned.map(|h| h.join()) {
            Ok(Ok(sized)) => sized,
            // (No thread, or it panicked: here, at this thread's priority.)
            _ => here.measure(),
        }
    }

    /// Counts physical pages: a page a template shares with a live process
    /// (unchanged since the checkpoint) costs nothing; one the process has
    /// changed since is the pool's. So the figure is proportional to the
    /// pages changed, not to the processes' size.
    ///
    /// The walk steps aside while a checkpoint or a rollback runs (between
    /// reads of 4,096 entries, and between 4,096 frames counted, each well
    /// under a millisecond): the eviction check starts once the engine has
    /// been idle a moment, and it met the first rollback after a burst of
    /// checkpoints, which then took 8-27 ms instead of ~3 (the walk took the
    /// CPU, and each page-map read holds the template's memory map lock,
    /// which a fork of it waits for). Its nice value does not keep it out
    /// of the way: the daemon is one CPU group and the sandbox another, of
    /// equal weight, so while the tracer waits for a call it injected, the
    /// walk and the process share the CPU half and half (counting cached
    /// frames without a pause, it made a 1 GB checkpoint's injected calls
    /// take 10-27 ms instead of ~0.5).
    fn measure(mut self) -> PoolMemory {
        let ops = self.ops.clone();
        let between = move || {
            while ops.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        let mut live = LiveFrames::default();
        for host in std::mem::take(&mut self.live) {
            for f in procfs::frames(host, &between).unwrap_or_default() {
                live.insert(f);
            }
        }
        // Templates gone since are forgotten.
        let now = std::time::Instant::now();
        let mut cache = std::mem::take(&mut *self.frames.lock().unwrap_or_else(|e| e.into_inner()));
        let keep: std::collections::HashSet<(&str, HostPid)> = self
            .checkpoints
            .iter()
            .flat_map(|(ck, _, hosts)| hosts.iter().filter(|h| h.1).map(move |h| (ck.as_str(), h.0)))
            .collect();
        cache.retain(|(ck, host), (at, _)| keep.contains(&(ck.as_str(), *host)) && now - *at < FRAMES_FRESH);
        // Oldest first: a page's owner ends up its newest holder.
        self.checkpoints.sort_by_key(|(_, used, _)| *used);
        let mut owner: FrameMap<usize> = FrameMap::default();
        for (i, (ck, _, hosts)) in self.checkpoints.iter().enumerate() {
            for &(host, done) in hosts {
                let key = (ck.clone(), host);
                let frames = match cache.get(&key) {
                    Some((_, f)) => f.clone(),
                    None => {
                        let f = Arc::new(procfs::frames(host, &between).unwrap_or_default());
                        if done {
                            cache.insert(key, (std::time::Instant::now(), f.clone()));
                        }
                        f
                    }
                };
                // (Steps aside here too: at 1 GB a template is 262,144
                // frames, ~5 ms of hashing.)
                for chunk in frames.chunks(4096) {
                    between();
                    for &f in chunk {
                        if !live.contains(f) {
                            owner.insert(f, i);
                        }
                    }
                }
            }
        }
        *self.frames.lock().unwrap_or_else(|e| e.into_inner()) = cache;
        let mut own = vec![0u64; self.checkpoints.len()];
        for &o in owner.values() {
            own[o] += 4096;
        }
        PoolMemory {
            total: owner.len() as u64 * 4096,
            own: self.checkpoints.into_iter().zip(own).map(|((k, used, _), b)| (k, used, b)).collect(),
        }
    }
}

impl super::Pool {
    pub(crate) fn sizing(&self, live: Vec<HostPid>, ops: Arc<AtomicU32>) -> Sizing {
        Sizing {
            checkpoints: self
                .checkpoints
                .iter()
                .map(|(k, c)| {
                    let hosts = c.templates.iter().map(|t| (t.host, t.scratch != 0 && t.to_write.is_none()));
                    (k.clone(), c.last_used, hosts.collect())
                })
                .collect(),
            live,
            ops,
            frames: self.frames.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LiveFrames;

    /// Frames in the bitmap and beyond it are found; others are not.
    #[test]
    fn live_frames_hold_what_was_inserted() {
        let mut live = LiveFrames::default();
        let inside = [0, 1, 63, 64, 6_291_455, 1 << 24];
        let beyond = [LiveFrames::BITMAP_MAX, LiveFrames::BITMAP_MAX + 12345];
        for f in inside.iter().chain(&beyond) {
            live.insert(*f);
        }
        for f in inside.iter().chain(&beyond) {
            assert!(live.contains(*f), "{f} inserted but not found");
        }
        for f in [2, 62, 65, 6_291_454, LiveFrames::BITMAP_MAX + 1, u64::MAX] {
            assert!(!live.contains(f), "{f} found but never inserted");
        }
        assert_eq!(live.high.len(), beyond.len());
    }
}
