//! Running nftables scripts (`nft -f -`): each is one transaction, applied
//! whole or not at all, in the network namespace of the calling thread.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::Error;

/// Applies `script` in the calling thread's network namespace.
pub fn apply(script: &str) -> Result<(), Error> {
    let mut child = Command::new(nft_path())
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Nft(format!("cannot run nft ({e}); install Debian's nftables package")))?;
    child.stdin.take().expect("piped").write_all(script.as_bytes()).map_err(|e| Error::Nft(e.to_string()))?;
    let out = child.wait_with_output().map_err(|e| Error::Nft(e.to_string()))?;
    if !out.status.success() {
        return Err(Error::Nft(format!(
            "nft refused a script ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// `nft`, where Debian puts it (a daemon's PATH may lack `/usr/sbin`).
pub fn nft_path() -> &'static str {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("nft")
}

/// Whether `nft` can be run here.
pub fn available() -> bool {
    Command::new(nft_path())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
