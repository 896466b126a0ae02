//! Pieces of URLs the clients build (the CLI's and the MCP server's).

/// Percent-encodes one path segment or query value (ids and names are plain,
/// but a user may type anything).
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
