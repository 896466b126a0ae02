//! A page file: a memfd whose pages are allocated ahead, mapped shared into
//! the daemon.
//!
//! The pages a tracked process wrote since its last checkpoint are copied
//! into it in the frozen window by a task that shares the process's
//! address space (its *holder*, `sandtree-proc/src/holder.rs`), with a
//! `pwritev` of those pages into the memfd: a copy in the process's own
//! address space, ~3-6x faster here than `process_vm_readv` from the
//! daemon, which looks every page up in the other process's page tables
//! and pins it. The daemon then reads the bytes through its mapping.
//!
//! The file is allocated ahead (`fallocate`) when it is made or grown,
//! between operations: allocating and zeroing shmem pages during a copy
//! costs more than the copy itself.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

/// A memfd of `len` allocated bytes, mapped shared.
pub struct PageFile {
    file: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes
// through `&self` / `&mut self` like a `Vec<u8>`'s.
unsafe impl Send for PageFile {}
// SAFETY: as above; `&self` only reads.
unsafe impl Sync for PageFile {}

impl PageFile {
    /// Take memfd `file` (made by another process and taken with
    /// `pidfd_getfd`), size it to `len` bytes allocated, and map it.
    pub fn new(file: OwnedFd, len: usize) -> io::Result<PageFile> {
        let mut f = PageFile { file, ptr: std::ptr::null_mut(), len: 0 };
        f.grow(len)?;
        Ok(f)
    }

    /// At least `len` bytes, allocated (mapped anew when it grows). The
    /// file is sealed against shrinking first: the process that made it
    /// (a holder in a sandbox, whose descriptor sandboxed code may reach
    /// through `/proc`) could otherwise truncate it under the mapping, and
    /// the daemon's next read of it would take `SIGBUS`.
    pub fn grow(&mut self, len: usize) -> io::Result<()> {
        if len <= self.len && !self.ptr.is_null() {
            return Ok(());
        }
        let size = |f: &OwnedFd| rustix::fs::fstat(f).map(|st| st.st_size.max(0) as usize);
        let len = len.max(self.len).max(size(&self.file)?).next_multiple_of(4096).max(4096);
        if size(&self.file)? < len {
            rustix::fs::ftruncate(&self.file, len as u64)?;
        }
        // (Sealed already when taken again from its holder.)
        let seals = rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::SEAL;
        if !rustix::fs::fcntl_get_seals(&self.file)?.contains(rustix::fs::SealFlags::SHRINK) {
            rustix::fs::fcntl_add_seals(&self.file, seals)?;
        }
        if size(&self.file)? < len {
            return Err(io::Error::other("the page file was truncated before it was sealed"));
        }
        rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::empty(), 0, len as u64)?;
        // SAFETY: a fresh shared mapping of our own descriptor, at an
        // address the kernel picks; nothing aliases it yet.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                std::os::fd::AsRawFd::as_raw_fd(&self.file),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        self.unmap();
        self.ptr = ptr.cast();
        self.len = len;
        Ok(())
    }

    fn unmap(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr`/`len` are the mapping made by `grow`, and no
            // borrow of it outlives `&mut self`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
            self.ptr = std::ptr::null_mut();
        }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never, once made).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its bytes. (Written by another process only while a `pwritev` of
    /// ours runs there: the caller reads them once it returned.)
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Its bytes, to read other pages into (`uffd::read_pages`). The
    /// caller gives another process's `pwritev` only ranges it does not
    /// touch through this borrow meanwhile.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The memfd.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl Drop for PageFile {
    fn drop(&mut self) {
        self.unmap();
    }
}

#[cfg(test)]
mod tests {
    use super::PageFile;

    /// Bytes written through the descriptor show in the mapping, which
    /// keeps them when it grows.
    #[test]
    fn writes_show_through_the_mapping() {
        let flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING;
        let fd = rustix::fs::memfd_create("pagefile-test", flags).expect("memfd");
        let mut f = PageFile::new(fd, 5000).expect("page file");
        assert_eq!(f.len(), 8192);
        rustix::io::pwrite(f.fd(), b"hello", 4096).expect("pwrite");
        assert_eq!(&f.bytes()[4096..4101], b"hello");
        f.bytes_mut()[0] = 7;
        f.grow(3 << 20).expect("grow");
        assert_eq!(f.len(), 3 << 20);
        assert_eq!((f.bytes()[0], &f.bytes()[4096..4101]), (7, &b"hello"[..]));
        // Sealed: nobody shrinks it under the mapping.
        assert!(rustix::fs::ftruncate(f.fd(), 4096).is_err(), "a sealed page file shrank");
        // Taken again (a duplicate of its descriptor): no smaller.
        let again = PageFile::new(f.fd().try_clone_to_owned().expect("dup"), 4096).expect("taken again");
        assert_eq!(again.len(), 3 << 20);
    }
}
