//! The durable process image decoder (`sandtree_proc::durable`) on any
//! bytes: it must answer with an image or an error, never panic or hang.
//! The first byte chooses how the rest is used: odd, as a whole file;
//! even, as the contents of the four sections (their lengths in the next
//! bytes), assembled with a valid header and checksums, so that the
//! decoders behind the checksums (the tree's JSON, the page index) see
//! the bytes. An image that opens is then read whole: its summary, every
//! page the index names (through `PageSource`) and every blob.

#![no_main]

use std::io::Write;
use std::os::unix::fs::FileExt;

use libfuzzer_sys::fuzz_target;
use sandtree_proc::durable::{Image, PageSource, format};

fn file_of(bytes: &[u8]) -> (std::path::PathBuf, std::fs::File) {
    let path = std::env::temp_dir().join(format!("sandtree-fuzz-{}.img", std::process::id()));
    let mut f = std::fs::File::create(&path).expect("a temporary file");
    f.write_all(bytes).expect("write");
    (path.clone(), std::fs::File::open(&path).expect("open"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let bytes = if mode & 1 == 1 {
        rest.to_vec()
    } else {
        // Four lengths (u16 each), then the sections' bytes in turn.
        if rest.len() < 8 {
            return;
        }
        let lens: Vec<usize> = rest[..8].chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as usize).collect();
        let mut body = &rest[8..];
        let mut sections = Vec::new();
        for (kind, len) in [1u32, 2, 3, 4].into_iter().zip(lens) {
            let (s, more) = body.split_at(len.min(body.len()));
            sections.push((kind, s));
            body = more;
        }
        format::assemble(&sections)
    };
    let (path, file) = file_of(&bytes);
    if let Ok(image) = Image::from_file(&path, file) {
        let _ = image.summary();
        let dir = path.parent().unwrap_or(std::path::Path::new("/")).to_path_buf();
        for p in image.index() {
            let _ = PageSource::new(&image, &dir).each_page(p.pid, |_, _| Ok(()));
        }
        for p in &image.tree().processes {
            for (_, f) in &p.files {
                for (_, blob) in &f.runs {
                    let _ = image.read_blob(*blob);
                }
            }
        }
        let mut buf = vec![0u8; 4096];
        let _ = image.read_pages(0, &mut buf, &[0]);
    }
    let _ = std::fs::File::open(&path).map(|f| f.read_at(&mut [0u8; 1], 0));
});
