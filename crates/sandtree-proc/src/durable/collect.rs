//! What an image is written from, collected on the tracer thread in one
//! job ([`collect`]): every template of the checkpoint finished (set up,
//! its pages written), then, per template, its image, its
//! [`ForkState`] (a batch in it, its XSAVE area by ptrace) and a pidfd;
//! and the checkpoint's saved contents. The memory is read after, off the
//! tracer thread ([`super::write_image`]): a template never runs, so its
//! pages stay as they were while it lives, which its pidfd tells.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::check::Unrestorable;
use crate::fdstate::SparseCopy;
use crate::memory_holder::Holder;
use crate::model::{ForkState, PipeBuffer, ProcessImage, SocketBuffer};
use crate::pool::Pool;
use crate::track::Trackings;
use crate::{Error, HostPid, Result};

/// One template to write.
pub struct SourceProcess {
    pub image: ProcessImage,
    pub fork: ForkState,
    /// The template.
    pub host: HostPid,
    /// A pidfd of the template: readable once it has ended.
    pub pidfd: OwnedFd,
    /// Its scratch mapping (not the process's: left out).
    pub scratch: u64,
}

/// The saved contents of a shared memory object.
pub struct SharedSource {
    pub key: (u64, u64, bool),
    pub data: Arc<SparseCopy>,
    pub memfd: Option<(u32, u32)>,
}

/// Everything an image of one checkpoint is written from.
pub struct Sources {
    pub checkpoint: String,
    pub processes: Vec<SourceProcess>,
    pub pipes: Vec<PipeBuffer>,
    pub sockets: Vec<SocketBuffer>,
    pub pair_data: Vec<SocketBuffer>,
    pub shared_memory: Vec<SharedSource>,
    pub unrestorable: Vec<Unrestorable>,
}

/// Collect the [`Sources`] of checkpoint `ck` (see the module docs).
pub(crate) fn collect(pool: &mut Pool, tracking: &mut Trackings, holders: &mut [Holder], ck: &str) -> Result<Sources> {
    pool.finish_pending(tracking, holders);
    let set = pool.get_mut(ck).ok_or_else(|| Error::NoTemplates(ck.to_string()))?;
    let mut processes = Vec::with_capacity(set.templates.len());
    for t in set.templates.iter_mut() {
        let mut fork = crate::process::fork_state::read_in_template(t)?;
        crate::process::fork_state::read_rest(t.host, &mut fork)?;
        let pidfd = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(t.host.raw()).ok_or(Error::NoTemplates(ck.to_string()))?,
            rustix::process::PidfdFlags::empty(),
        )
        .map_err(|e| Error::Proc { pid: t.host, what: "pidfd", source: e.into() })?;
        processes.push(SourceProcess { image: t.image.clone(), fork, host: t.host, pidfd, scratch: t.scratch });
    }
    let shared_memory = set
        .shared_memory
        .iter()
        .map(|(c, host, _)| {
            let data = c.saved().duplicate().map_err(|e| Error::Proc { pid: *host, what: "shared memory copy", source: e })?;
            Ok(SharedSource { key: c.key, data: Arc::new(data), memfd: c.memfd() })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Sources {
        checkpoint: ck.to_string(),
        processes,
        pipes: set.pipes.iter().map(|(p, _, _)| p.clone()).collect(),
        sockets: set.sockets.iter().map(|(s, _, _)| s.clone()).collect(),
        pair_data: set.pair_data.clone(),
        shared_memory,
        unrestorable: set.unrestorable.clone(),
    })
}
