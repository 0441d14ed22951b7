//! Keeps every crate of the workspace free of import circles, and the api's
//! layers in order. `make test` runs the `vid-modgraph` binary (a step of
//! `scripts/test.sh`); it exits 1 and prints each circle or broken rule.
//!
//! - [`tree`]: a crate's module tree and the paths each module names, read
//!   with `syn` from its root file;
//! - [`graph`]: the module graph (`a → b` when `a` names an item of `b`),
//!   its circles, and layer rules.
//!
//! Limits: paths inside macro invocations are not seen (their tokens are not
//! Rust syntax until expanded), and neither is code under `#[cfg(test)]`.

pub mod graph;
pub mod tree;

use std::path::Path;

pub use graph::LayerRule;

/// The layer rules `make test` enforces: in the api, domain logic
/// (`domain/`) and persistence (`store/`) never import the HTTP layer (`routes/`).
pub const LAYER_RULES: &[LayerRule] = &[LayerRule { package: "vid-api", from: &["domain", "store"], never: &["routes"] }];

/// What is wrong with one crate target (empty: nothing).
#[derive(Debug, Default)]
pub struct Findings {
    /// The number of modules read.
    pub modules: usize,
    /// One entry per circle: its modules, then one way round it.
    pub circles: Vec<(Vec<String>, Vec<String>)>,
    /// Edges that break a layer rule.
    pub layer_violations: Vec<String>,
}

/// Checks the crate whose root file is `root` (of package `package`) against
/// acyclicity and the `rules` for that package. Errors: unreadable or
/// unparsable sources.
pub fn check(package: &str, root: &Path, rules: &[LayerRule]) -> anyhow::Result<Findings> {
    let mods = tree::load(root)?;
    let g = graph::build(&mods);
    let circles = g
        .circles()
        .into_iter()
        .map(|members| {
            let way = g.cycle_through(&members[0], &members);
            (members.iter().map(|m| tree::display(m)).collect(), way)
        })
        .collect();
    let layer_violations = rules.iter().filter(|r| r.package == package).flat_map(|r| r.violations(&g)).collect();
    Ok(Findings { modules: mods.len(), circles, layer_violations })
}

#[cfg(test)]
mod tests;
