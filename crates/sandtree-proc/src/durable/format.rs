//! Encoding and decoding of the image file (layout: the module docs of
//! [`crate::durable`]). [`Encoder`] writes one section after another and
//! the header last; [`Image::open`] checks everything but the page data,
//! whose pages are checked as they are read ([`Image::read_pages`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Blob, Error, ImageTree, PAGE, Result, ZERO_SOURCE};

/// The file's first eight bytes.
pub const MAGIC: [u8; 8] = *b"STPROCIM";
/// The format version this build writes and reads (and older ones).
pub const FORMAT_VERSION: u32 = 1;

const HEADER: usize = 32;
const ENTRY: usize = 32;
/// Room kept at the start of the file for the header and section table.
const RESERVED: u64 = PAGE;
/// Most sections a file may list (a bound for the decoder).
const MAX_SECTIONS: u32 = 64;
/// Largest tree or index section the decoder reads into memory.
const MAX_METADATA: u64 = 1 << 30;

/// Section kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    Tree = 1,
    PageIndex = 2,
    PageData = 3,
    Blobs = 4,
}

/// One entry of the section table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    kind: u32,
    offset: u64,
    len: u64,
    crc: u32,
}

/// A run of pages of one process in the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PageRun {
    /// Address of its first page.
    pub start: u64,
    /// Number of pages.
    pub pages: u32,
    /// Index into [`ImageTree::sources`], or [`ZERO_SOURCE`].
    pub source: u32,
    /// Number of its first page in that source's page data.
    pub first: u64,
}

/// The pages of one process: its runs and a CRC-32 per page, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessPages {
    pub pid: u32,
    pub runs: Vec<PageRun>,
    pub crcs: Vec<u32>,
}

impl ProcessPages {
    /// Every page: (address, source, page number in the source, CRC-32).
    pub fn pages(&self) -> impl Iterator<Item = (u64, u32, u64, u32)> + '_ {
        let mut crcs = self.crcs.iter().copied();
        self.runs.iter().flat_map(|r| (0..u64::from(r.pages)).map(move |i| (r, i))).map(move |(r, i)| {
            let first = if r.source == ZERO_SOURCE { 0 } else { r.first + i };
            (r.start + i * PAGE, r.source, first, crcs.next().unwrap_or(0))
        })
    }
}

/// The index section, encoded.
pub(crate) fn encode_index(index: &[ProcessPages]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(index.len() as u32).to_le_bytes());
    for p in index {
        out.extend_from_slice(&p.pid.to_le_bytes());
        out.extend_from_slice(&(p.runs.len() as u32).to_le_bytes());
        for r in &p.runs {
            out.extend_from_slice(&r.start.to_le_bytes());
            out.extend_from_slice(&r.pages.to_le_bytes());
            out.extend_from_slice(&r.source.to_le_bytes());
            out.extend_from_slice(&r.first.to_le_bytes());
        }
        for c in &p.crcs {
            out.extend_from_slice(&c.to_le_bytes());
        }
    }
    out
}

/// A cursor over a byte slice whose reads fail rather than panic.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
}

/// The index section decoded, checked against `sources` (how many there
/// are) and `own_pages` (this image's page count).
pub(crate) fn decode_index(
    bytes: &[u8],
    sources: usize,
    own_pages: u64,
) -> std::result::Result<Vec<ProcessPages>, String> {
    let mut c = Cursor { bytes, at: 0 };
    let short = || "the page index ends early".to_string();
    let count = c.u32().ok_or_else(short)?;
    let mut out = Vec::new();
    for _ in 0..count {
        let pid = c.u32().ok_or_else(short)?;
        let runs = c.u32().ok_or_else(short)? as usize;
        // (Each run takes 24 bytes: a count past what is left is damage.)
        if runs > c.left() / 24 {
            return Err(short());
        }
        let mut p = ProcessPages { pid, runs: Vec::with_capacity(runs), crcs: Vec::new() };
        let mut total = 0u64;
        let mut last_end = 0u64;
        for _ in 0..runs {
            let r = PageRun {
                start: c.u64().ok_or_else(short)?,
                pages: c.u32().ok_or_else(short)?,
                source: c.u32().ok_or_else(short)?,
                first: c.u64().ok_or_else(short)?,
            };
            let end = u64::from(r.pages).checked_mul(PAGE).and_then(|len| r.start.checked_add(len));
            let bad = |what: &str| format!("pid {pid}: run at {:#x}: {what}", r.start);
            let Some(end) = end else { return Err(bad("its end is past the address space")) };
            if !r.start.is_multiple_of(PAGE) || r.pages == 0 {
                return Err(bad("not whole pages"));
            }
            if r.start < last_end {
                return Err(bad("overlaps the run before it"));
            }
            if r.source != ZERO_SOURCE && r.source as usize >= sources {
                return Err(bad("names no source image"));
            }
            let past = r.first.checked_add(u64::from(r.pages)).is_none_or(|e| r.source == 0 && e > own_pages);
            if r.source != ZERO_SOURCE && past {
                return Err(bad("reads past the page data"));
            }
            last_end = end;
            total += u64::from(r.pages);
            p.runs.push(r);
        }
        if total > c.left() as u64 / 4 {
            return Err(short());
        }
        p.crcs = (0..total).map(|_| c.u32().ok_or_else(short)).collect::<std::result::Result<_, _>>()?;
        out.push(p);
    }
    if c.left() != 0 {
        return Err("bytes after the page index".into());
    }
    Ok(out)
}

/// Writes an image file: sections one after another, then the header.
/// The file is `<path>.part` until [`Encoder::finish`] renames it.
pub(crate) struct Encoder {
    path: PathBuf,
    part: PathBuf,
    file: File,
    at: u64,
    entries: Vec<Entry>,
    open: Option<(Entry, Option<crc32fast::Hasher>)>,
}

impl Encoder {
    /// Start the file of `path`.
    pub(crate) fn create(path: &Path) -> Result<Encoder> {
        let mut part = path.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let file = File::create(&part).map_err(|source| Error::Io { path: part.clone(), source })?;
        Ok(Encoder { path: path.to_path_buf(), part, file, at: RESERVED, entries: Vec::new(), open: None })
    }

    fn io(&self) -> impl Fn(std::io::Error) -> Error + '_ {
        |source| Error::Io { path: self.part.clone(), source }
    }

    /// Begin a section of `kind` (at a page boundary when `aligned`),
    /// with a checksum of its own when `crc`.
    pub(crate) fn begin(&mut self, kind: Kind, aligned: bool, crc: bool) {
        if aligned {
            self.at = self.at.next_multiple_of(PAGE);
        }
        let entry = Entry { kind: kind as u32, offset: self.at, len: 0, crc: 0 };
        self.open = Some((entry, crc.then(crc32fast::Hasher::new)));
    }

    /// Append `bytes` to the open section.
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.file.write_all_at(bytes, self.at).map_err(self.io())?;
        self.at += bytes.len() as u64;
        if let Some((e, h)) = self.open.as_mut() {
            e.len += bytes.len() as u64;
            if let Some(h) = h {
                h.update(bytes);
            }
        }
        Ok(())
    }

    /// Where the next byte of the open section goes, from its start.
    pub(crate) fn section_len(&self) -> u64 {
        self.open.as_ref().map_or(0, |(e, _)| e.len)
    }

    /// End the open section.
    pub(crate) fn end(&mut self) {
        if let Some((mut e, h)) = self.open.take() {
            e.crc = h.map_or(0, |h| h.finalize());
            self.entries.push(e);
        }
    }

    /// A whole section of `bytes`.
    pub(crate) fn section(&mut self, kind: Kind, bytes: &[u8]) -> Result<()> {
        self.begin(kind, false, true);
        self.write(bytes)?;
        self.end();
        Ok(())
    }

    /// Write the header, sync, and give the file its name: the image is
    /// whole from here. Returns the file's length.
    pub(crate) fn finish(mut self) -> Result<u64> {
        self.end();
        let len = self.at;
        let header = header_bytes(&self.entries, len);
        self.file.write_all_at(&header, 0).map_err(self.io())?;
        self.file.set_len(len).map_err(self.io())?;
        self.file.sync_all().map_err(self.io())?;
        std::fs::rename(&self.part, &self.path).map_err(|source| Error::Io { path: self.path.clone(), source })?;
        if let Some(dir) = self.path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(|source| Error::Io { path: dir.into(), source })?;
        }
        Ok(len)
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // (Renamed already when finished.)
        let _ = std::fs::remove_file(&self.part);
    }
}

/// The header and section table for `entries` in a file of `len` bytes.
fn header_bytes(entries: &[Entry], len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER + ENTRY * entries.len());
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&[0u8; 8]);
    for e in entries {
        h.extend_from_slice(&e.kind.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&e.offset.to_le_bytes());
        h.extend_from_slice(&e.len.to_le_bytes());
        h.extend_from_slice(&e.crc.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
    }
    let crc = header_crc(&h);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A whole image file in memory, from the bytes of its sections (kind,
/// contents; page data at the first page boundary after the table), with
/// a valid header and checksums: for the fuzzer (`fuzz/`), which then
/// reaches past the checksums into the decoders.
#[doc(hidden)]
pub fn assemble(sections: &[(u32, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; RESERVED as usize];
    let mut entries = Vec::new();
    for &(kind, bytes) in sections {
        if kind == Kind::PageData as u32 {
            out.resize(out.len().next_multiple_of(PAGE as usize), 0);
        }
        let crc = if kind == Kind::PageData as u32 { 0 } else { crc32fast::hash(bytes) };
        entries.push(Entry { kind, offset: out.len() as u64, len: bytes.len() as u64, crc });
        out.extend_from_slice(bytes);
    }
    let header = header_bytes(&entries, out.len() as u64);
    let n = header.len().min(out.len());
    out[..n].copy_from_slice(&header[..n]);
    out
}

/// CRC-32 of a header's bytes 0..24 and its section table.
fn header_crc(h: &[u8]) -> u32 {
    let mut c = crc32fast::Hasher::new();
    c.update(&h[..24]);
    c.update(&h[HEADER..]);
    c.finalize()
}

/// An image file, opened and checked.
pub struct Image {
    path: PathBuf,
    file: File,
    tree: ImageTree,
    index: Vec<ProcessPages>,
    /// Page data: (offset, length).
    data: (u64, u64),
    /// Blobs: (offset, length).
    blobs: (u64, u64),
    len: u64,
}

/// What `sandtree checkpoint inspect` shows of an image.
#[derive(Clone, Debug, Serialize)]
pub struct ImageSummary {
    pub checkpoint: String,
    pub format_version: u32,
    pub file_bytes: u64,
    pub parent: Option<String>,
    pub sources: Vec<String>,
    /// Pages stored in this file.
    pub pages_written: u64,
    pub processes: Vec<ProcessSummary>,
    pub blob_bytes: u64,
}

/// One process in an [`ImageSummary`].
#[derive(Clone, Debug, Serialize)]
pub struct ProcessSummary {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub exe: String,
    pub threads: u32,
    pub descriptors: usize,
    pub mappings: usize,
    /// Pages of its own: in total, stored here, in parent images, zeros.
    pub pages: u64,
    pub pages_here: u64,
    pub pages_in_parents: u64,
    pub pages_zero: u64,
}

/// The header, section table and tree of the image file at `path` (open
/// as `file`), checked: the tree, the table's entries, the file's length.
fn read_tree(path: &Path, file: &File) -> Result<(ImageTree, Vec<Entry>, u64)> {
    let corrupt = |what: String| Error::Corrupt { path: path.into(), what };
    let io = |source| Error::Io { path: path.into(), source };
    let len = file.metadata().map_err(io)?.len();
    let mut head = [0u8; HEADER];
    if len < HEADER as u64 {
        return Err(corrupt(format!("{len} bytes: too short for a header")));
    }
    file.read_exact_at(&mut head, 0).map_err(io)?;
    if head[..8] != MAGIC {
        return Err(corrupt("not a process image (wrong magic)".into()));
    }
    let mut c = Cursor { bytes: &head, at: 8 };
    let (version, count, stated) = (c.u32().unwrap_or(0), c.u32().unwrap_or(0), c.u64().unwrap_or(0));
    let crc = c.u32().unwrap_or(0);
    if version > FORMAT_VERSION {
        return Err(Error::NewerVersion { path: path.into(), found: version, supported: FORMAT_VERSION });
    }
    if version == 0 || head[28..32] != [0; 4] {
        return Err(corrupt("format version 0, or a reserved header field set".into()));
    }
    if stated != len {
        return Err(corrupt(format!("{len} bytes where its header says {stated}: truncated or extended")));
    }
    if count > MAX_SECTIONS {
        return Err(corrupt(format!("{count} sections")));
    }
    let mut h = head.to_vec();
    h.resize(HEADER + ENTRY * count as usize, 0);
    file.read_exact_at(&mut h[HEADER..], HEADER as u64).map_err(io)?;
    if header_crc(&h) != crc {
        return Err(corrupt("the header's checksum does not match".into()));
    }
    let mut c = Cursor { bytes: &h, at: HEADER };
    let mut entries = Vec::new();
    for _ in 0..count {
        let kind = c.u32().unwrap_or(0);
        c.u32();
        let (offset, elen, ecrc) = (c.u64().unwrap_or(0), c.u64().unwrap_or(0), c.u32().unwrap_or(0));
        c.u32();
        if offset.checked_add(elen).is_none_or(|end| end > len) || offset < (HEADER + ENTRY * count as usize) as u64 {
            return Err(corrupt(format!("section {kind} lies outside the file")));
        }
        entries.push(Entry { kind, offset, len: elen, crc: ecrc });
    }
    let tree_bytes = read_checked(path, file, find(path, &entries, Kind::Tree)?, Kind::Tree)?;
    let tree: ImageTree = serde_json::from_slice(&tree_bytes).map_err(|e| corrupt(format!("the tree section: {e}")))?;
    if tree.sources.is_empty() {
        return Err(corrupt("the tree names no source (itself)".into()));
    }
    // (Sources name files of the image directory: a checkpoint id, never a path.)
    let id = |s: &str| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if let Some(bad) = tree.sources.iter().chain([&tree.checkpoint]).find(|s| !id(s)) {
        return Err(corrupt(format!("{bad:?} is not a checkpoint id")));
    }
    Ok((tree, entries, len))
}

/// The one section of `kind` among `entries` (of the image at `path`).
fn find(path: &Path, entries: &[Entry], kind: Kind) -> Result<Entry> {
    let corrupt = |what: String| Error::Corrupt { path: path.into(), what };
    let mut it = entries.iter().filter(|e| e.kind == kind as u32);
    match (it.next(), it.next()) {
        (Some(e), None) => Ok(*e),
        (None, _) => Err(corrupt(format!("no {kind:?} section"))),
        (Some(_), Some(_)) => Err(corrupt(format!("two {kind:?} sections"))),
    }
}

/// Section `e` (of `kind`) of `file` (the image at `path`), read whole
/// and checked against its checksum.
fn read_checked(path: &Path, file: &File, e: Entry, kind: Kind) -> Result<Vec<u8>> {
    if e.len > MAX_METADATA {
        return Err(Error::Corrupt { path: path.into(), what: format!("{kind:?} section of {} bytes", e.len) });
    }
    let mut buf = vec![0u8; e.len as usize];
    file.read_exact_at(&mut buf, e.offset).map_err(|source| Error::Io { path: path.into(), source })?;
    if crc32fast::hash(&buf) != e.crc {
        return Err(Error::Corrupt {
            path: path.into(),
            what: format!("the {kind:?} section's checksum does not match"),
        });
    }
    Ok(buf)
}

impl Image {
    /// Open and check the image at `path`.
    pub fn open(path: &Path) -> Result<Image> {
        let file = File::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
        Image::from_file(path, file)
    }

    /// Check and decode `file` (the image at `path`).
    pub fn from_file(path: &Path, file: File) -> Result<Image> {
        let (tree, entries, len) = read_tree(path, &file)?;
        let corrupt = |what: String| Error::Corrupt { path: path.into(), what };
        let io = |source| Error::Io { path: path.into(), source };
        let find = |kind: Kind| find(path, &entries, kind);
        let data = find(Kind::PageData)?;
        if data.len % PAGE != 0 {
            return Err(corrupt("the page data is not whole pages".into()));
        }
        let index_bytes = read_checked(path, &file, find(Kind::PageIndex)?, Kind::PageIndex)?;
        let index = decode_index(&index_bytes, tree.sources.len(), data.len / PAGE).map_err(corrupt)?;
        // The blobs (any size: deleted files, shared memory) checked a piece
        // at a time.
        let blobs = find(Kind::Blobs)?;
        let mut h = crc32fast::Hasher::new();
        let mut buf = vec![0u8; (1 << 20).min(blobs.len) as usize];
        let mut at = 0;
        while at < blobs.len {
            let n = (blobs.len - at).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], blobs.offset + at).map_err(io)?;
            h.update(&buf[..n]);
            at += n as u64;
        }
        if h.finalize() != blobs.crc {
            return Err(corrupt("the Blobs section's checksum does not match".into()));
        }
        Ok(Image {
            path: path.into(),
            file,
            tree,
            index,
            data: (data.offset, data.len),
            blobs: (blobs.offset, blobs.len),
            len,
        })
    }

    /// The images the image at `path` reads pages from (its own name
    /// first), from its header and tree alone (checked).
    pub fn sources_of(path: &Path) -> Result<Vec<String>> {
        let file = File::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
        Ok(read_tree(path, &file)?.0.sources)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Everything of the processes but their pages.
    pub fn tree(&self) -> &ImageTree {
        &self.tree
    }

    /// The page index.
    pub fn index(&self) -> &[ProcessPages] {
        &self.index
    }

    /// The index of process `pid`.
    pub fn pages_of(&self, pid: u32) -> Option<&ProcessPages> {
        self.index.iter().find(|p| p.pid == pid)
    }

    /// Pages stored in this file.
    pub fn page_count(&self) -> u64 {
        self.data.1 / PAGE
    }

    /// Read `buf.len() / 4096` pages of this file's page data from page
    /// number `first`, checking each against `crcs`.
    pub fn read_pages(&self, first: u64, buf: &mut [u8], crcs: &[u32]) -> Result<()> {
        let n = buf.len() as u64 / PAGE;
        if first.checked_add(n).is_none_or(|end| end > self.page_count()) || crcs.len() as u64 != n {
            return Err(self.corrupt(format!("pages {first}..+{n} are not in its page data")));
        }
        self.file
            .read_exact_at(buf, self.data.0 + first * PAGE)
            .map_err(|source| Error::Io { path: self.path.clone(), source })?;
        for (i, (page, crc)) in buf.chunks(PAGE as usize).zip(crcs).enumerate() {
            if crc32fast::hash(page) != *crc {
                return Err(self.corrupt(format!("page {} fails its checksum", first + i as u64)));
            }
        }
        Ok(())
    }

    /// Read up to `max` pages of this file's page data from page number
    /// `first` into `buf` (resized; fewer where the data ends), unchecked:
    /// the caller checks each page it uses against the index.
    pub fn read_ahead(&self, first: u64, max: u64, buf: &mut Vec<u8>) -> Result<()> {
        let n = max.min(self.page_count().saturating_sub(first));
        buf.resize((n * PAGE) as usize, 0);
        if n == 0 {
            return Ok(());
        }
        self.file
            .read_exact_at(buf, self.data.0 + first * PAGE)
            .map_err(|source| Error::Io { path: self.path.clone(), source })
    }

    /// Read the bytes of `blob`.
    pub fn read_blob(&self, blob: Blob) -> Result<Vec<u8>> {
        if blob.offset.checked_add(blob.len).is_none_or(|end| end > self.blobs.1) {
            return Err(self.corrupt(format!("blob {}+{} lies outside its section", blob.offset, blob.len)));
        }
        let mut buf = vec![0u8; blob.len as usize];
        self.file
            .read_exact_at(&mut buf, self.blobs.0 + blob.offset)
            .map_err(|source| Error::Io { path: self.path.clone(), source })?;
        Ok(buf)
    }

    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt { path: self.path.clone(), what }
    }

    /// What it holds, in short.
    pub fn summary(&self) -> ImageSummary {
        let processes = self
            .tree
            .processes
            .iter()
            .map(|p| {
                let i = &p.image;
                let pages = self.pages_of(i.pid.raw() as u32);
                let count = |f: &dyn Fn(&PageRun) -> bool| -> u64 {
                    pages.map_or(0, |p| p.runs.iter().filter(|r| f(r)).map(|r| u64::from(r.pages)).sum())
                };
                ProcessSummary {
                    pid: i.pid.raw(),
                    ppid: i.ppid.raw(),
                    comm: i.comm.clone(),
                    exe: i.exe.clone(),
                    threads: i.threads,
                    descriptors: i.fds.len(),
                    mappings: i.maps.len(),
                    pages: count(&|_| true),
                    pages_here: count(&|r| r.source == 0),
                    pages_in_parents: count(&|r| r.source != 0 && r.source != ZERO_SOURCE),
                    pages_zero: count(&|r| r.source == ZERO_SOURCE),
                }
            })
            .collect();
        ImageSummary {
            checkpoint: self.tree.checkpoint.clone(),
            format_version: FORMAT_VERSION,
            file_bytes: self.len,
            parent: self.tree.parent.clone(),
            sources: self.tree.sources.clone(),
            pages_written: self.page_count(),
            processes,
            blob_bytes: self.blobs.1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(ck: &str) -> ImageTree {
        ImageTree {
            checkpoint: ck.into(),
            parent: None,
            sources: vec![ck.into()],
            processes: Vec::new(),
            pipes: Vec::new(),
            sockets: Vec::new(),
            pair_data: Vec::new(),
            shared_memory: Vec::new(),
            unrestorable: Vec::new(),
            open_files: Some(Vec::new()),
        }
    }

    /// An image of two pages (one stored, one of zeros) and a blob; its path.
    fn written(dir: &Path) -> PathBuf {
        let path = dir.join("ck-1.img");
        let mut enc = Encoder::create(&path).expect("create");
        enc.begin(Kind::PageData, true, false);
        let page = vec![7u8; PAGE as usize];
        enc.write(&page).expect("page");
        enc.end();
        enc.begin(Kind::Blobs, false, true);
        enc.write(b"blob bytes").expect("blob");
        enc.end();
        let index = vec![ProcessPages {
            pid: 2,
            runs: vec![
                PageRun { start: 0x1000, pages: 1, source: 0, first: 0 },
                PageRun { start: 0x2000, pages: 1, source: ZERO_SOURCE, first: 0 },
            ],
            crcs: vec![crc32fast::hash(&page), crc32fast::hash(&[0u8; PAGE as usize])],
        }];
        enc.section(Kind::PageIndex, &encode_index(&index)).expect("index");
        enc.section(Kind::Tree, &serde_json::to_vec(&tree("ck-1")).expect("json")).expect("tree");
        enc.finish().expect("finish");
        path
    }

    fn temp() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sandtree-image-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    /// A source that is not a checkpoint id (a path out of the image
    /// directory) is refused.
    #[test]
    fn sources_are_checkpoint_ids() {
        let dir = temp();
        for (name, ok) in [("ck-2", true), ("../../etc/x", false), ("a/b", false), ("", false)] {
            let mut t = tree("ck-1");
            t.sources.push(name.into());
            let json = serde_json::to_vec(&t).expect("json");
            let index = encode_index(&[]);
            let bytes = assemble(&[(1, &json), (2, &index), (3, &[]), (4, &[])]);
            let path = dir.join("s.img");
            std::fs::write(&path, bytes).expect("write");
            let got = Image::open(&path);
            assert_eq!(got.is_ok(), ok, "{name:?}: {:?}", got.err().map(|e| e.to_string()));
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn an_image_reads_back() {
        let dir = temp();
        let path = written(&dir);
        let image = Image::open(&path).expect("open");
        assert_eq!(image.tree().checkpoint, "ck-1");
        assert_eq!(image.page_count(), 1);
        let pages: Vec<_> = image.pages_of(2).expect("pid 2").pages().collect();
        assert_eq!(pages.len(), 2);
        let mut buf = vec![0u8; PAGE as usize];
        image.read_pages(0, &mut buf, &[pages[0].3]).expect("page");
        assert!(buf.iter().all(|b| *b == 7));
        assert_eq!(image.read_blob(Blob { offset: 5, len: 5 }).expect("blob"), b"bytes");
        assert!(image.read_blob(Blob { offset: 5, len: 50 }).is_err());
        assert_eq!(image.summary().processes.len(), 0);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// Every kind of damage is an error naming the file, never a panic:
    /// a flipped byte in any section, a cut file, another magic, a newer
    /// version.
    #[test]
    fn damage_is_refused() {
        let dir = temp();
        let path = written(&dir);
        let good = std::fs::read(&path).expect("read");
        let open = |bytes: &[u8]| {
            let p = dir.join("damaged.img");
            std::fs::write(&p, bytes).expect("write");
            Image::open(&p).err().map(|e| e.to_string())
        };
        assert_eq!(open(&good), None);
        // A byte flipped anywhere but in the page data and padding.
        let data_at = PAGE as usize;
        for at in (0..good.len()).filter(|a| *a < 32 + 4 * ENTRY || *a >= data_at + PAGE as usize) {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            let e = open(&bad).unwrap_or_else(|| panic!("a flip at {at} went unnoticed"));
            assert!(e.contains("damaged.img"), "{e}");
        }
        // A flipped byte in a page: found when the page is read.
        let mut bad = good.clone();
        bad[data_at + 10] ^= 1;
        let p = dir.join("page.img");
        std::fs::write(&p, &bad).expect("write");
        let image = Image::open(&p).expect("the index is intact");
        let crc = image.pages_of(2).expect("pid").crcs[0];
        let mut buf = vec![0u8; PAGE as usize];
        let e = image.read_pages(0, &mut buf, &[crc]).expect_err("a damaged page");
        assert!(e.to_string().contains("checksum"), "{e}");
        for cut in [0, 7, 31, good.len() / 2, good.len() - 1] {
            assert!(open(&good[..cut]).is_some(), "cut at {cut}");
        }
        let mut newer = good.clone();
        newer[8..12].copy_from_slice(&2u32.to_le_bytes());
        let e = open(&newer).expect("newer");
        assert!(e.contains("format version 2"), "{e}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
