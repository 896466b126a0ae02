//! The SysV IPC objects of the sandbox's IPC namespace in its checkpoints:
//! semaphore sets, message queues and shared memory segments.
//!
//! They belong to the namespace, not to a process: a program makes one and
//! may exit (`ipcs` still lists it), and a rollback in place keeps the
//! namespace, whose objects would otherwise stay as they are now. So, like
//! `/dev/shm` (`dev_shm.rs`), a checkpoint copies them into its layer's
//! subvolume and a rollback, a fork or a restart puts them back before any
//! process runs:
//!
//! ```text
//! sandboxes/<id>/<gen>/sysv-ipc/objects.json   every object: id, key, owner, creator, mode; values, sizes
//! sandboxes/<id>/<gen>/sysv-ipc/msg-<id>       a queue's messages: (i64 type, u64 length, bytes)*, little-endian
//! sandboxes/<id>/<gen>/sysv-ipc/shm-<id>       a segment's contents, sparse (its holes stay holes)
//! ```
//! (absent: no object). Ids (owner, creator) are as the sandbox sees them.
//!
//! Whether there is any object is read without entering the namespace
//! ([`Probe`]: most sandboxes have none, and a checkpoint then pays a few
//! microseconds). Otherwise a thread of the daemon enters the namespace (`setns`; the
//! daemon's other threads stay out) and reads or makes the objects through
//! `sandtree_sys::sysv_ipc`: values by `GETALL`, messages by `msgrcv`'s
//! `MSG_COPY` (read, not taken: nothing the processes observe changes), a
//! segment's contents through its file (`SEEK_DATA` runs only). An object
//! is made again on its id (`kernel/<kind>_next_id`), by its creator (the
//! thread takes the creator's effective ids for the call), then given its
//! owner, mode, values, messages or contents.
//!
//! A put back makes the namespace as it was: an object of the checkpoint
//! still there (same id and key, and size) gets its state again, every
//! other object goes (`IPC_RMID`), and the missing ones are made again.
//! Segments marked for removal (`SHM_DEST`: removed while attached) are
//! neither saved nor removed: a captured process that has one attached
//! finds it again through its template, which holds it (and holds its
//! contents: `sandtree_proc`'s shared memory). One of the checkpoint's
//! segments marked so since (by a process, or by a rollback to a
//! checkpoint without it while another's templates held it) is kept so
//! when it was attached at the checkpoint (its templates hold it): its
//! key stays private (not kept, logged). One that was not attached then
//! cannot be made again on its id until its last detach: the put back
//! fails, naming it.
//!
//! Not kept (not refused): the times of the last operations and change,
//! the pids of the last operations (a put back makes them the daemon's,
//! which the sandbox sees as 0), the semaphore adjustments processes asked
//! for with `SEM_UNDO` (not readable: a restored process exits without
//! them), and the namespace's settings (`kernel.shmmax`, `msgmnb`, the
//! `*_next_id` a process may have set, ...). Not seen: objects of an IPC namespace a process of the sandbox
//! made for itself, and POSIX message queues (`mq_open`).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use sandtree_sys::sysv_ipc::{self as ipc, Kind, SHM_DEST, SHM_LOCKED};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The copy's directory in a layer's subvolume.
pub(crate) const SAVED: &str = "sysv-ipc";

/// An object's identity and owner, ids as the sandbox sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Owner {
    id: i32,
    key: i32,
    uid: u32,
    gid: u32,
    cuid: u32,
    cgid: u32,
    /// Permission bits (and a segment's [`SHM_LOCKED`]).
    mode: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedSet {
    owner: Owner,
    values: Vec<u16>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedQueue {
    owner: Owner,
    qbytes: u64,
    /// Messages in `msg-<id>`.
    messages: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedSegment {
    owner: Owner,
    size: u64,
    /// Its attachments at the checkpoint (those of the checkpoint's
    /// processes hold it in their templates since).
    #[serde(default)]
    nattch: u64,
    /// Its data runs (offset, length) in `shm-<id>`.
    runs: Vec<(u64, u64)>,
}

/// `objects.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Saved {
    semaphore_sets: Vec<SavedSet>,
    queues: Vec<SavedQueue>,
    segments: Vec<SavedSegment>,
}

fn internal(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("SysV IPC objects: {what}: {e}"))
}

/// Run `f` on a thread in the IPC namespace of process `init`.
fn in_namespace<R: Send>(init: i32, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    let ipc = ("ipc", rustix::thread::LinkNameSpaceType::InterProcessCommunication);
    sandtree_sys::process::on_thread_in_namespace(init, ipc, f).map_err(internal("enter the IPC namespace"))?
}

/// Host ids to the sandbox's and back, by the base of its mapping.
#[derive(Clone, Copy)]
struct Ids {
    uid_base: u32,
    gid_base: u32,
}

impl Ids {
    fn inside(&self, o: &ipc::Perm) -> Result<Owner> {
        let map = |id: u32, base: u32| {
            id.checked_sub(base).filter(|v| *v < 65536).ok_or_else(|| {
                Error::Internal(format!(
                    "SysV IPC object {} is owned by host id {id}, which the sandbox does not map",
                    o.id
                ))
            })
        };
        Ok(Owner {
            id: o.id,
            key: o.key,
            uid: map(o.uid, self.uid_base)?,
            gid: map(o.gid, self.gid_base)?,
            cuid: map(o.cuid, self.uid_base)?,
            cgid: map(o.cgid, self.gid_base)?,
            mode: o.mode,
        })
    }
}

/// A sandbox's lists of SysV objects, `/proc/sysvipc/{sem,msg,shm}` opened
/// by a thread in its IPC namespace: they list that namespace's objects
/// to whoever reads them (the namespace is taken at the open), so whether
/// it has any is three reads away (a few microseconds), where entering the
/// namespace takes a thread (50-200 microseconds). Kept by the engine
/// with the sandbox's init (it holds the namespace).
pub(crate) struct Probe {
    /// The init whose namespace it lists.
    pub init: i32,
    lists: [std::fs::File; 3],
}

impl Probe {
    /// The lists of the IPC namespace of process `init`.
    pub(crate) fn open(init: i32) -> Result<Probe> {
        in_namespace(init, || {
            let open =
                |kind: &str| std::fs::File::open(format!("/proc/sysvipc/{kind}")).map_err(internal("open the lists"));
            Ok(Probe { init, lists: [open("sem")?, open("msg")?, open("shm")?] })
        })
    }

    /// Whether the namespace has an object (a list has more than its
    /// header line).
    pub(crate) fn any(&self) -> Result<bool> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 512];
        for list in &self.lists {
            let n = list.read_at(&mut buf, 0).map_err(internal("read the lists"))?;
            if buf[..n].iter().filter(|&&b| b == b'\n').count() > 1 {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// At a checkpoint, every process stopped: copies the SysV objects of the
/// sandbox (whose namespace `probe` lists) into `<subvol>/sysv-ipc` (none
/// if it has none). `root` is the host ids of the sandbox's root. Returns
/// the objects saved.
pub(crate) fn save(probe: &Probe, root: (u32, u32), subvol: &Path) -> Result<usize> {
    discard(subvol)?;
    if !probe.any()? {
        return Ok(0);
    }
    let ids = Ids { uid_base: root.0, gid_base: root.1 };
    let dir = subvol.join(SAVED);
    let t0 = std::time::Instant::now();
    let saved = in_namespace(probe.init, || {
        let sets = ipc::semaphore_sets().map_err(internal("list the semaphore sets"))?;
        let queues = ipc::queues().map_err(internal("list the message queues"))?;
        let segments: Vec<_> = ipc::segments()
            .map_err(internal("list the shared memory segments"))?
            .into_iter()
            .filter(|s| s.perm.mode & SHM_DEST == 0)
            .collect();
        if sets.is_empty() && queues.is_empty() && segments.is_empty() {
            return Ok(0);
        }
        std::fs::create_dir(&dir).map_err(internal("make the copy's directory"))?;
        let mut saved = Saved::default();
        for s in sets {
            saved.semaphore_sets.push(SavedSet { owner: ids.inside(&s.perm)?, values: s.values });
        }
        for q in queues {
            let messages = ipc::messages(&q).map_err(internal("read a queue's messages"))?;
            let mut out = Vec::new();
            for (mtype, text) in &messages {
                out.extend_from_slice(&mtype.to_le_bytes());
                out.extend_from_slice(&(text.len() as u64).to_le_bytes());
                out.extend_from_slice(text);
            }
            std::fs::write(dir.join(format!("msg-{}", q.perm.id)), out).map_err(internal("save a queue's messages"))?;
            saved.queues.push(SavedQueue { owner: ids.inside(&q.perm)?, qbytes: q.qbytes, messages: messages.len() });
        }
        for s in segments {
            let file = ipc::segment_file(s.perm.id, false).map_err(internal("open a segment"))?;
            let to = dir.join(format!("shm-{}", s.perm.id));
            let runs = copy_runs(&file, &to, s.size).map_err(internal("save a segment's contents"))?;
            saved.segments.push(SavedSegment { owner: ids.inside(&s.perm)?, size: s.size, nattch: s.nattch, runs });
        }
        let n = saved.semaphore_sets.len() + saved.queues.len() + saved.segments.len();
        let json = serde_json::to_vec(&saved).map_err(|e| Error::Internal(format!("SysV IPC objects: {e}")))?;
        let mut f = std::fs::File::create(dir.join("objects.json")).map_err(internal("save the objects"))?;
        f.write_all(&json).map_err(internal("save the objects"))?;
        Ok(n)
    });
    tracing::debug!(objects = ?saved.as_ref().ok(), took = ?t0.elapsed(), "SysV IPC objects saved");
    saved
}

/// Copy `file`'s data runs (of its first `size` bytes) into a new sparse
/// file `to`; the runs.
fn copy_runs(file: &OwnedFd, to: &Path, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let out = std::fs::File::create(to)?;
    out.set_len(size)?;
    sandtree_proc::fdstate::copy_data_runs(file, &OwnedFd::from(out), size)
}

/// Removes an older copy from a writable subvolume.
pub(crate) fn discard(subvol: &Path) -> Result<()> {
    crate::dev_shm::remove_saved(subvol, SAVED)
}

/// Whether a [`load`] onto the checkpoint whose layer is `layer` has
/// anything to do: the checkpoint saved objects, or the sandbox has some.
pub(crate) fn in_use(probe: &Probe, layer: &Path) -> Result<bool> {
    Ok(saved_in(layer) || probe.any()?)
}

/// Whether the checkpoint whose layer is `layer` saved objects (a sandbox
/// that boots onto it needs a [`load`]).
pub(crate) fn saved_in(layer: &Path) -> bool {
    layer.join(SAVED).exists()
}

/// At a rollback (processes gone), a restart or a fork (init alone), onto
/// a checkpoint whose layer is `layer`: the sandbox's SysV objects become
/// the checkpoint's (see the module docs). Returns the objects made again
/// or set again.
pub(crate) fn load(init: i32, root: (u32, u32), layer: &Path) -> Result<usize> {
    let dir = layer.join(SAVED);
    let saved: Saved = match std::fs::read(dir.join("objects.json")) {
        Ok(json) => serde_json::from_slice(&json)
            .map_err(|e| Error::Internal(format!("SysV IPC objects of {}: {e}", dir.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Saved::default(),
        Err(e) => return Err(internal("read the saved objects")(e)),
    };
    let ids = Ids { uid_base: root.0, gid_base: root.1 };
    in_namespace(init, || {
        let mut done = 0;
        // What is there now: kept when it is the checkpoint's, else removed
        // (before any is made again: a key in use would be taken).
        let mut sets_kept = Vec::new();
        for s in ipc::semaphore_sets().map_err(internal("list the semaphore sets"))? {
            match saved.semaphore_sets.iter().find(|v| same(&v.owner, &s.perm) && v.values.len() == s.values.len()) {
                Some(v) => sets_kept.push(v.owner.id),
                None => ipc::remove(Kind::Semaphores, s.perm.id).map_err(internal("remove a semaphore set"))?,
            }
        }
        let mut queues_kept = Vec::new();
        for q in ipc::queues().map_err(internal("list the message queues"))? {
            match saved.queues.iter().find(|v| same(&v.owner, &q.perm)) {
                Some(v) => {
                    ipc::drain(q.perm.id, q.cbytes).map_err(internal("empty a message queue"))?;
                    queues_kept.push(v.owner.id);
                }
                None => ipc::remove(Kind::Queue, q.perm.id).map_err(internal("remove a message queue"))?,
            }
        }
        let mut segments_kept = Vec::new();
        // (Of the checkpoint's, marked for removal since: kept as they are.)
        let mut segments_marked = Vec::new();
        for s in ipc::segments().map_err(internal("list the shared memory segments"))? {
            let theirs = saved.segments.iter().find(|v| v.owner.id == s.perm.id);
            if s.perm.mode & SHM_DEST != 0 {
                match theirs {
                    // Removed since while attached (by a process, or by a
                    // rollback to a checkpoint that did not have it), and
                    // attached at the checkpoint: the checkpoint's templates
                    // hold it, and its processes find it again; its contents
                    // are theirs (`sandtree_proc`'s shared memory). Its key
                    // is private for good (not kept).
                    Some(v) if v.nattch > 0 && s.nattch > 0 => {
                        tracing::warn!(
                            id = v.owner.id,
                            key = v.owner.key,
                            "SysV segment marked for removal since the checkpoint: restored without its key"
                        );
                        segments_marked.push(v.owner.id);
                    }
                    Some(v) => {
                        return Err(Error::Internal(format!(
                            "SysV shared memory segment {} (key {:#x}) was removed (IPC_RMID) after the checkpoint while a process had it attached: it cannot be made again on its id until its last detach",
                            v.owner.id, v.owner.key
                        )));
                    }
                    None => {}
                }
                continue;
            }
            match theirs.filter(|v| same(&v.owner, &s.perm) && v.size == s.size) {
                Some(v) => segments_kept.push(v.owner.id),
                None => ipc::remove(Kind::Segment, s.perm.id).map_err(internal("remove a segment"))?,
            }
        }
        for v in &saved.semaphore_sets {
            let id = v.owner.id;
            if !sets_kept.contains(&id) {
                make_as_creator(&ids, &v.owner, Kind::Semaphores, || {
                    ipc::make_semaphore_set(v.owner.key, v.values.len(), v.owner.mode)
                })?;
            }
            ipc::set_semaphore_values(id, &v.values).map_err(internal("set a semaphore set's values"))?;
            set_owner(&ids, Kind::Semaphores, &v.owner, None)?;
            done += 1;
        }
        for v in &saved.queues {
            let id = v.owner.id;
            if !queues_kept.contains(&id) {
                make_as_creator(&ids, &v.owner, Kind::Queue, || ipc::make_queue(v.owner.key, v.owner.mode))?;
            }
            // (The most bytes first: the messages must fit.)
            set_owner(&ids, Kind::Queue, &v.owner, Some(v.qbytes))?;
            let bytes = std::fs::read(dir.join(format!("msg-{id}"))).map_err(internal("read a queue's messages"))?;
            let messages = parse_messages(&bytes)
                .filter(|m| m.len() == v.messages)
                .ok_or_else(|| Error::Internal(format!("SysV IPC objects: the messages of queue {id} are damaged")))?;
            for (mtype, text) in messages {
                ipc::send(id, mtype, text).map_err(internal("queue a message again"))?;
            }
            done += 1;
        }
        for v in saved.segments.iter().filter(|v| !segments_marked.contains(&v.owner.id)) {
            let id = v.owner.id;
            if !segments_kept.contains(&id) {
                make_as_creator(&ids, &v.owner, Kind::Segment, || {
                    ipc::make_segment(v.owner.key, v.size, v.owner.mode)
                })?;
            }
            let fill = || -> std::io::Result<()> {
                let file = ipc::segment_file(id, true)?;
                let punch = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
                if v.size > 0 {
                    rustix::fs::fallocate(&file, punch, 0, v.size)?;
                }
                let from = OwnedFd::from(std::fs::File::open(dir.join(format!("shm-{id}")))?);
                for &(start, len) in &v.runs {
                    sandtree_proc::fdstate::copy_range(&from, &file, start, len)?;
                }
                Ok(())
            };
            fill().map_err(internal("put a segment's contents back"))?;
            set_owner(&ids, Kind::Segment, &v.owner, None)?;
            if v.owner.mode & SHM_LOCKED != 0 {
                ipc::lock_segment(id).map_err(internal("lock a segment"))?;
            }
            done += 1;
        }
        Ok(done)
    })
}

/// Whether live object `p` is saved object `o` (same id and key).
fn same(o: &Owner, p: &ipc::Perm) -> bool {
    o.id == p.id && o.key == p.key
}

/// Make object `o` of `kind` by `make`, on its id, with the calling
/// thread's effective ids its creator's for the call.
fn make_as_creator(ids: &Ids, o: &Owner, kind: Kind, make: impl FnOnce() -> std::io::Result<i32>) -> Result<()> {
    ipc::set_next_id(kind, o.id).map_err(internal("set the next id"))?;
    let (uid, gid) = (o.cuid + ids.uid_base, o.cgid + ids.gid_base);
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_thread_res_gid, set_thread_res_uid};
    set_thread_res_gid(None, Gid::from_raw(gid), None).map_err(|e| internal("take the creator's group")(e.into()))?;
    set_thread_res_uid(None, Uid::from_raw(uid), None).map_err(|e| internal("take the creator's user")(e.into()))?;
    let made = make();
    // (Back to root: the permitted capabilities become effective again.)
    let back = set_thread_res_uid(None, Uid::ROOT, None).and_then(|()| set_thread_res_gid(None, Gid::ROOT, None));
    back.map_err(|e| internal("take root's ids again")(e.into()))?;
    if made.is_err() {
        // (Not left for the sandbox's next object.)
        let _ = ipc::set_next_id(kind, -1);
    }
    let got = made.map_err(internal("make an object again"))?;
    if got != o.id {
        let _ = ipc::remove(kind, got);
        return Err(Error::Internal(format!("SysV IPC objects: made {} again as {got}", o.id)));
    }
    Ok(())
}

fn set_owner(ids: &Ids, kind: Kind, o: &Owner, qbytes: Option<u64>) -> Result<()> {
    ipc::set_owner(kind, o.id, o.uid + ids.uid_base, o.gid + ids.gid_base, o.mode, qbytes)
        .map_err(internal("set an object's owner"))
}

/// `msg-<id>`'s records.
fn parse_messages(mut b: &[u8]) -> Option<Vec<(i64, &[u8])>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let mtype = i64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
        let len = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?) as usize;
        out.push((mtype, b.get(16..16usize.checked_add(len)?)?));
        b = &b[16 + len..];
    }
    Some(out)
}
