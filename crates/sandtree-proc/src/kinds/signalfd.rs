//! Signalfds (`FdKind::AnonInode`, `signalfd`): kept from the template;
//! the mask is set again in the restored process (`signalfd4` on its
//! descriptor), once every descriptor exists again.

use super::Kind;
use crate::batch::{Arg, Batch};
use crate::model::{AnonState, FdImage, FdKind};

/// Signalfds.
pub(crate) struct Signalfd;

impl Kind for Signalfd {
    fn configure(&self, f: &FdImage, b: &mut Batch) -> bool {
        let FdKind::AnonInode { state: Some(AnonState::Signalfd { mask }), .. } = &f.kind else { return false };
        let mask = b.data(&mask.to_ne_bytes());
        b.call("signalfd4 (mask)", libc::SYS_signalfd4, &[Arg::Val(f.fd as u64), mask, Arg::Val(8), Arg::Val(0)]);
        true
    }
}
