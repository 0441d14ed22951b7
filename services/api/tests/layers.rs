//! The api's layering, read from its source (no database needed):
//! - only `src/store/` names `vid_db::schema` (the one place that speaks SQL);
//! - `src/domain/` never imports `routes` or actix-web (domain code is called
//!   by handlers, consumers and the janitor alike);
//! - no import circle between the api's modules.
//!
//! The module graph: one node per source file (`routes/uploads/create.rs` is
//! `routes::uploads::create`); an edge for every `crate::…` or `super::…`
//! path outside comments and `#[cfg(test)]` modules, to the file that
//! defines the module named. A parent's references to its own descendants
//! (it declares, registers and re-exports them) are not edges; everything
//! else is, so a circle through any two files fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files that still name `vid_db::schema` outside `store/`: none.
const SCHEMA_OUTSIDE_STORE: &[&str] = &[];

/// Edges known to close a circle, to be removed by their owner: none.
const KNOWN_EDGES: &[(&str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(relative path, module path, code)` of every source file; code is cut at
/// `#[cfg(test)]` and stripped of `//` comments.
fn sources() -> Vec<(String, String, String)> {
    let mut files = Vec::new();
    collect(&src(), &mut files);
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(src()).unwrap().to_string_lossy().replace('\\', "/");
            let module = rel.trim_end_matches(".rs").trim_end_matches("/mod").replace('/', "::");
            let module = if matches!(module.as_str(), "lib" | "main") { String::new() } else { module };
            let text = std::fs::read_to_string(&file).unwrap();
            let text = text.split("#[cfg(test)]").next().unwrap();
            let code: String = text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
            (rel, module, code)
        })
        .collect()
}

/// Every module path named in `code` (written in `module`): `crate::a::b`,
/// `super::x`, and the members of `use crate::{a, b::c}` groups.
fn references(module: &str, code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let parent = |m: &str| m.rsplit_once("::").map_or(String::new(), |(p, _)| p.to_owned());
    // `super` (in a `mod.rs` as in a leaf file) is the parent of the module.
    let super_base = parent(module);
    for (prefix, base) in [("crate::", String::new()), ("super::", super_base)] {
        for (i, _) in code.match_indices(prefix) {
            if i > 0 && code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &code[i + prefix.len()..];
            let join = |p: &str| if base.is_empty() { p.to_owned() } else { format!("{base}::{p}") };
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let path: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                    if !path.is_empty() && path != "self" {
                        out.insert(join(path.trim_end_matches(':')));
                    } else if path == "self" && !base.is_empty() {
                        out.insert(base.clone());
                    }
                }
            } else {
                let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                out.insert(join(path.trim_end_matches(':')));
            }
        }
    }
    out
}

/// The longest module path among `modules` that `path` starts with.
fn owner<'a>(path: &str, modules: &'a BTreeSet<String>) -> Option<&'a String> {
    let segments: Vec<&str> = path.split("::").collect();
    (1..=segments.len()).rev().map(|n| segments[..n].join("::")).find_map(|p| modules.get(&p))
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let sources = sources();
    let modules: BTreeSet<String> = sources.iter().map(|(_, m, _)| m.clone()).filter(|m| !m.is_empty()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, code) in &sources {
        if module.is_empty() {
            continue;
        }
        for path in references(module, code) {
            let Some(target) = owner(&path, &modules) else { continue };
            let descendant = target.starts_with(&format!("{module}::"));
            if target != module && !descendant && !KNOWN_EDGES.contains(&(module.as_str(), target.as_str())) {
                edges.entry(module.clone()).or_default().insert(target.clone());
            }
        }
    }
    edges
}

#[test]
fn only_the_store_speaks_sql() {
    for (rel, _, code) in sources() {
        if code.contains("vid_db::schema") && !rel.starts_with("store/") {
            assert!(SCHEMA_OUTSIDE_STORE.contains(&rel.as_str()), "src/{rel} names vid_db::schema; move its queries into src/store/");
        }
    }
}

#[test]
fn domain_never_imports_http() {
    for (rel, module, code) in sources() {
        if !rel.starts_with("domain/") {
            continue;
        }
        assert!(!code.contains("actix_web"), "src/{rel} uses actix-web");
        for path in references(&module, &code) {
            for http in ["routes", "openapi", "console", "auth", "idempotency", "error::ApiError", "state"] {
                assert!(!(path == http || path.starts_with(&format!("{http}::"))), "src/{rel} imports crate::{path}");
            }
        }
    }
}

#[test]
fn no_import_circle() {
    let edges = graph();
    assert!(edges.get("routes::operations").is_some_and(|e| e.contains("state")), "the graph reader finds edges: {edges:?}");
    // Depth-first search for a back edge; report the circle.
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let start = stack.iter().position(|n| n == next).unwrap();
                    let mut circle = stack[start..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if !state.contains_key(node) {
            if let Some(circle) = visit(node, &edges, &mut state, &mut Vec::new()) {
                panic!("import circle: {}", circle.join(" -> "));
            }
        }
    }
}

/// The reader itself: grouped, relative and inline paths are all read.
#[test]
fn the_reader_sees_grouped_and_relative_paths() {
    let refs = references("routes::uploads::create", "use super::{load_upload, refusal};\nuse crate::{state::AppState, store::{self}};");
    assert!(refs.contains("routes::uploads::load_upload"), "{refs:?}");
    assert!(refs.contains("state::AppState"), "{refs:?}");
    let refs = references("watch", "let x = crate::routes::operations::OperationRow::x();");
    assert!(refs.contains("routes::operations::OperationRow::x"), "{refs:?}");
}
