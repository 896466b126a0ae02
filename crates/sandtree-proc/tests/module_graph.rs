//! The crate's module import graph has no cycle (issue 37).
//!
//! A node is a top-level module of `src/` (a file `x.rs`, or a directory
//! `x/` with everything under it); an edge `a -> b` is a path `crate::b`
//! written in `a`'s code (in a `use` or an expression; comments and doc
//! links do not count), `use crate::{b, ...}` groups included, and a
//! path `crate::Item` to an item `lib.rs` re-exports from `b` (`pub use
//! b::Item`) counts as one to `b`. A cycle is reported with its
//! modules in order. `cargo test -p sandtree-proc --test module_graph --
//! --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`None`: `lib.rs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(m) => Some(m.to_string()),
        None => Some(first),
    }
}

/// The first path segment of each item of a `use` group's body
/// (`a::{b, c}, d as e, f::*` -> a, d, f), braces nested.
fn group_heads(body: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut item) = (0, String::new());
    for ch in body.chars().chain([',']) {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                let head: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !head.is_empty() {
                    heads.push(head);
                }
                item.clear();
                continue;
            }
            _ => {}
        }
        if depth == 0 {
            item.push(ch);
        }
    }
    heads
}

/// The modules that `text` names as `crate::m`.
fn references(text: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(body) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = body
                .char_indices()
                .find(|(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(body.len(), |(i, _)| i);
            refs.extend(group_heads(&body[..end]));
        } else {
            let head: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            refs.insert(head);
        }
    }
    refs
}

/// The items `lib.rs` re-exports, by name: the module each comes from
/// (`pub use m::Item;`, `pub use m::{A, B};`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else { continue };
        let Some((module, rest)) = path.split_once("::") else { continue };
        let rest = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for item in rest.split(',') {
            let name = item.split_whitespace().last().unwrap_or("").to_string();
            if !name.is_empty() {
                items.insert(name, module.to_string());
            }
        }
    }
    items
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let items = reexports(&lib);
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for f in &files {
        let Some(m) = module_of(&src, f) else { continue };
        let text = std::fs::read_to_string(f).expect("read source");
        let text: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
        for r in references(&text) {
            let r = items.get(&r).cloned().unwrap_or(r);
            if r != m && modules.contains(&r) {
                g.get_mut(&m).expect("known module").insert(r);
            }
        }
    }
    g
}

/// A cycle of `g`, if it has one (depth-first search, grey/black marks).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for next in &g[n] {
            if let Some(c) = visit(next, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

/// The groups of modules that import each other, directly or not (the
/// strongly connected components of more than one module).
fn knots(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for m in &g[&n] {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|n| (n, reach(n))).collect();
    let mut knots: Vec<BTreeSet<String>> = Vec::new();
    for n in g.keys() {
        let knot: BTreeSet<String> =
            g.keys().filter(|m| reached[n].contains(*m) && reached[m].contains(n)).cloned().collect();
        if knot.len() > 1 && !knots.contains(&knot) {
            knots.push(knot);
        }
    }
    knots
}

#[test]
fn use_groups_and_paths_are_read() {
    let text = "use crate::{inject::{self, Tracee}, model, Error};\nlet x = crate::procfs::status(1);";
    let refs = references(text);
    assert_eq!(refs, ["Error", "inject", "model", "procfs"].into_iter().map(String::from).collect());
}

#[test]
fn reexported_items_count_as_their_module() {
    let lib = "pub use a::Item;\npub use b::{One, Two as Three};\npub use c::d;";
    let items = reexports(lib);
    assert_eq!(items.get("Item").map(String::as_str), Some("a"));
    assert_eq!(items.get("One").map(String::as_str), Some("b"));
    assert_eq!(items.get("Three").map(String::as_str), Some("b"));
    assert_eq!(items.get("d").map(String::as_str), Some("c"));
}

#[test]
fn a_cycle_is_found_and_a_chain_is_not() {
    let edges = |e: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in e {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(find_cycle(&edges(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        find_cycle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a", "b", "c", "a"].into_iter().map(String::from).collect())
    );
}

#[test]
fn the_module_graph_has_no_cycle() {
    let g = graph();
    for (m, deps) in &g {
        println!("{m} -> {}", deps.iter().cloned().collect::<Vec<_>>().join(" "));
    }
    for knot in knots(&g) {
        println!("modules that import each other: {}", knot.iter().cloned().collect::<Vec<_>>().join(" "));
    }
    if let Some(cycle) = find_cycle(&g) {
        panic!("the module graph of sandtree-proc has a cycle: {}", cycle.join(" -> "));
    }
}
