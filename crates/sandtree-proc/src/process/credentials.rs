//! A process's credentials where a fork does not copy them: a child made
//! again by its parent (`transplant.rs`) starts with the parent's, and a
//! child that runs as another user than its parent (`su user -c cmd`,
//! `subprocess.Popen(user=...)`, a server's workers after they dropped
//! privileges) is given its own back.
//!
//! What is set, in the child, in this order (each only where it differs
//! from the parent's): the capability bounding set (`PR_CAPBSET_DROP` of
//! what the template's lacks), the supplementary groups (`setgroups`), the
//! gids (`setresgid`, then `setfsgid`), the uids (`setresuid` with
//! `PR_SET_KEEPCAPS` on, so that the permitted set survives to be set
//! next; then `setfsuid`), the effective, permitted and inheritable sets
//! (`capset`), the ambient set (`PR_CAP_AMBIENT_RAISE`), `no_new_privs`.
//! Ids are the sandbox's (the template's, read by the daemon in host ids,
//! mapped through the child's `uid_map` and `gid_map`).
//!
//! What the parent cannot give is refused at the checkpoint
//! ([`refusal`]): capabilities the parent does not have (permitted or
//! bounding), credentials other than its own without `CAP_SETUID`,
//! `CAP_SETGID` and `CAP_SETPCAP`, seccomp filters other than its own,
//! `no_new_privs` off under a parent that has it on. Not seen: securebits
//! (`SECBIT_*`), which `status` does not show; the child gets its parent's.

use std::io;

use crate::batch::{Arg, Batch};
use crate::inject::Tracee;
use crate::model::ProcessImage;
use crate::{Error, HostPid, Result};

/// `CAP_SETGID`, `CAP_SETUID`, `CAP_SETPCAP`.
const CHANGE_IDS: u64 = (1 << 6) | (1 << 7) | (1 << 8);
/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// `PR_CAP_AMBIENT` and its `PR_CAP_AMBIENT_RAISE`.
const PR_CAP_AMBIENT: u64 = 47;
const PR_CAP_AMBIENT_RAISE: u64 = 2;

/// The credentials `status` shows (host ids).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Status {
    uids: [u32; 4],
    gids: [u32; 4],
    groups: Vec<u32>,
    inheritable: u64,
    permitted: u64,
    effective: u64,
    bounding: u64,
    ambient: u64,
    no_new_privs: bool,
    seccomp: (String, String),
}

impl Status {
    /// Of process `host`: its ids as `procfs` reads them, the rest from
    /// the same text.
    fn of(host: HostPid) -> io::Result<Status> {
        let st = crate::procfs::status(host)?;
        Ok(Status { uids: st.uids, gids: st.gids, groups: st.groups.clone(), ..Status::from_text(&st.text) })
    }

    /// From the lines of a `status` text (or of a fingerprint, which has
    /// them: `incremental::fingerprint`).
    fn from_text(text: &str) -> Status {
        let line = |key: &str| {
            text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')).map(str::trim).unwrap_or_default()
        };
        let caps = |key: &str| u64::from_str_radix(line(key), 16).unwrap_or(0);
        let ids = |key: &str| {
            let mut out = [0u32; 4];
            for (o, v) in out.iter_mut().zip(line(key).split_whitespace()) {
                *o = v.parse().unwrap_or(0);
            }
            out
        };
        Status {
            uids: ids("Uid"),
            gids: ids("Gid"),
            groups: line("Groups").split_whitespace().filter_map(|g| g.parse().ok()).collect(),
            inheritable: caps("CapInh"),
            permitted: caps("CapPrm"),
            effective: caps("CapEff"),
            bounding: caps("CapBnd"),
            ambient: caps("CapAmb"),
            no_new_privs: line("NoNewPrivs") == "1",
            seccomp: (line("Seccomp").to_string(), line("Seccomp_filters").to_string()),
        }
    }

    /// Whether only what a fork copies as it is: the same everything.
    fn ids_and_caps(&self) -> ([u32; 4], [u32; 4], &[u32], [u64; 5]) {
        let caps = [self.inheritable, self.permitted, self.effective, self.bounding, self.ambient];
        (self.uids, self.gids, &self.groups, caps)
    }
}

/// Pass 2: why child `image` (template `host`) could not be given its
/// credentials by its parent (`parent`, template `parent_host`), if it
/// could not.
pub(crate) fn refusal(
    (image, host): (&ProcessImage, HostPid),
    (parent, parent_host): (&ProcessImage, HostPid),
) -> Option<String> {
    let (Ok(child), Ok(theirs)) = (Status::of(host), Status::of(parent_host)) else {
        return Some("its credentials or its parent's could not be read".into());
    };
    let _ = image;
    if child.seccomp != theirs.seccomp {
        return Some(format!(
            "it runs with other seccomp filters than its parent (pid {}), which makes it again at a restore (not captured yet)",
            parent.pid
        ));
    }
    if theirs.no_new_privs && !child.no_new_privs {
        return Some(format!("its parent (pid {}) has no_new_privs set and it has not", parent.pid));
    }
    if child.ids_and_caps() == theirs.ids_and_caps() {
        return None;
    }
    if theirs.effective & CHANGE_IDS != CHANGE_IDS {
        return Some(format!(
            "it runs with other credentials than its parent (pid {}), which makes it again at a restore and has no CAP_SETUID, CAP_SETGID and CAP_SETPCAP to give them",
            parent.pid
        ));
    }
    let beyond = (child.permitted & !theirs.permitted) | (child.bounding & !theirs.bounding);
    if beyond != 0 {
        return Some(format!(
            "it has capabilities (mask {beyond:x}) its parent (pid {}), which makes it again at a restore, has not",
            parent.pid
        ));
    }
    None
}

/// A host id as the sandbox sees it, through `map` (`uid_map` or
/// `gid_map`: "inside outside count" lines).
fn inside(map: &str, host_id: u32) -> Option<u32> {
    map.lines().find_map(|l| {
        let mut f = l.split_whitespace().map(|v| v.parse::<u64>().ok());
        let (Some(Some(inside)), Some(Some(outside)), Some(Some(count))) = (f.next(), f.next(), f.next()) else {
            return None;
        };
        let id = u64::from(host_id);
        (id >= outside && id < outside + count).then(|| (inside + id - outside) as u32)
    })
}

/// Give child `c` (made by its parent, whose credentials it has) template
/// `template`'s credentials (see the module docs). Changing ids clears the
/// dumpable flag and the parent-death signal: the caller sets them after.
pub(crate) fn become_template(c: &mut Tracee, b: &mut Batch, template: HostPid) -> Result<()> {
    let want = Status::of(template).map_err(|e| Error::Proc { pid: template, what: "credentials", source: e })?;
    become_as(c, b, &want)
}

/// [`become_template`] for a process made from an image: the credentials
/// its fingerprint shows (`ForkState::fingerprint`, host ids).
pub(crate) fn become_from_fingerprint(c: &mut Tracee, b: &mut Batch, fingerprint: &str) -> Result<()> {
    become_as(c, b, &Status::from_text(fingerprint))
}

fn become_as(c: &mut Tracee, b: &mut Batch, want: &Status) -> Result<()> {
    let child = c.tid;
    let now = Status::of(child).map_err(|e| Error::Proc { pid: child, what: "credentials", source: e })?;
    if want.ids_and_caps() == now.ids_and_caps() {
        return Ok(());
    }
    let map = |what: &str| {
        std::fs::read_to_string(format!("/proc/{child}/{what}")).map_err(|e| Error::Proc {
            pid: child,
            what: "id map",
            source: e,
        })
    };
    let (uid_map, gid_map) = (map("uid_map")?, map("gid_map")?);
    let unmapped = |id| Error::Remote {
        pid: child,
        call: "credentials",
        errno: io::Error::other(format!("host id {id} is not mapped in the sandbox")),
    };
    let uid = |id: u32| inside(&uid_map, id).ok_or_else(|| unmapped(id)).map(u64::from);
    let gid = |id: u32| inside(&gid_map, id).ok_or_else(|| unmapped(id)).map(u64::from);
    let prctl = |b: &mut Batch, what: &'static str, args: [u64; 2]| {
        let args = [Arg::Val(args[0]), Arg::Val(args[1]), Arg::Val(0), Arg::Val(0), Arg::Val(0)];
        b.call(what, libc::SYS_prctl, &args);
    };
    for cap in (0..64).filter(|cap| now.bounding & !want.bounding & (1 << cap) != 0) {
        prctl(b, "prctl(PR_CAPBSET_DROP)", [libc::PR_CAPBSET_DROP as u64, cap]);
    }
    if want.groups != now.groups {
        let groups: Vec<u8> = want
            .groups
            .iter()
            .map(|&g| gid(g).map(|g| g as u32))
            .collect::<Result<Vec<u32>>>()?
            .iter()
            .flat_map(|g| g.to_ne_bytes())
            .collect();
        let list = b.data(&groups);
        b.call("setgroups", libc::SYS_setgroups, &[Arg::Val(want.groups.len() as u64), list]);
    }
    let [r, e, s, fs] = want.gids;
    b.call("setresgid", libc::SYS_setresgid, &[Arg::Val(gid(r)?), Arg::Val(gid(e)?), Arg::Val(gid(s)?)]);
    b.call("setfsgid", libc::SYS_setfsgid, &[Arg::Val(gid(fs)?)]);
    prctl(b, "prctl(PR_SET_KEEPCAPS)", [libc::PR_SET_KEEPCAPS as u64, 1]);
    let [r, e, s, fs] = want.uids;
    b.call("setresuid", libc::SYS_setresuid, &[Arg::Val(uid(r)?), Arg::Val(uid(e)?), Arg::Val(uid(s)?)]);
    b.call("setfsuid", libc::SYS_setfsuid, &[Arg::Val(uid(fs)?)]);
    prctl(b, "prctl(PR_SET_KEEPCAPS)", [libc::PR_SET_KEEPCAPS as u64, 0]);
    // struct __user_cap_header_struct, then two __user_cap_data_struct
    // (effective, permitted, inheritable: low words, then high words).
    let mut header = Vec::with_capacity(8);
    header.extend_from_slice(&CAPABILITY_VERSION_3.to_ne_bytes());
    header.extend_from_slice(&0i32.to_ne_bytes());
    let mut data = Vec::with_capacity(24);
    for shift in [0, 32] {
        for set in [want.effective, want.permitted, want.inheritable] {
            data.extend_from_slice(&((set >> shift) as u32).to_ne_bytes());
        }
    }
    let (header, data) = (b.data(&header), b.data(&data));
    b.call("capset", libc::SYS_capset, &[header, data]);
    for cap in (0..64).filter(|cap| want.ambient & (1 << cap) != 0) {
        let args = [Arg::Val(PR_CAP_AMBIENT), Arg::Val(PR_CAP_AMBIENT_RAISE), Arg::Val(cap), Arg::Val(0), Arg::Val(0)];
        b.call("prctl(PR_CAP_AMBIENT_RAISE)", libc::SYS_prctl, &args);
    }
    if want.no_new_privs && !now.no_new_privs {
        prctl(b, "prctl(PR_SET_NO_NEW_PRIVS)", [libc::PR_SET_NO_NEW_PRIVS as u64, 1]);
    }
    c.run_batch(b)?;
    Ok(())
}
