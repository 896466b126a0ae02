//! `sandtree-sys`: every `unsafe` line of Sandtree lives in this crate.
//!
//! Each module wraps one kernel interface behind a safe API. Every `unsafe`
//! block carries a `// SAFETY:` comment naming the invariants it relies on;
//! `clippy::undocumented_unsafe_blocks` is denied workspace-wide.
//!
//! | module    | kernel interface |
//! |-----------|------------------|
//! | `btrfs`   | btrfs ioctls: subvolume create / snapshot / destroy, subvolume info, tree search |
//! | `loopdev` | loop devices: `LOOP_CTL_GET_FREE`, `LOOP_CONFIGURE`, `LOOP_CLR_FD` |
//! | `mountinfo` | `/proc/self/mountinfo` parsing and overlay layer names (safe code) |
//! | `mount`   | the new mount API (`fsopen`, `fsconfig`, `fsmount`, `open_tree`, `move_mount`, `mount_setattr`), `pivot_root` |
//! | `process` | `fork`, `clone` with namespace flags, `pidfd_open`, `prctl` names, death signals and `PR_SET_MM_MAP` (a command line of our own) |
//! | `pty`     | pseudo-terminal pairs and `TIOCSCTTY` |
//! | `fdpass`  | `SCM_RIGHTS` over unix sockets |
//! | `handle`  | `open_by_handle_at` (inotify watches' inodes) |
//! | `sockopt` | `SO_PEEK_OFF` (messages queued on a socket, peeked one by one) |
//! | `ptrace`  | `PTRACE_SEIZE`, `INTERRUPT`, stops, registers, `process_vm_readv`/`writev` |
//! | `timerfd` | `TFD_IOC_SET_TICKS` (unread expirations of a restored timer) |
//! | `uffd`    | userfaultfd in asynchronous write-protect mode, `PAGEMAP_SCAN`, copying pages between processes |
//! | `pagefile` | a memfd allocated ahead and mapped shared (pages a holder copies in the frozen window) |
//! | `netdev`  | bring an interface (loopback) up with `SIOCSIFFLAGS` |
//! | `netlink` | rtnetlink: veth pairs (ends made in their namespaces), addresses, routes; running code in a network namespace |
//! | `tcp_repair` | TCP repair mode: a connection's sequence numbers, queues, windows and options, read and set |

pub mod btrfs;
pub mod fdpass;
pub mod file_notices;
pub mod handle;
pub mod loopdev;
pub mod mount;
pub mod mountinfo;
pub mod netdev;
pub mod netlink;
pub mod pagefile;
pub mod process;
pub mod ptrace;
pub mod pty;
pub mod sockopt;
pub mod sysv_ipc;
pub mod tcp_repair;
pub mod timerfd;
pub mod uffd;
