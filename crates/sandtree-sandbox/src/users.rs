//! The sandbox's users, for a process started as one of them (`exec`'s
//! `user`): looked up by init, inside the sandbox, in its own
//! `/etc/passwd` and `/etc/group` (the image's, as the sandbox changed
//! them), and taken on by the child between its fork and its `exec`.
//!
//! `/etc/passwd`: `name:password:uid:gid:gecos:home:shell`, one account a
//! line; `/etc/group`: `name:password:gid:member,member,...`. A numeric
//! user not in `/etc/passwd` is that uid, with that number as its group
//! and `/` as its home.

use std::fs;

/// An account of the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// Its name (the number, for a uid `/etc/passwd` does not list).
    pub name: String,
    /// User id (in the sandbox).
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups: those `/etc/group` lists it in.
    pub groups: Vec<u32>,
    /// Home directory.
    pub home: String,
}

/// Account `user` (a name or a uid) in this root's `/etc/passwd` and
/// `/etc/group`.
pub fn look_up(user: &str) -> Result<Account, String> {
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let groups = fs::read_to_string("/etc/group").unwrap_or_default();
    find(user, &passwd, &groups)
}

/// [`look_up`] in the texts of `/etc/passwd` and `/etc/group`.
pub fn find(user: &str, passwd: &str, group: &str) -> Result<Account, String> {
    let number: Option<u32> = user.parse().ok();
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && (f[0] == user || (number.is_some() && f[2].parse::<u32>().ok() == number)));
    let mut account = match (entry, number) {
        (Some(f), _) => Account {
            name: f[0].to_string(),
            uid: f[2].parse().map_err(|_| format!("bad uid for {} in /etc/passwd", f[0]))?,
            gid: f[3].parse().map_err(|_| format!("bad gid for {} in /etc/passwd", f[0]))?,
            groups: Vec::new(),
            home: if f[5].is_empty() { "/".into() } else { f[5].to_string() },
        },
        (None, Some(uid)) => Account { name: user.to_string(), uid, gid: uid, groups: Vec::new(), home: "/".into() },
        (None, None) => {
            return Err(format!(
                "no user {user:?} in the sandbox's /etc/passwd (create it first, e.g. `useradd -m {user}`, or give a uid)"
            ));
        }
    };
    for f in group.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() >= 4) {
        if f[3].split(',').any(|m| m == account.name)
            && let Ok(gid) = f[2].parse()
            && !account.groups.contains(&gid)
        {
            account.groups.push(gid);
        }
    }
    Ok(account)
}

/// Take on `a`'s groups, group ids and user ids (real, effective and
/// saved): the calling process keeps no capability.
pub fn become_user(a: &Account) -> nix::Result<()> {
    use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};
    let groups: Vec<Gid> = a.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    setgroups(&groups)?;
    let g = Gid::from_raw(a.gid);
    setresgid(g, g, g)?;
    let u = Uid::from_raw(a.uid);
    setresuid(u, u, u)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\nnohome:x:1001:100::::\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:user\nusers:x:100:user,other\nuser:x:1000:\n";

    #[test]
    fn by_name_by_uid_and_unknown() {
        let a = find("user", PASSWD, GROUP).unwrap();
        assert_eq!((a.uid, a.gid, a.home.as_str(), a.groups.clone()), (1000, 1000, "/home/user", vec![27, 100]));
        assert_eq!(find("1000", PASSWD, GROUP).unwrap(), a);
        let n = find("1001", PASSWD, GROUP).unwrap();
        assert_eq!((n.name.as_str(), n.home.as_str()), ("nohome", "/"));
        let u = find("4242", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str(), u.groups.len()), (4242, 4242, "/", 0));
        let e = find("ghost", PASSWD, GROUP).unwrap_err();
        assert!(e.contains("no user \"ghost\""), "{e}");
    }
}
