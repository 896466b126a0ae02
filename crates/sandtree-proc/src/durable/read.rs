//! Reading a process's pages out of an image and the images it reads
//! from ([`PageSource`]): each page where the index says it is (this
//! image's page data, a parent's, or zeros), checked against its
//! checksum.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::format::Image;
use super::{Error, PAGE, Result, ZERO_SOURCE, image_path};

/// The images an image reads pages from, opened as needed (in its
/// directory) and kept open.
pub(crate) struct OpenImages {
    dir: PathBuf,
    opened: HashMap<String, Image>,
}

impl OpenImages {
    pub(crate) fn new(dir: &Path) -> OpenImages {
        OpenImages { dir: dir.to_path_buf(), opened: HashMap::new() }
    }

    /// Source `source` of image `top` (0: `top` itself), opened and checked.
    pub(crate) fn get<'s>(&'s mut self, top: &'s Image, source: u32) -> Result<&'s Image> {
        if source == 0 {
            return Ok(top);
        }
        let name = top.tree().sources.get(source as usize).ok_or_else(|| Error::Corrupt {
            path: top.path().into(),
            what: format!("source {source} is not listed"),
        })?;
        if !self.opened.contains_key(name) {
            let image = Image::open(&image_path(&self.dir, name))?;
            self.opened.insert(name.clone(), image);
        }
        self.opened
            .get(name)
            .ok_or_else(|| Error::Corrupt { path: image_path(&self.dir, name), what: "not opened".into() })
    }
}

/// The pages of the processes of one image (`top`), with the images it
/// reads from opened as needed (in the same directory).
pub struct PageSource<'a> {
    top: &'a Image,
    opened: OpenImages,
}

impl<'a> PageSource<'a> {
    /// The pages of `top`, whose sources are in `dir`.
    pub fn new(top: &'a Image, dir: &Path) -> PageSource<'a> {
        PageSource { top, opened: OpenImages::new(dir) }
    }

    /// Every page of process `pid` the image holds, in address order:
    /// (address, its 4096 bytes), into `each`. An image the index names
    /// that is missing or damaged is an error naming it.
    pub fn each_page(&mut self, pid: u32, mut each: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let top = self.top;
        let Some(pages) = top.pages_of(pid) else { return Ok(()) };
        let mut buf = vec![0u8; PAGE as usize];
        for (addr, source, page, crc) in pages.pages() {
            if source == ZERO_SOURCE {
                buf.fill(0);
            } else {
                self.opened.get(top, source)?.read_pages(page, &mut buf, &[crc])?;
            }
            each(addr, &buf)?;
        }
        Ok(())
    }
}
