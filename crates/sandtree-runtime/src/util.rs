//! Small helpers: ids, timestamps, durations, pids.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;

const ID_ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// A new random id such as `sb-k3x9p2m4qa` (10 base32 characters, 50 bits).
pub fn new_id(prefix: &str) -> String {
    let mut rng = rand::rng();
    let mut id = String::with_capacity(prefix.len() + 11);
    id.push_str(prefix);
    id.push('-');
    for _ in 0..10 {
        id.push(ID_ALPHABET[rng.random_range(0..ID_ALPHABET.len())] as char);
    }
    id
}

/// Whether `s` looks like an id of ours with this prefix (guards paths built from ids).
pub fn is_valid_id(prefix: &str, s: &str) -> bool {
    s.len() == prefix.len() + 11
        && s.starts_with(prefix)
        && s.as_bytes()[prefix.len()] == b'-'
        && s[prefix.len() + 1..].bytes().all(|b| ID_ALPHABET.contains(&b))
}

pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// Formats a time as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn ms_since(t: Instant) -> f64 {
    ms(t.elapsed())
}

/// Sandbox pids (the process engine's `SandboxPid`s) as bare numbers, as
/// init's protocol and the API carry them (in the same buffer: no copy).
pub(crate) fn raw_pids(pids: Vec<sandtree_proc::SandboxPid>) -> Vec<i32> {
    pids.into_iter().map(sandtree_proc::SandboxPid::raw).collect()
}

/// The host's available memory (`MemAvailable` of `/proc/meminfo`), in
/// bytes (`None` if it cannot be read).
pub(crate) fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_valid_and_distinct() {
        let a = new_id("sb");
        let b = new_id("sb");
        assert!(is_valid_id("sb", &a), "{a}");
        assert_ne!(a, b);
        assert!(!is_valid_id("ck", &a));
    }

    #[test]
    fn ids_with_path_characters_are_invalid() {
        assert!(!is_valid_id("sb", "sb-../../etc"));
        assert!(!is_valid_id("sb", "sb-abc/defgh"));
        assert!(!is_valid_id("sb", ""));
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_996_800_123);
        assert_eq!(rfc3339(t), "2026-11-30T00:00:00.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
