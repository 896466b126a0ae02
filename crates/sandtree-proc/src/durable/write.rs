//! Writing an image from its [`Sources`] ([`write_image`]), off the tracer
//! thread. Per template: its own pages ([`sandtree_sys::uffd::own_pages`]
//! of its private mappings, but the scratch mapping and the kernel's),
//! read in chunks (`process_vm_readv`); a page of zeros is stored nowhere,
//! a page equal byte for byte to the parent image's page at the same
//! address of the same pid is referenced where that image has it, any
//! other is appended to the page data. The parent's pages are read from
//! its file (and checked against their checksums) for the comparison:
//! nothing is taken as equal on a checksum alone.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::collect::Sources;
use super::format::{Encoder, Image, Kind, PageRun, ProcessPages, encode_index};
use super::{Blob, Error, ImageProcess, ImageSharedMemory, ImageTree, PAGE, Result, SparseFile, ZERO_SOURCE};
use crate::fdstate::SparseCopy;

/// Pages of a parent image read at a time for comparisons.
const READ_AHEAD: u64 = 256;

/// Bytes of memory read from a template at a time (between two calls of
/// the caller's pause).
const CHUNK: usize = 2 << 20;

/// What writing an image did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct WriteReport {
    /// The file's size.
    pub bytes: u64,
    /// Pages of the processes' own, in all.
    pub pages: u64,
    /// Of those, stored in this image.
    pub pages_written: u64,
    /// Referenced in the parent's image (or its sources).
    pub pages_from_parent: u64,
    /// Of those, found on the same physical frame as in the parent's
    /// template (not read).
    pub pages_same_frame: u64,
    /// Of those, known unchanged since the parent's template, which this
    /// one was made over (not read).
    pub pages_unchanged: u64,
    /// Pages of zeros (stored nowhere).
    pub pages_zero: u64,
    /// The parent image compared against, if one was read.
    pub parent: Option<String>,
    pub took_ms: f64,
}

/// The image file of checkpoint `ck` in `dir`.
pub fn image_path(dir: &Path, ck: &str) -> PathBuf {
    dir.join(format!("{ck}.img"))
}

/// Where the next page of a process comes from, as the index will say.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Place {
    source: u32,
    page: u64,
}

/// The parent image and the images its index reads from, opened as
/// needed; the map from their source numbers to the new image's.
struct Parent {
    image: Image,
    opened: super::read::OpenImages,
    /// Parent source number -> new source number.
    renumbered: HashMap<u32, u32>,
    /// Pages read ahead: (source, first page, bytes).
    cache: Option<(u32, u64, Vec<u8>)>,
}

impl Parent {
    /// The new image's source number for the parent's source `s`, listed
    /// in `names` the first time.
    fn renumber(&mut self, s: u32, names: &mut Vec<String>) -> u32 {
        let next = names.len() as u32;
        let image = &self.image;
        *self.renumbered.entry(s).or_insert_with(|| {
            let name = match s {
                0 => image.tree().checkpoint.clone(),
                s => image.tree().sources.get(s as usize).cloned().unwrap_or_default(),
            };
            names.push(name);
            next
        })
    }

    /// The bytes of page `page` of the parent's source `source`, into
    /// `buf`, checked against `crc`. Read ahead in spans of
    /// [`READ_AHEAD`] pages (the next pages asked for mostly follow).
    fn read(&mut self, source: u32, page: u64, crc: u32, buf: &mut [u8]) -> Result<()> {
        let hit = |c: &(u32, u64, Vec<u8>)| c.0 == source && page >= c.1 && page < c.1 + c.2.len() as u64 / PAGE;
        if !self.cache.as_ref().is_some_and(hit) {
            let image = self.opened.get(&self.image, source)?;
            let mut data = self.cache.take().map(|c| c.2).unwrap_or_default();
            image.read_ahead(page, READ_AHEAD, &mut data)?;
            self.cache = Some((source, page, data));
        }
        let Some((_, first, data)) = self.cache.as_ref().filter(|c| hit(c)) else {
            return Err(Error::Corrupt {
                path: self.image.path().into(),
                what: format!("page {page} of source {source} is past its page data"),
            });
        };
        let at = ((page - first) * PAGE) as usize;
        let bytes = &data[at..at + PAGE as usize];
        if crc32fast::hash(bytes) != crc {
            return Err(Error::Corrupt {
                path: self.image.path().into(),
                what: format!("page {page} of source {source} fails its checksum"),
            });
        }
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// Write the image of `sources` into `dir` (see the module docs), its
/// pages compared against the image of checkpoint `parent` when there is
/// a readable one. `pause` is called before each chunk of pages: it
/// returns once the writer may go on (the caller's work comes first).
pub fn write_image(sources: &Sources, dir: &Path, parent: Option<&str>, pause: &dyn Fn()) -> Result<WriteReport> {
    let t0 = std::time::Instant::now();
    let path = image_path(dir, &sources.checkpoint);
    let mut parent = parent.and_then(|p| match Image::open(&image_path(dir, p)) {
        Ok(image) => {
            Some(Parent { image, opened: super::read::OpenImages::new(dir), renumbered: HashMap::new(), cache: None })
        }
        Err(e) => {
            tracing::debug!(checkpoint = sources.checkpoint, parent = p, "parent image not used: {e}");
            None
        }
    });
    let mut report =
        WriteReport { parent: parent.as_ref().map(|p| p.image.tree().checkpoint.clone()), ..Default::default() };
    let mut names = vec![sources.checkpoint.clone()];
    let mut enc = Encoder::create(&path)?;
    enc.begin(Kind::PageData, true, false);
    let mut index = Vec::new();
    let mut buf = Vec::new();
    let mut theirs = vec![0u8; PAGE as usize];
    for p in &sources.processes {
        gone(p)?;
        let runs = own_runs(p)?;
        let pid = p.image.pid.raw() as u32;
        let before: HashMap<u64, (u32, u64, u32)> = parent
            .as_ref()
            .and_then(|par| par.image.pages_of(pid))
            .map(|pp| pp.pages().map(|(addr, s, page, crc)| (addr, (s, page, crc))).collect())
            .unwrap_or_default();
        let mut pages = ProcessPages { pid, runs: Vec::new(), crcs: Vec::new() };
        // The parent's template of this process, if it is still there.
        let twin = sources.parent_templates.get(&p.image.pid.raw()).filter(|_| !before.is_empty());
        // (Its pid checked after its pagemap is open: that pagemap is its.)
        let pagemaps = match twin {
            Some(t) => Some((pagemap_of(p.host)?, pagemap_of(t.host)?)).filter(|_| alive(&t.pidfd)),
            None => None,
        };
        // The kernel writes a template's rseq area when an injected call
        // returns to it: its pages are always read.
        let rseq = p.image.rseq.map(|(at, len, ..)| (at & !(PAGE - 1), at + u64::from(len)));
        let kernel_written = |addr: u64| rseq.is_some_and(|(s, e)| addr >= s && addr < e);
        // Made from the parent's template: the pages it changed over that
        // one, sorted; every other page is the parent's.
        let changed = p.changed_since.as_ref().filter(|(ck, _)| Some(ck) == report.parent.as_ref()).map(|(_, d)| {
            let mut runs: Vec<(u64, u64)> = d.pages.iter().chain(&d.zap).copied().collect();
            crate::track::merge_runs(&mut runs);
            runs
        });
        for chunk in chunks(&runs) {
            pause();
            let addrs: Vec<u64> = chunk.iter().flat_map(|&(s, e)| (s..e).step_by(PAGE as usize)).collect();
            let shared = match &pagemaps {
                Some((ours, theirs)) => same_frames((ours, p.host), (theirs, twin.map_or(p.host, |t| t.host)), &chunk)?,
                None => vec![false; addrs.len()],
            };
            let known = |i: usize, addr: u64| {
                !kernel_written(addr) && (shared[i] || changed.as_ref().is_some_and(|c| !within(c, addr)))
            };
            let reused =
                |i: usize, addr: u64| known(i, addr) && before.get(&addr).is_some_and(|(s, _, _)| *s != ZERO_SOURCE);
            let mut read: Vec<(u64, u64)> = Vec::new();
            for (i, &addr) in addrs.iter().enumerate() {
                if reused(i, addr) {
                    continue;
                }
                match read.last_mut() {
                    Some(last) if last.1 == addr => last.1 += PAGE,
                    _ => read.push((addr, addr + PAGE)),
                }
            }
            let len: usize = read.iter().map(|(s, e)| (e - s) as usize).sum();
            buf.resize(len, 0);
            if !read.is_empty() {
                crate::transplant::read_runs(p.host, &read, &mut buf).map_err(|source| Error::Proc {
                    pid: p.host,
                    what: "memory",
                    source,
                })?;
            }
            let mut fresh = buf.chunks(PAGE as usize);
            for (i, &addr) in addrs.iter().enumerate() {
                report.pages += 1;
                if reused(i, addr) {
                    let (s, n, crc) = before[&addr];
                    let par = parent.as_mut().ok_or_else(|| io_of(&path, std::io::Error::other("no parent")))?;
                    let source = par.renumber(s, &mut names);
                    report.pages_from_parent += 1;
                    if shared[i] {
                        report.pages_same_frame += 1;
                    } else {
                        report.pages_unchanged += 1;
                    }
                    push_page(&mut pages, addr, Place { source, page: n }, crc);
                    continue;
                }
                let page = fresh.next().ok_or_else(|| io_of(&path, std::io::Error::other("short read")))?;
                let crc = crc32fast::hash(page);
                let place = if page.iter().all(|b| *b == 0) {
                    report.pages_zero += 1;
                    Place { source: ZERO_SOURCE, page: 0 }
                } else if let (Some(par), Some(&(s, n, c))) = (parent.as_mut(), before.get(&addr))
                    && c == crc
                    && s != ZERO_SOURCE
                    && par.read(s, n, c, &mut theirs).is_ok()
                    && theirs == page
                {
                    report.pages_from_parent += 1;
                    let source = par.renumber(s, &mut names);
                    Place { source, page: n }
                } else {
                    let n = enc.section_len() / PAGE;
                    enc.write(page)?;
                    report.pages_written += 1;
                    Place { source: 0, page: n }
                };
                push_page(&mut pages, addr, place, crc);
            }
        }
        gone(p)?;
        index.push(pages);
    }
    enc.end();
    enc.begin(Kind::Blobs, false, true);
    let mut processes = Vec::with_capacity(sources.processes.len());
    for p in &sources.processes {
        let mut files = Vec::new();
        for (fd, copy) in &p.image.ghosts {
            files.push((*fd, blob_file(&mut enc, copy).map_err(|e| io_of(&path, e))?));
        }
        processes.push(ImageProcess { image: p.image.clone(), fork: p.fork.clone(), files });
    }
    let mut shared_memory = Vec::new();
    for s in &sources.shared_memory {
        let data = blob_file(&mut enc, &s.data).map_err(|e| io_of(&path, e))?;
        shared_memory.push(ImageSharedMemory { key: s.key, data, memfd: s.memfd });
    }
    enc.end();
    enc.section(Kind::PageIndex, &encode_index(&index))?;
    let tree = ImageTree {
        checkpoint: sources.checkpoint.clone(),
        parent: report.parent.clone(),
        sources: names,
        processes,
        pipes: sources.pipes.clone(),
        sockets: sources.sockets.clone(),
        pair_data: sources.pair_data.clone(),
        shared_memory,
        unrestorable: sources.unrestorable.clone(),
        open_files: Some(open_files(sources)),
    };
    // Every image the index reads from must still be there (a checkpoint
    // deleted meanwhile may have taken its image).
    for name in tree.sources.iter().skip(1) {
        let source = image_path(dir, name);
        std::fs::metadata(&source).map_err(|e| io_of(&source, e))?;
    }
    let json = serde_json::to_vec(&tree).map_err(|e| io_of(&path, std::io::Error::other(e)))?;
    enc.section(Kind::Tree, &json)?;
    report.bytes = enc.finish()?;
    report.took_ms = t0.elapsed().as_secs_f64() * 1000.0;
    Ok(report)
}

fn io_of(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

/// An error if template `p` has ended (its pidfd is readable): its pid
/// may name another process by now, whose memory was read.
fn gone(p: &super::collect::SourceProcess) -> Result<()> {
    match alive(&p.pidfd) {
        true => Ok(()),
        false => Err(Error::TemplateGone { pid: p.image.pid }),
    }
}

/// Whether the process of `pidfd` has not ended.
fn alive(pidfd: &std::os::fd::OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(pidfd, rustix::event::PollFlags::IN)];
    matches!(rustix::event::poll(&mut fds, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(0))
}

/// Whether `addr` lies in one of `runs` (sorted, not overlapping).
fn within(runs: &[(u64, u64)], addr: u64) -> bool {
    let n = runs.partition_point(|r| r.0 <= addr);
    n > 0 && addr < runs[n - 1].1
}

/// `/proc/<host>/pagemap`, open.
fn pagemap_of(host: crate::HostPid) -> Result<std::fs::File> {
    std::fs::File::open(format!("/proc/{host}/pagemap")).map_err(|source| Error::Proc {
        pid: host,
        what: "pagemap",
        source,
    })
}

/// For each page of `runs`: whether it is present in both processes on
/// the same physical frame (`pagemap`'s bit 63 and frame number, bits
/// 0-54, which the daemon, root, is shown).
fn same_frames(
    (ours, our_pid): (&std::fs::File, crate::HostPid),
    (theirs, their_pid): (&std::fs::File, crate::HostPid),
    runs: &[(u64, u64)],
) -> Result<Vec<bool>> {
    use std::os::unix::fs::FileExt;
    const PRESENT: u64 = 1 << 63;
    const FRAME: u64 = (1 << 55) - 1;
    let mut out = Vec::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &(s, e) in runs {
        let n = ((e - s) / PAGE) as usize;
        let at = s / PAGE * 8;
        a.resize(n * 8, 0);
        b.resize(n * 8, 0);
        ours.read_exact_at(&mut a, at).map_err(|source| Error::Proc { pid: our_pid, what: "pagemap", source })?;
        // (The parent's template ended: its frames read before are its, the
        // rest are not shared.)
        if theirs.read_exact_at(&mut b, at).is_err() {
            tracing::debug!(pid = their_pid.raw(), "the parent's template ended while compared");
            b.fill(0);
        }
        let entry = |buf: &[u8], i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        for i in 0..n {
            let (x, y) = (entry(&a, i), entry(&b, i));
            out.push(x & PRESENT != 0 && y & PRESENT != 0 && x & FRAME != 0 && x & FRAME == y & FRAME);
        }
    }
    Ok(out)
}

/// The descriptors of `sources`' templates of the kinds a template keeps
/// from its original (eventfds, timerfds, signalfds, epolls) that are one
/// open file (`kcmp(KCMP_FILE)`): groups of two or more (`ImageTree::open_files`).
fn open_files(sources: &super::Sources) -> Vec<Vec<(crate::SandboxPid, i32)>> {
    let mut held: Vec<(crate::HostPid, crate::SandboxPid, i32)> = Vec::new();
    for p in &sources.processes {
        for f in p.image.fds.iter().filter(|f| super::templates::kept_anonymous(&f.kind)) {
            held.push((p.host, p.image.pid, f.fd));
        }
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in 0..held.len() {
        let (host, _, fd) = held[i];
        let same = |&j: &usize| {
            let (h, _, f) = held[j];
            sandtree_sys::process::same_open_file(host.raw(), fd, h.raw(), f).unwrap_or(false)
        };
        match groups.iter_mut().find(|g| g.first().is_some_and(same)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
        .into_iter()
        .filter(|g| g.len() > 1)
        .map(|g| g.into_iter().map(|i| (held[i].1, held[i].2)).collect())
        .collect()
}

/// The runs of template `p`'s own pages (see the module docs).
fn own_runs(p: &super::collect::SourceProcess) -> Result<Vec<(u64, u64)>> {
    let err = |what: &'static str| move |source| Error::Proc { pid: p.host, what, source };
    let maps = crate::procfs::maps(p.host).map_err(err("maps"))?;
    let pagemap = std::fs::File::open(format!("/proc/{}/pagemap", p.host)).map_err(err("pagemap"))?;
    let mut runs = Vec::new();
    let mut guards = Vec::new();
    for m in maps.iter().filter(|m| crate::transplant::holds_own_pages(m, p.scratch)) {
        sandtree_sys::uffd::guard_pages(pagemap.as_fd(), (m.start, m.end), &mut guards).map_err(err("pagemap"))?;
        sandtree_sys::uffd::own_pages(pagemap.as_fd(), (m.start, m.end), &mut runs).map_err(err("pagemap"))?;
    }
    // (A fork copies them; an image has no record of them yet, and their
    // pages cannot be read.)
    if let Some((s, e)) = guards.first() {
        let what = format!("guard regions (MADV_GUARD_INSTALL) at {s:x}-{e:x}: not kept in a process image yet");
        return Err(Error::Proc { pid: p.host, what: "memory", source: std::io::Error::other(what) });
    }
    Ok(runs)
}

/// `runs` cut into chunks of at most [`CHUNK`] bytes.
fn chunks(runs: &[(u64, u64)]) -> Vec<Vec<(u64, u64)>> {
    let mut out = vec![Vec::new()];
    let mut size = 0u64;
    for &(mut s, e) in runs {
        while s < e {
            let take = (e - s).min(CHUNK as u64 - size);
            if let Some(last) = out.last_mut() {
                last.push((s, s + take));
            }
            size += take;
            s += take;
            if size >= CHUNK as u64 {
                out.push(Vec::new());
                size = 0;
            }
        }
    }
    out.retain(|c| !c.is_empty());
    out
}

/// Add the page at `addr` to `pages`, extending its last run when it
/// continues it.
fn push_page(pages: &mut ProcessPages, addr: u64, place: Place, crc: u32) {
    pages.crcs.push(crc);
    if let Some(r) = pages.runs.last_mut() {
        let next_addr = r.start + u64::from(r.pages) * PAGE;
        let next_page = if r.source == ZERO_SOURCE { 0 } else { r.first + u64::from(r.pages) };
        if next_addr == addr && r.source == place.source && next_page == place.page && r.pages < u32::MAX {
            r.pages += 1;
            return;
        }
    }
    pages.runs.push(PageRun { start: addr, pages: 1, source: place.source, first: place.page });
}

/// Append the data runs of `copy` to the blobs section.
fn blob_file(enc: &mut Encoder, copy: &SparseCopy) -> std::io::Result<SparseFile> {
    let mut out = SparseFile { size: copy.size, runs: Vec::new() };
    let mut buf = vec![0u8; 1 << 20];
    for &(start, len) in &copy.runs {
        let blob = Blob { offset: enc.section_len(), len };
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            copy.read_at(&mut buf[..n], start + done)?;
            enc.write(&buf[..n]).map_err(|e| std::io::Error::other(e.to_string()))?;
            done += n as u64;
        }
        out.runs.push((start, blob));
    }
    Ok(out)
}
