//! What an image is written from, collected on the tracer thread in one
//! job ([`collect`]), once the pool has finished every template of the
//! checkpoint (set up, its pages written, no standby fork under way in
//! it), between operations; then each template's fork state in a job of
//! its own ([`fork_state`]: a checkpoint waits for one at most) and from
//! its `/proc` off the tracer thread. Per template, its image, its
//! [`ForkState`] (a batch in it, its XSAVE area by ptrace) and a pidfd;
//! and the checkpoint's saved contents. The memory is read after, off the
//! tracer thread ([`super::write_image`]): a template never runs, so its
//! pages stay as they were while it lives, which its pidfd tells.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::check::Unrestorable;
use crate::fdstate::SparseCopy;
use crate::model::{ForkState, PipeBuffer, ProcessImage, SocketBuffer};
use crate::pool::Pool;
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
    /// Made from a standby: the checkpoint of the template it was made
    /// over, and the pages it changed over that one.
    pub(crate) changed_since: Option<(String, Arc<crate::track::Delta>)>,
}

/// The saved contents of a shared memory object.
pub struct SharedSource {
    pub key: (u64, u64, bool),
    pub data: Arc<SparseCopy>,
    pub memfd: Option<(u32, u32)>,
}

/// A template of the parent checkpoint, still in the pool: a page of the
/// new template on the same physical frame as its page at that address is
/// the page the parent's image holds there (templates never write), and
/// is not read again.
pub struct ParentTemplate {
    pub host: HostPid,
    pub pidfd: OwnedFd,
}

/// Everything an image of one checkpoint is written from.
pub struct Sources {
    pub checkpoint: String,
    pub processes: Vec<SourceProcess>,
    /// The parent checkpoint's templates still in the pool, by pid in the
    /// sandbox.
    pub parent_templates: std::collections::HashMap<i32, ParentTemplate>,
    pub pipes: Vec<PipeBuffer>,
    pub sockets: Vec<SocketBuffer>,
    pub pair_data: Vec<SocketBuffer>,
    pub shared_memory: Vec<SharedSource>,
    pub unrestorable: Vec<Unrestorable>,
}

/// Collect the [`Sources`] of checkpoint `ck` (see the module docs), with
/// the templates of its parent checkpoint `parent` still in the pool.
/// `None` while the pool has yet to finish one of `ck`'s templates (its
/// set-up, the pages it is to be given, its standby's fork under way, a
/// standby taken while forking): the caller asks again later. This job
/// does none of that work itself, nor waits for it: a checkpoint queued
/// behind it would wait too.
pub(crate) fn collect(pool: &mut Pool, (ck, parent): (&str, Option<&str>)) -> Result<Option<Sources>> {
    let set = pool.get(ck).ok_or_else(|| Error::NoTemplates(ck.to_string()))?;
    let unfinished =
        |t: &crate::template::Template| t.scratch == 0 || t.to_write.is_some() || t.forking.is_some() || t.deferred();
    if set.templates.iter().any(unfinished) {
        return Ok(None);
    }
    let mut parent_templates = std::collections::HashMap::new();
    for t in parent.and_then(|p| pool.get(p)).map(|set| set.templates.as_slice()).unwrap_or_default() {
        if !unfinished(t)
            && let Ok(pidfd) = crate::fdstate::pidfd_of(t.host)
        {
            parent_templates.insert(t.image.pid.raw(), ParentTemplate { host: t.host, pidfd });
        }
    }
    tracing::debug!(checkpoint = ck, ?parent, parent_templates = parent_templates.len(), "image sources");
    let mut processes = Vec::with_capacity(set.templates.len());
    for t in set.templates.iter() {
        let pidfd =
            crate::fdstate::pidfd_of(t.host).map_err(|e| Error::Proc { pid: t.host, what: "pidfd", source: e })?;
        processes.push(SourceProcess {
            image: t.image.clone(),
            fork: ForkState::default(),
            host: t.host,
            pidfd,
            scratch: t.scratch,
            changed_since: t.changed_since.clone(),
        });
    }
    let shared_memory = set
        .shared_memory
        .iter()
        .map(|(c, host, _)| {
            let data =
                c.saved().duplicate().map_err(|e| Error::Proc { pid: *host, what: "shared memory copy", source: e })?;
            Ok(SharedSource { key: c.key, data: Arc::new(data), memfd: c.memfd() })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(Sources {
        checkpoint: ck.to_string(),
        processes,
        parent_templates,
        pipes: set.pipes.iter().map(|(p, _, _)| p.clone()).collect(),
        sockets: set.sockets.iter().map(|(s, _, _)| s.clone()).collect(),
        pair_data: set.pair_data.clone(),
        shared_memory,
        unrestorable: set.unrestorable.clone(),
    }))
}

/// What [`fork_state`] found.
pub(crate) enum TemplateFork {
    Read(Box<ForkState>),
    /// A standby fork is under way in it (the pool's, between
    /// operations): ask again.
    Busy,
    Gone,
}

/// Job: the fork state of template `host` of checkpoint `ck` that only the
/// tracer can read (a batch in it, its XSAVE area).
pub(crate) fn fork_state(pool: &mut Pool, ck: &str, host: HostPid) -> Result<TemplateFork> {
    let Some(t) = pool.get_mut(ck).and_then(|set| set.templates.iter_mut().find(|t| t.host == host)) else {
        return Ok(TemplateFork::Gone);
    };
    if t.forking.is_some() || t.deferred() {
        return Ok(TemplateFork::Busy);
    }
    let mut state = crate::fork_state::read_in_template(t)?;
    crate::fork_state::read_xstate(t.host, &mut state)?;
    Ok(TemplateFork::Read(Box::new(state)))
}
