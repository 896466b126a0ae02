//! Memfds (`FdKind::Memfd`): saved like a deleted file (their contents,
//! sparsely, whatever their size, copied in pass 1 by `deleted.rs`) with
//! their name, size, mode and seals; made anew at the restore, one per
//! inode in a process, each descriptor opened again with its flags and
//! offset. Refused: one whose seals or file system could not be read, one
//! on huge pages, one shared by two processes (it would come back as two).

use super::{Kind, Remake, move_fd_setting_cloexec, reopen_unnamed};
use crate::batch::write_path;
use crate::fdstate::SparseCopy;
use crate::inject::Tracee;
use crate::model::{FdImage, FdKind, ProcessImage};
use crate::template::Template;
use crate::{Error, Result};

/// Memfds.
pub(crate) struct Memfd;

impl Kind for Memfd {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::Memfd { name, probed: false, .. } => {
                Err(format!("memfd {name}: its size, seals or file system could not be read"))
            }
            FdKind::Memfd { name, hugetlb: true, .. } => {
                Err(format!("memfd {name} on huge pages (MFD_HUGETLB is not captured yet)"))
            }
            _ => Ok(()),
        }
    }

    /// One new memfd per inode (same name, the checkpoint's contents and
    /// seals), opened again for each of its descriptors.
    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        let FdKind::Memfd { name, ino, size, seals, mode, .. } = &f.kind else { return Ok(()) };
        if f.same_as.is_some() {
            return Ok(());
        }
        if let Some(&(_, source, _)) = cx.memfds.iter().find(|(i, ..)| i == ino) {
            return reopen_unnamed(cx.p, cx.scratch, f, source, false);
        }
        let copy = cx.contents(f.fd);
        let tmp = make(cx.p, cx.scratch, name, copy.as_deref(), (*size, *mode), *seals)?;
        // The descriptor memfd_create gave (read-write) is the memfd's own
        // open file, which, unlike a new open through /proc, does not count
        // as a writer: a process that runs the memfd's program through it
        // (fexecve) would otherwise fail with ETXTBSY. So a read-write
        // descriptor becomes that one; another one opens it again.
        if f.flags & libc::O_ACCMODE as u32 != libc::O_RDWR as u32 {
            cx.memfds.push((*ino, tmp, true));
            return reopen_unnamed(cx.p, cx.scratch, f, tmp, false);
        }
        let p = &mut *cx.p;
        let status = (f.flags & !(libc::O_ACCMODE | libc::O_CLOEXEC | libc::O_LARGEFILE) as u32) as u64;
        if status != 0 {
            p.call("fcntl(F_SETFL) (memfd)", libc::SYS_fcntl, &[tmp, libc::F_SETFL as u64, status])?;
        }
        if f.pos > 0 {
            p.call("lseek (memfd)", libc::SYS_lseek, &[tmp, f.pos, libc::SEEK_SET as u64])?;
        }
        // (memfd_create set no close-on-exec.)
        move_fd_setting_cloexec(p, tmp, f.fd, f.flags)?;
        cx.memfds.push((*ino, f.fd as u64, false));
        Ok(())
    }

    fn remade_all(&self, cx: &mut Remake<'_>) -> Result<()> {
        for (_, tmp, spare) in std::mem::take(&mut cx.memfds) {
            if spare {
                cx.p.call("close", libc::SYS_close, &[tmp])?;
            }
        }
        Ok(())
    }
}

/// A memfd named `name` holding `copy`'s contents (`size` long, mode bits
/// `mode`) with `seals`, on a new descriptor of the process (closed by the
/// caller).
fn make(
    p: &mut Tracee,
    scratch: u64,
    name: &str,
    copy: Option<&SparseCopy>,
    (size, mode): (u64, u32),
    seals: u32,
) -> Result<u64> {
    let pid = p.tid;
    let addr = write_path(pid, scratch, name)?;
    let tmp = p.call("memfd_create", libc::SYS_memfd_create, &[addr, libc::MFD_ALLOW_SEALING as u64])?;
    super::deleted::fill_file(pid, tmp as i32, copy).map_err(|e| Error::Proc {
        pid,
        what: "memfd contents",
        source: e,
    })?;
    if size > 0 {
        p.call("ftruncate (memfd)", libc::SYS_ftruncate, &[tmp, size])?;
    }
    if mode != 0o777 {
        p.call("fchmod (memfd)", libc::SYS_fchmod, &[tmp, mode as u64])?;
    }
    if seals != 0 {
        p.call("fcntl(F_ADD_SEALS)", libc::SYS_fcntl, &[tmp, libc::F_ADD_SEALS as u64, seals as u64])?;
    }
    Ok(tmp)
}

/// A memfd is made anew per process at the restore: one that another
/// process shares (inherited, or passed) would come back as two.
pub(crate) fn shared_with(t: &Template, made: &[Template]) -> Result<()> {
    let inos = |t: &Template| -> Vec<(u64, String)> {
        t.image
            .fds
            .iter()
            .filter_map(|f| match &f.kind {
                FdKind::Memfd { ino, name, .. } => Some((*ino, name.clone())),
                _ => None,
            })
            .collect()
    };
    let mine = inos(t);
    for other in made {
        if let Some((_, name)) = inos(other).into_iter().find(|(ino, _)| mine.iter().any(|(i, _)| i == ino)) {
            return Err(Error::unsupported(
                t.image.pid,
                &t.image.comm,
                "memfd",
                format!("memfd {name} is shared with process {} (memfds are restored per process)", other.image.pid),
            ));
        }
    }
    Ok(())
}
