//! Human output: tables, relative times, durations, the checkpoint tree.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use sandtree_api::CheckpointInfo;

use crate::units::human_bytes;

/// Prints `v` as pretty JSON on stdout.
pub fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

/// Formats rows as left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// Milliseconds as `12.3 ms` or `1.24 s`.
pub fn ms(v: f64) -> String {
    if v >= 1000.0 { format!("{:.2} s", v / 1000.0) } else { format!("{v:.1} ms") }
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2024-05-01T12:00:00.123Z`).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 19 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let mut t = days * 86_400 + h * 3600 + mi * 60 + se;
    // A numeric offset (`+02:00`) after the seconds and optional fraction.
    let rest = &s[19..];
    let rest = rest.trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    if let Some(sign) = rest.chars().next().filter(|c| *c == '+' || *c == '-') {
        let oh: i64 = rest.get(1..3)?.parse().ok()?;
        let om: i64 = rest.get(4..6)?.parse().ok()?;
        let off = oh * 3600 + om * 60;
        t -= if sign == '+' { off } else { -off };
    }
    Some(t)
}

/// `5s ago`, `3m ago`, `2h ago`, `4d ago`; the raw text if it does not parse.
pub fn ago(rfc3339: &str) -> String {
    let Some(t) = parse_rfc3339(rfc3339) else {
        return rfc3339.to_string();
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(t);
    let d = (now - t).max(0);
    match d {
        0..60 => format!("{d}s ago"),
        60..3600 => format!("{}m ago", d / 60),
        3600..86_400 => format!("{}h ago", d / 3600),
        _ => format!("{}d ago", d / 86_400),
    }
}

/// `k=v,k2=v2`
pub fn labels(l: &BTreeMap<String, String>) -> String {
    l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// Renders checkpoints as a forest using their `parent` links:
///
/// ```text
/// ck-aaaa  "base"  2m ago  1.2 MiB  frozen 3.1 ms
/// ├── ck-bbbb  1m ago  4.0 KiB  frozen 2.0 ms  ◀ sb-xxxx
/// └── ck-cccc  …
/// ```
/// `based` maps a checkpoint id to the sandboxes currently based on it.
pub fn checkpoint_tree(cks: &[CheckpointInfo], based: &HashMap<String, Vec<String>>) -> String {
    let ids: HashMap<&str, usize> = cks.iter().enumerate().map(|(i, c)| (c.id.as_str(), i)).collect();
    let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, c) in cks.iter().enumerate() {
        match c.parent.as_deref().and_then(|p| ids.get(p)) {
            Some(&p) if p != i => children.entry(p).or_default().push(i),
            _ => roots.push(i),
        }
    }
    let line = |c: &CheckpointInfo| {
        let mut s = c.id.clone();
        if let Some(l) = &c.label {
            s.push_str(&format!("  {l:?}"));
        }
        if !c.labels.is_empty() {
            s.push_str(&format!("  [{}]", labels(&c.labels)));
        }
        s.push_str(&format!("  {}", ago(&c.created_at)));
        match c.size_bytes {
            Some(b) => s.push_str(&format!("  {}", human_bytes(b))),
            None => s.push_str("  (size pending)"),
        }
        s.push_str(&format!("  frozen {}", ms(c.frozen_ms)));
        if let Some(sbs) = based.get(&c.id).filter(|v| !v.is_empty()) {
            s.push_str(&format!("  ◀ {}", sbs.join(", ")));
        }
        s
    };
    let mut out = String::new();
    // Iterative DFS so deep chains (thousands of checkpoints) cannot overflow the stack.
    for &r in &roots {
        let mut stack: Vec<(usize, String, bool, bool)> = vec![(r, String::new(), true, true)];
        while let Some((i, prefix, last, root)) = stack.pop() {
            if root {
                out.push_str(&line(&cks[i]));
            } else {
                out.push_str(&format!("{prefix}{}{}", if last { "└── " } else { "├── " }, line(&cks[i])));
            }
            out.push('\n');
            let child_prefix =
                if root { String::new() } else { format!("{prefix}{}", if last { "    " } else { "│   " }) };
            let kids = children.get(&i).cloned().unwrap_or_default();
            for (k, &c) in kids.iter().enumerate().rev() {
                stack.push((c, child_prefix.clone(), k + 1 == kids.len(), false));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ck(id: &str, parent: Option<&str>) -> CheckpointInfo {
        CheckpointInfo {
            id: id.into(),
            sandbox_id: "sb-1".into(),
            parent: parent.map(Into::into),
            label: None,
            labels: BTreeMap::new(),
            image: "default".into(),
            created_at: "2024-01-01T00:00:00Z".into(),
            size_bytes: Some(2048),
            process_state: sandtree_api::ProcessState::NotCaptured,
            processes: Vec::new(),
            unrestorable: Vec::new(),
            reparented: Vec::new(),
            frozen_ms: 1.5,
            duration_ms: 3.0,
        }
    }

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00.5Z"), Some(951_868_800));
        assert_eq!(parse_rfc3339("1970-01-01T02:00:00+02:00"), Some(0));
        assert_eq!(parse_rfc3339("nope"), None);
    }

    #[test]
    fn tree_shape() {
        let cks = vec![ck("a", None), ck("b", Some("a")), ck("c", Some("b")), ck("d", Some("a"))];
        let mut based = HashMap::new();
        based.insert("c".to_string(), vec!["sb-x".to_string()]);
        let t = checkpoint_tree(&cks, &based);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("a  "));
        assert!(lines[1].starts_with("├── b  "));
        assert!(lines[2].starts_with("│   └── c  "));
        assert!(lines[2].ends_with("◀ sb-x"));
        assert!(lines[3].starts_with("└── d  "));
    }

    #[test]
    fn tables_align() {
        let t = table(&["ID", "X"], &[vec!["long-id".into(), "1".into()]]);
        assert_eq!(t, "ID       X\nlong-id  1\n");
    }
}
