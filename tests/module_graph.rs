//! No import circle inside any crate of the workspace: the top-level
//! modules of each crate form a directed acyclic graph, read from the
//! `crate::MODULE` paths of its code (doc comments and `//` comments do not
//! count; an intra-doc link is not an import).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: &[&str] = &[
    "device",
    "store",
    "coordinator",
    "harness",
    "ffi",
    "replay",
    "benches",
    ".",
];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src` belongs to (`lib`/`main` for the
/// crate root).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Top-level modules named after `crate::` in the code lines of `text`.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + 7..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name.clone());
            }
            // `use crate::{a, b::c}` names several.
            if after.starts_with('{') {
                let end = after.find('}').unwrap_or(after.len());
                for part in after[1..end].split(',') {
                    let n: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !n.is_empty() {
                        out.insert(n);
                    }
                }
            }
            rest = after;
        }
    }
    out
}

/// The modules of `graph` on a cycle, if any (depth-first search).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let at = path.iter().position(|p| p == n).unwrap();
                let mut c = path[at..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        let mut path = Vec::new();
        if let Some(c) = visit(n, graph, &mut state, &mut path) {
            return Some(c);
        }
    }
    None
}

fn graph_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let from = module_of(src, &f);
        let text = std::fs::read_to_string(&f).unwrap();
        let to = imports(&text);
        let e = g.entry(from.clone()).or_default();
        for t in to {
            // The crate root re-exports everything; a module's own
            // submodules are not an edge.
            if t != from && t != "lib" && t != "main" && t != "sync" {
                e.insert(t);
            }
        }
    }
    // Only edges to modules of this crate.
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for v in g.values_mut() {
        v.retain(|t| names.contains(t));
    }
    g.remove("lib");
    g.remove("main");
    g
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for c in CRATES {
        let src = root.join(c).join("src");
        let g = graph_of(&src);
        assert!(g.len() > 1, "{}: no modules found", src.display());
        if let Some(cyc) = cycle(&g) {
            panic!("{c}: import circle {}", cyc.join(" -> "));
        }
    }
}

#[test]
fn the_checker_sees_a_circle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let a = imports("use crate::{spec::Group, hash};\nlet x = crate::error::E; // crate::b");
    assert_eq!(
        a,
        ["error", "hash", "spec"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    g.insert("identity".into(), ["spec".to_string()].into());
    g.insert("spec".into(), ["identity".to_string()].into());
    assert!(cycle(&g).is_some());
    g.get_mut("spec").unwrap().clear();
    assert!(cycle(&g).is_none());
}
