//! Sockets of other families (netlink, packet, ...): kept from the
//! template as they are.

use super::Kind;

/// Sockets of families other than unix and inet.
pub(crate) struct OtherSocket;

impl Kind for OtherSocket {}
