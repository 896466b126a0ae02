//! The two kinds of pid this engine handles, as two types.
//!
//! A sandbox runs in a pid namespace of its own, so each of its tasks has
//! two pids:
//! - [`HostPid`]: the pid as the daemon sees it, in the host's (its own)
//!   pid namespace. What ptrace, `/proc/<pid>/`, `kill`, `pidfd_open`,
//!   `cgroup.procs` and the scheduler calls take and give. Every process
//!   the tracer holds (an original it stopped, a template, a standby, a
//!   holder, a dying one) is reached by its host pid; a tid is a pid on
//!   Linux, so a thread's host tid is one too.
//! - [`SandboxPid`]: the pid inside the sandbox's pid namespace (the last
//!   field of `NSpid`). What the sandbox's own processes see (`getpid`,
//!   `ppid`, process groups and sessions), what a checkpoint saves in its
//!   image and reports, what `clone3` takes in `set_tid`, and what init's
//!   kill list spares.
//!
//! The two differ for every process but by accident, and they do not
//! follow each other: a restore gives a process its old [`SandboxPid`]
//! (`clone3` with `set_tid`), while its [`HostPid`] is a new one, whatever
//! the host's namespace had free. So an image or a report keeps sandbox
//! pids only; a host pid is good for as long as the engine holds that very
//! process (a template, a holder, an original stopped for a checkpoint),
//! and a restored process's is learnt from the clone that made it.
//!
//! Both are plain numbers at the syscall boundary ([`HostPid::raw`],
//! [`SandboxPid::raw`], or `.0`), print as the number (`Display` and
//! `Debug` alike: a message or a log that shows a pid, or a list of them,
//! reads as it did), and serialize as the number (`serde(transparent)`):
//! saved images and reports read as they did with bare `i32`s. (The type
//! says which kind a pid is; its text does not.)

use serde::{Deserialize, Serialize};

/// A pid (or tid) in the host's pid namespace: the daemon's view (see the
/// module docs). (Its default, 0, is no process: "none", "not known yet".)
#[derive(Copy, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(transparent)]
#[serde(transparent)]
pub struct HostPid(pub i32);

/// A pid (or tid) in the sandbox's pid namespace: the sandbox's own view,
/// which its images and reports keep (see the module docs). (Its default,
/// 0, is no process.)
#[derive(Copy, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(transparent)]
#[serde(transparent)]
pub struct SandboxPid(pub i32);

impl HostPid {
    /// The number, for a syscall (or `/proc` path) of the host's namespace.
    pub const fn raw(self) -> i32 {
        self.0
    }
}

impl SandboxPid {
    /// The sandbox's init: pid 1 of its namespace (a process whose parent
    /// it is has this `ppid`).
    pub const INIT: SandboxPid = SandboxPid(1);

    /// The number, for a call made inside the sandbox (`set_tid`, an
    /// injected `rt_sigqueueinfo`) or a message to its init.
    pub const fn raw(self) -> i32 {
        self.0
    }

    /// One past the highest pid (`kernel.pid_max`, read once; 32768 if it
    /// cannot be read): the range of every pid namespace.
    pub fn max() -> i32 {
        static PID_MAX: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
        *PID_MAX.get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/pid_max")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(32768)
        })
    }
}

impl std::fmt::Display for HostPid {
    /// Just the number.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::fmt::Display for SandboxPid {
    /// Just the number.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::fmt::Debug for HostPid {
    /// Just the number, as `Display`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Debug for SandboxPid {
    /// Just the number, as `Display`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::{HostPid, SandboxPid};

    /// A saved type holding both, as reports do (a list, a map keyed by
    /// pid, a field).
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Saved {
        pid: SandboxPid,
        pids: Vec<SandboxPid>,
        comms: BTreeMap<SandboxPid, String>,
        host: HostPid,
    }

    /// The JSON of a saved type is the one it had with bare `i32`s, and
    /// reads back the same (map keys included).
    #[test]
    fn pids_serialize_as_bare_numbers() {
        let saved = Saved {
            pid: SandboxPid(7),
            pids: vec![SandboxPid(1), SandboxPid(42)],
            comms: [(SandboxPid(42), "sh".to_string())].into(),
            host: HostPid(31337),
        };
        let json = serde_json::to_string(&saved).expect("serialize");
        assert_eq!(json, r#"{"pid":7,"pids":[1,42],"comms":{"42":"sh"},"host":31337}"#);
        assert_eq!(serde_json::from_str::<Saved>(&json).expect("deserialize"), saved);
    }

    /// Display and Debug are the number, with the formatter's width and
    /// alignment: a list of pids reads as a list of numbers.
    #[test]
    fn pids_display_as_the_number() {
        assert_eq!(format!("pid {} of {}", SandboxPid(3), HostPid(4021)), "pid 3 of 4021");
        assert_eq!(format!("[{:>5}]", HostPid(12)), "[   12]");
        assert_eq!(format!("pids {:?}", [SandboxPid(2), SandboxPid(7)]), "pids [2, 7]");
        assert_eq!(format!("{:?}", Some(HostPid(4021))), "Some(4021)");
    }
}
