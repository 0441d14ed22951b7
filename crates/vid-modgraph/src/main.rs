//! `vid-modgraph [WORKSPACE_DIR]`: checks every target of every workspace
//! member (library, binaries, tests, examples, benches) for import circles
//! and the layer rules of [`vid_modgraph::LAYER_RULES`]. Exit status: 0 all
//! clean, 1 a circle or a broken rule, 2 the check could not run.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("modgraph: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `(package, target root file)` of every checked target, from `cargo metadata`.
fn targets(dir: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .current_dir(dir)
        .output()
        .context("running cargo metadata")?;
    anyhow::ensure!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr).trim());
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading cargo metadata")?;
    let mut seen = BTreeSet::new();
    let mut found = Vec::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let kinds: Vec<&str> = t["kind"].as_array().into_iter().flatten().filter_map(|k| k.as_str()).collect();
            let checked = kinds.iter().any(|k| matches!(*k, "lib" | "rlib" | "proc-macro" | "bin" | "test" | "example" | "bench"));
            let root = PathBuf::from(t["src_path"].as_str().unwrap_or_default());
            if checked && seen.insert(root.clone()) {
                found.push((p["name"].as_str().unwrap_or_default().to_owned(), root));
            }
        }
    }
    Ok(found)
}

fn run() -> anyhow::Result<bool> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    let (mut modules, mut bad) = (0, 0);
    let targets = targets(&dir)?;
    for (package, root) in &targets {
        let f = vid_modgraph::check(package, root, vid_modgraph::LAYER_RULES)?;
        modules += f.modules;
        for (members, way) in &f.circles {
            bad += 1;
            println!("CIRCLE in {package} ({}): {} modules: {}", root.display(), members.len(), members.join(", "));
            for step in way {
                println!("    {step}");
            }
        }
        for v in &f.layer_violations {
            bad += 1;
            println!("LAYER in {package} ({}): {v}", root.display());
        }
    }
    if bad == 0 {
        println!("modgraph: {} targets, {modules} modules: no import circle, layer rules kept", targets.len());
    } else {
        println!("modgraph: {bad} problem(s) in {} targets ({modules} modules)", targets.len());
    }
    Ok(bad == 0)
}
