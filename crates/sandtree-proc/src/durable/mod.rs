//! Durable process images: a checkpoint's process state written to a file,
//! so that it outlives its templates (a daemon restart, templates killed
//! or evicted) and can be read elsewhere (a fork into new sandboxes).
//!
//! A *durable image* (or process image) is one file per checkpoint,
//! `<images dir>/<checkpoint id>.img`, written after the checkpoint call
//! returned (in the agent's think time), from the checkpoint's templates:
//! their [`crate::model::ProcessImage`]s, what a fork copies that only the
//! template can tell (signal handlers, FPU state, limits, ...:
//! [`crate::model::ForkState`]), the saved contents of pipes, sockets, shared memory and
//! deleted files, and their memory pages. It is **incremental**: a page
//! equal (byte for byte) to the page at the same address of the same
//! process in the parent checkpoint's image is not written again; the
//! index points at the parent's copy (or its parent's: an image lists
//! every image its index reads from, `sources`).
//!
//! # File layout (format version 1, little endian)
//!
//! ```text
//! offset  size   field
//! 0       8      magic "STPROCIM"
//! 8       4      format version (1); a reader refuses a newer one
//! 12      4      section count n
//! 16      8      file length (a shorter file is truncated)
//! 24      4      CRC-32 of bytes 0..24 and of the section table
//! 28      4      0
//! 32      32*n   section table, one entry per section:
//!                  kind u32, 0 u32, offset u64, length u64, CRC-32 u32, 0 u32
//! ...            the sections, each at its offset (page data at a
//!                multiple of 4096)
//! ```
//!
//! | kind | section | contents | checksum |
//! |------|---------|----------|----------|
//! | 1 | tree | [`ImageTree`] as JSON | CRC-32 of the section |
//! | 2 | page index | per process (pid u32, run count u32), its runs (start u64, pages u32, source u32, first page u64), then a CRC-32 per page of its runs, in order | CRC-32 of the section |
//! | 3 | page data | the pages this image wrote, 4096 bytes each, in index order | per page, in the index |
//! | 4 | blobs | bytes the tree points at by ([`Blob`]: offset, length): deleted files' and shared memory's data runs | CRC-32 of the section |
//!
//! A run's `source` is an index into [`ImageTree::sources`] (0: this
//! image; [`ZERO_SOURCE`]: pages of zeros, stored nowhere), and `first` the
//! number of its first page in that image's page data. Every page a
//! process holds of its own (anonymous, present or swapped out:
//! [`sandtree_sys::uffd::own_pages`]) is in the index; any other page of
//! a private mapping reads from its file, or as zeros.
//!
//! The file is written under a temporary name, synced and renamed: an
//! image is whole or absent. [`format::Image::open`] checks the magic, the
//! version, the length and every section's checksum (page data page by
//! page, as it is read) and names the checkpoint in its error.

pub(crate) mod collect;
pub mod format;
pub mod read;
pub(crate) mod templates;
pub mod write;

use serde::{Deserialize, Serialize};

use crate::check::Unrestorable;
use crate::model::{ForkState, PipeBuffer, ProcessImage, SocketBuffer};

pub use collect::{ParentTemplate, SharedSource, SourceProcess, Sources};
pub use format::{Image, ImageSummary};
pub use read::PageSource;
pub use templates::restorable;
pub use write::{WriteReport, image_path, write_image};

/// A run's source for pages of zeros (stored nowhere).
pub const ZERO_SOURCE: u32 = u32::MAX;

/// Size of a page.
pub const PAGE: u64 = 4096;

/// Errors of durable images.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the file failed.
    #[error("process image {path}: {source}")]
    Io {
        /// The image file.
        path: std::path::PathBuf,
        /// Error.
        source: std::io::Error,
    },
    /// The file is not a process image, or is damaged.
    #[error("process image {path} is corrupt: {what}")]
    Corrupt {
        /// The image file.
        path: std::path::PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The file was written by a newer Sandtree.
    #[error("process image {path} has format version {found}; this Sandtree reads version {supported} and older")]
    NewerVersion {
        /// The image file.
        path: std::path::PathBuf,
        /// Its version.
        found: u32,
        /// What this build reads.
        supported: u32,
    },
    /// A template went away while its memory was read.
    #[error("the template of pid {pid} ended before its image was written")]
    TemplateGone {
        /// The process's pid in the sandbox.
        pid: crate::SandboxPid,
    },
    /// A process's memory or `/proc` could not be read.
    #[error("pid {pid}: {what}: {source}")]
    Proc {
        /// Host pid of the template.
        pid: crate::HostPid,
        /// What was read.
        what: &'static str,
        /// Error.
        source: std::io::Error,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

/// Bytes of the blobs section: `len` bytes at `offset` of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub offset: u64,
    pub len: u64,
}

/// A file's data saved sparsely: its size and data runs (file offset,
/// the bytes in the blobs section); the rest is holes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparseFile {
    pub size: u64,
    pub runs: Vec<(u64, Blob)>,
}

/// One process of the image.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageProcess {
    pub image: ProcessImage,
    pub fork: ForkState,
    /// Contents of its deleted-but-open files and memfds, by descriptor.
    pub files: Vec<(i32, SparseFile)>,
}

/// The saved contents of one shared memory object (`process::shared_memory`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageSharedMemory {
    /// (device, inode, a SysV segment).
    pub key: (u64, u64, bool),
    pub data: SparseFile,
    /// A memfd's seals and permission bits.
    pub memfd: Option<(u32, u32)>,
}

/// The tree section: everything of the checkpoint's processes but their
/// pages.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageTree {
    /// The checkpoint this is the image of.
    pub checkpoint: String,
    /// The image its pages were compared against (its parent
    /// checkpoint's), if any.
    pub parent: Option<String>,
    /// The images whose page data the index reads, by checkpoint id;
    /// `sources[0]` is this one.
    pub sources: Vec<String>,
    /// Parents before children.
    pub processes: Vec<ImageProcess>,
    /// Bytes in pipes.
    pub pipes: Vec<PipeBuffer>,
    /// Data queued on unix sockets sent again by their peer.
    pub sockets: Vec<SocketBuffer>,
    /// Data queued on the ends of unix socket pairs.
    pub pair_data: Vec<SocketBuffer>,
    pub shared_memory: Vec<ImageSharedMemory>,
    /// Processes of the sandbox the checkpoint could not capture.
    pub unrestorable: Vec<Unrestorable>,
    /// The descriptors of kinds a template keeps from its original
    /// (eventfds, timerfds, signalfds, epolls) that are one open file,
    /// shared between processes or dup'd in one: groups of (pid,
    /// descriptor) of two or more, found with `kcmp(KCMP_FILE)` between the
    /// templates by the writer. `None` in an image written before it was
    /// recorded: those kinds are then refused by a restore from it.
    #[serde(default)]
    pub open_files: Option<Vec<Vec<(crate::SandboxPid, i32)>>>,
}
