//! Pidfds (`FdKind::AnonInode`, `pidfd`): kept from the template as they
//! are.

use super::Kind;

/// Pidfds.
pub(crate) struct Pidfd;

impl Kind for Pidfd {}
