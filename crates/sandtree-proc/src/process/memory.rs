//! A process's memory. A template shares it copy-on-write (the fork copies
//! the page tables, or a standby's are patched: `incremental.rs`); what a
//! template cannot hold apart from the running process is refused here:
//! a mapping of a memfd, a writable shared mapping.

use crate::check::Unrestorable;
use crate::model::ProcessImage;

/// The checks of a captured image's memory map.
pub(crate) fn check(p: &ProcessImage) -> Result<(), Unrestorable> {
    let no = |resource: String, reason: String| Unrestorable { pid: p.pid, comm: p.comm.clone(), resource, reason };
    if let Some(m) = p.maps.iter().find(|m| m.path.as_deref().is_some_and(|p| p.starts_with("/memfd:"))) {
        return Err(no(
            format!("mapping {:x}-{:x}", m.start, m.end),
            format!(
                "mapping of {}: its pages would be the running process's memfd, not the checkpoint's copy",
                m.path.as_deref().unwrap_or("a memfd")
            ),
        ));
    }
    if let Some(m) = p.maps.iter().find(|m| m.shared() && m.perms.starts_with("rw")) {
        let what = m.path.clone().unwrap_or_else(|| "anonymous memory".into());
        return Err(no(
            format!("mapping {:x}-{:x}", m.start, m.end),
            format!("writable shared mapping of {what}: a template would share it with the running process"),
        ));
    }
    Ok(())
}
