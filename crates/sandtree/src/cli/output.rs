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

pub use crate::rfc3339::parse as parse_rfc3339;

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

/// Checkpoints shown at the start and at the end of a folded linear run.
pub const FOLD_HEAD: usize = 10;
/// See [`FOLD_HEAD`].
pub const FOLD_TAIL: usize = 10;

/// A rendered checkpoint tree.
pub struct Tree {
    pub text: String,
    /// Checkpoints left out of folded runs (0 with `all`).
    pub folded: usize,
}

/// Renders checkpoints as a forest using their `parent` links, the way
/// `git log --graph` draws history: a linear run (each checkpoint the only
/// child of the one before) stays in one column, and only a branch point
/// indents its children, so a chain of 1,000 checkpoints is 1,000 lines no
/// wider than one.
///
/// ```text
/// ck-aaaa  "base"  2m ago  1.2 MiB  frozen 3.1 ms
/// ck-bbbb  1m ago  4.0 KiB  frozen 2.0 ms
/// ├── ck-cccc  …  ◀ sb-xxxx
/// │   ck-dddd  …
/// └── ck-eeee  …
///     … 980 more …
///     ck-ffff  …  ◀ sb-yyyy, sb-zzzz
/// ```
///
/// `based` maps a checkpoint id to the sandboxes that stand on it (their
/// base: the checkpoint they were last checkpointed, rolled back or forked
/// at), marked `◀ sb-…`. Unless `all`, a linear run longer than
/// [`FOLD_HEAD`] + [`FOLD_TAIL`] + 1 shows its first and last checkpoints
/// and the ones a sandbox stands on; the rest fold into `… N more …`.
pub fn checkpoint_tree(cks: &[CheckpointInfo], based: &HashMap<String, Vec<String>>, all: bool) -> Tree {
    let ids: HashMap<&str, usize> = cks.iter().enumerate().map(|(i, c)| (c.id.as_str(), i)).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); cks.len()];
    let mut roots = Vec::new();
    for (i, c) in cks.iter().enumerate() {
        match c.parent.as_deref().and_then(|p| ids.get(p)) {
            Some(&p) if p != i => children[p].push(i),
            _ => roots.push(i),
        }
    }
    let marks = |i: usize| based.get(&cks[i].id).filter(|v| !v.is_empty());
    let line = |i: usize| {
        let c = &cks[i];
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
        if let Some(sbs) = marks(i) {
            s.push_str(&format!("  ◀ {}", sbs.join(", ")));
        }
        s
    };
    let mut out = String::new();
    let mut folded = 0;
    // A parent link that loops (corrupt metadata) must not hang the CLI.
    let mut seen = vec![false; cks.len()];
    // Runs to draw: (first checkpoint, prefix, connector: `Some(last)` under
    // a branch point). Iterative, so no depth overflows the stack.
    let mut stack: Vec<(usize, String, Option<bool>)> = roots.iter().rev().map(|&r| (r, String::new(), None)).collect();
    loop {
        let Some((first, prefix, connector)) = stack.pop() else {
            // Checkpoints on a loop of parent links have no root: drawn
            // from the first of them.
            match seen.iter().position(|s| !s) {
                Some(i) => stack.push((i, String::new(), None)),
                None => break,
            }
            continue;
        };
        let mut run = vec![first];
        seen[first] = true;
        while let [only] = children[*run.last().expect("not empty")][..] {
            if seen[only] {
                break;
            }
            seen[only] = true;
            run.push(only);
        }
        let cont = match connector {
            None => prefix.clone(),
            Some(last) => format!("{prefix}{}", if last { "    " } else { "│   " }),
        };
        let shown: Vec<bool> = (0..run.len())
            .map(|k| {
                all || run.len() <= FOLD_HEAD + FOLD_TAIL + 1
                    || k < FOLD_HEAD
                    || k >= run.len() - FOLD_TAIL
                    || marks(run[k]).is_some()
            })
            .collect();
        let mut k = 0;
        while k < run.len() {
            let lead = match (k, connector) {
                (0, Some(last)) => format!("{prefix}{}", if last { "└── " } else { "├── " }),
                (0, None) => prefix.clone(),
                _ => cont.clone(),
            };
            let hidden = shown[k..].iter().take_while(|s| !**s).count();
            if hidden >= 2 {
                out.push_str(&format!("{lead}… {hidden} more …\n"));
                folded += hidden;
                k += hidden;
                continue;
            }
            out.push_str(&format!("{lead}{}\n", line(run[k])));
            k += 1;
        }
        let last = *run.last().expect("not empty");
        let kids: Vec<usize> = children[last].iter().copied().filter(|&c| !seen[c]).collect();
        if kids.len() == 1 {
            // (Only after a loop was cut: draw the rest as a branch.)
            stack.push((kids[0], cont, Some(true)));
            continue;
        }
        for (n, &c) in kids.iter().enumerate().rev() {
            stack.push((c, cont.clone(), Some(n + 1 == kids.len())));
        }
    }
    Tree { text: out, folded }
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
            process_image: None,
        }
    }

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00.5Z"), Some(951_868_800));
        assert_eq!(parse_rfc3339("1970-01-01T02:00:00+02:00"), Some(0));
        assert_eq!(parse_rfc3339("nope"), None);
    }

    fn chain(n: usize, from: Option<&str>, tag: &str) -> Vec<CheckpointInfo> {
        let mut v = Vec::new();
        for i in 0..n {
            let parent = if i == 0 { from.map(str::to_string) } else { Some(format!("{tag}{}", i - 1)) };
            v.push(ck(&format!("{tag}{i}"), parent.as_deref()));
        }
        v
    }

    fn width(t: &str) -> usize {
        t.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    }

    #[test]
    fn tree_shape() {
        let cks = vec![ck("a", None), ck("b", Some("a")), ck("c", Some("b")), ck("d", Some("a"))];
        let mut based = HashMap::new();
        based.insert("c".to_string(), vec!["sb-x".to_string()]);
        let t = checkpoint_tree(&cks, &based, false);
        let lines: Vec<&str> = t.text.lines().collect();
        assert_eq!(lines.len(), 4, "{}", t.text);
        assert!(lines[0].starts_with("a  "));
        assert!(lines[1].starts_with("├── b  "));
        // b's only child continues b's run: same column, no connector.
        assert!(lines[2].starts_with("│   c  "), "{}", t.text);
        assert!(lines[2].ends_with("◀ sb-x"));
        assert!(lines[3].starts_with("└── d  "));
        assert_eq!(t.folded, 0);
    }

    #[test]
    fn a_chain_of_1000_stays_narrow_and_folds() {
        let cks = chain(1000, None, "c");
        let line_width = width(&checkpoint_tree(&cks[..1], &HashMap::new(), false).text);
        let t = checkpoint_tree(&cks, &HashMap::new(), false);
        let lines: Vec<&str> = t.text.lines().collect();
        assert_eq!(lines.len(), FOLD_HEAD + 1 + FOLD_TAIL, "{}", t.text);
        assert_eq!(lines[FOLD_HEAD], "… 980 more …");
        assert_eq!(t.folded, 980);
        assert!(lines[0].starts_with("c0  ") && lines[FOLD_HEAD - 1].starts_with("c9  "));
        assert!(lines[FOLD_HEAD + 1].starts_with("c990  ") && lines.last().unwrap().starts_with("c999  "));
        assert!(width(&t.text) <= line_width + 2, "every line as wide as one checkpoint's:\n{}", t.text);

        let all = checkpoint_tree(&cks, &HashMap::new(), true);
        assert_eq!(all.text.lines().count(), 1000);
        assert_eq!(all.folded, 0);
        assert!(!all.text.contains("more …"));
        assert!(width(&all.text) <= line_width + 2, "no indentation per level");
        for (i, l) in all.text.lines().enumerate() {
            assert!(l.starts_with(&format!("c{i}  ")), "line {i}: {l}");
        }
    }

    #[test]
    fn a_folded_run_shows_where_sandboxes_stand() {
        let cks = chain(1000, None, "c");
        let mut based = HashMap::new();
        based.insert("c500".to_string(), vec!["sb-a".to_string(), "sb-b".to_string()]);
        based.insert("c999".to_string(), vec!["sb-c".to_string()]);
        let t = checkpoint_tree(&cks, &based, false);
        let lines: Vec<&str> = t.text.lines().collect();
        assert_eq!(lines[FOLD_HEAD], "… 490 more …", "{}", t.text);
        assert!(lines[FOLD_HEAD + 1].starts_with("c500  ") && lines[FOLD_HEAD + 1].ends_with("◀ sb-a, sb-b"));
        assert_eq!(lines[FOLD_HEAD + 2], "… 489 more …");
        assert!(lines.last().unwrap().ends_with("◀ sb-c"));
        assert_eq!(t.folded, 979);
    }

    #[test]
    fn branches_indent_and_their_runs_fold() {
        // root r -> x0..x4, then a branch point x4 -> {y0..y99, z0..z2}, and
        // y50 -> {w0..w29} besides y51.
        let mut cks = vec![ck("r", None)];
        cks.extend(chain(5, Some("r"), "x"));
        cks.extend(chain(100, Some("x4"), "y"));
        cks.extend(chain(3, Some("x4"), "z"));
        cks.extend(chain(30, Some("y50"), "w"));
        let mut based = HashMap::new();
        based.insert("z2".to_string(), vec!["sb-z".to_string()]);
        let t = checkpoint_tree(&cks, &based, false);
        let lines: Vec<&str> = t.text.lines().collect();
        let at = |id: &str| {
            lines.iter().position(|l| l.trim_start_matches(['│', '├', '└', '─', ' ']).starts_with(&format!("{id}  ")))
        };
        // The trunk r, x0..x4 in column 0.
        for id in ["r", "x0", "x4"] {
            assert!(lines[at(id).unwrap()].starts_with(&format!("{id}  ")), "{}", t.text);
        }
        // x4 branches: y's run and z's run under connectors, z last.
        assert!(lines[at("y0").unwrap()].starts_with("├── y0  "), "{}", t.text);
        assert!(lines[at("y1").unwrap()].starts_with("│   y1  "));
        assert!(lines[at("y50").unwrap()].starts_with("│   y50  "));
        // y50 branches again: y51.. and w0.. one level deeper.
        assert!(lines[at("y51").unwrap()].starts_with("│   ├── y51  "), "{}", t.text);
        assert!(lines[at("w0").unwrap()].starts_with("│   └── w0  "));
        assert!(lines.contains(&"│   │   … 29 more …"), "{}", t.text);
        assert!(lines.contains(&"│       … 10 more …"), "{}", t.text);
        assert!(lines[at("z0").unwrap()].starts_with("└── z0  "));
        assert!(lines[at("z2").unwrap()].starts_with("    z2  ") && lines[at("z2").unwrap()].ends_with("◀ sb-z"));
        // y's first run (y0..y50) shows 10 at each end.
        assert!(lines.contains(&"│   … 31 more …"), "{}", t.text);
        assert!(at("y9").is_some() && at("y10").is_none() && at("y40").is_none() && at("y41").is_some());
        let all = checkpoint_tree(&cks, &based, true);
        assert_eq!(all.text.lines().count(), cks.len());
        assert!(width(&all.text) <= width(&t.text));
    }

    #[test]
    fn parent_loops_do_not_hang_and_every_checkpoint_is_drawn() {
        let cks = vec![ck("a", Some("b")), ck("b", Some("a")), ck("c", None)];
        let t = checkpoint_tree(&cks, &HashMap::new(), true);
        assert_eq!(t.text.lines().count(), 3, "{}", t.text);
    }

    #[test]
    fn tables_align() {
        let t = table(&["ID", "X"], &[vec!["long-id".into(), "1".into()]]);
        assert_eq!(t, "ID       X\nlong-id  1\n");
    }
}
