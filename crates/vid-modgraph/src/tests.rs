//! The checker on small crates written to a temporary directory: it must
//! find the circles and broken rules that are there, and only those.

use std::path::{Path, PathBuf};

use super::*;

/// A crate in a fresh directory: `files` are (path under `src/`, text).
fn krate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vid-modgraph-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let p = dir.join("src").join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir.join("src/lib.rs")
}

fn run(root: &Path, rules: &[LayerRule]) -> Findings {
    check("fixture", root, rules).unwrap()
}

#[test]
fn a_circle_of_three_files_is_found_with_a_way_round_it() {
    let root = krate(
        "three",
        &[
            ("lib.rs", "pub mod state;\npub mod watch;\npub mod routes;\n"),
            ("state.rs", "use crate::watch::Watcher;\npub struct AppState(Watcher);\n"),
            ("watch.rs", "pub struct Watcher;\nimpl Watcher { fn f() { crate::routes::operations::wait(); } }\n"),
            ("routes/mod.rs", "pub mod operations;\n"),
            ("routes/operations.rs", "use crate::state::AppState;\npub fn wait() {}\n"),
        ],
    );
    let f = run(&root, &[]);
    assert_eq!(f.modules, 5);
    assert_eq!(f.circles.len(), 1, "{f:?}");
    let (members, way) = &f.circles[0];
    assert_eq!(members, &["crate::routes::operations", "crate::state", "crate::watch"]);
    assert_eq!(way.len(), 3, "{way:?}");
    assert!(way[0].starts_with("crate::routes::operations → crate::state (use crate::state::AppState)"), "{way:?}");
}

#[test]
fn a_tree_without_circles_passes_and_re_exports_are_followed() {
    let root = krate(
        "clean",
        &[
            ("lib.rs", "pub mod settings;\npub mod app;\npub use settings::Settings;\npub use app::App;\n"),
            ("settings.rs", "pub struct Settings;\n"),
            // `crate::Settings` is `settings::Settings`: no edge to the root, which re-exports `app`.
            ("app.rs", "use crate::Settings;\npub struct App(Settings);\n"),
        ],
    );
    let f = run(&root, &[]);
    assert!(f.circles.is_empty(), "{f:?}");
}

#[test]
fn super_globs_aliases_and_inline_modules_make_edges() {
    let root = krate(
        "forms",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b as other;\npub fn f() { other::g(); }\npub mod inner { pub fn h() { super::super::b::g(); } }\n"),
            ("b.rs", "pub fn g() {}\nmod child;\n"),
            ("b/child.rs", "use super::*;\nfn k() { crate::a::inner::h(); }\n"),
        ],
    );
    let f = run(&root, &[]);
    // b::child → b (glob) and b::child → a::inner → b; b only declares child: no circle.
    assert!(f.circles.is_empty(), "{f:?}");
    let root = krate(
        "forms2",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub mod inner { pub fn h() { super::super::b::g(); } }\n"),
            ("b.rs", "pub fn g() { crate::a::inner::h(); }\n"),
        ],
    );
    let f = run(&root, &[]);
    assert_eq!(f.circles.len(), 1, "{f:?}");
    assert_eq!(f.circles[0].0, ["crate::a::inner", "crate::b"]);
}

#[test]
fn test_modules_and_other_crates_make_no_edges() {
    let root = krate(
        "tests",
        &[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            ("a.rs", "pub fn f() { crate::b::g(); }\n#[cfg(test)]\nmod tests { use crate::b::*; }\n"),
            ("b.rs", "use std::collections::HashMap;\npub fn g() { let _ = HashMap::<u8, u8>::new(); }\n#[cfg(test)]\nfn t() { crate::a::f(); }\n"),
        ],
    );
    let f = run(&root, &[]);
    assert!(f.circles.is_empty(), "{f:?}");
}

#[test]
fn a_domain_module_importing_routes_breaks_the_layer_rule() {
    let root = krate(
        "layers",
        &[
            ("lib.rs", "pub mod domain;\npub mod routes;\npub mod store;\n"),
            ("domain/mod.rs", "pub mod operation;\n"),
            ("domain/operation.rs", "use crate::routes::operations::MAX;\npub fn cancel() { crate::store::save(); }\n"),
            ("routes/mod.rs", "pub mod operations;\n"),
            ("routes/operations.rs", "pub const MAX: u32 = 1;\npub fn cancel() { crate::domain::operation::cancel(); }\n"),
            ("store.rs", "pub fn save() {}\n"),
        ],
    );
    let rules = [LayerRule { package: "fixture", from: &["domain", "store"], never: &["routes"] }];
    let f = run(&root, &rules);
    assert_eq!(f.layer_violations.len(), 1, "{f:?}");
    assert!(f.layer_violations[0].contains("crate::domain::operation → crate::routes::operations"), "{f:?}");
    assert_eq!(f.circles.len(), 1, "domain ↔ routes is also a circle: {f:?}");
    let other_package = [LayerRule { package: "vid-api", ..rules[0] }];
    assert!(run(&root, &other_package).layer_violations.is_empty(), "rules apply to their package only");
}

#[test]
fn a_missing_module_file_is_an_error() {
    let root = krate("missing", &[("lib.rs", "mod gone;\n")]);
    let e = check("fixture", &root, &[]).unwrap_err();
    assert!(format!("{e:#}").contains("`mod gone;` has no file"), "{e:#}");
}
