//! The module graph of one crate: an edge `a → b` when module `a` names an
//! item of module `b` (in a `use` or in its code). A name is followed to the
//! module that defines it: through `use` bindings and re-exports (`pub use`,
//! globs), so `use crate::Settings` re-exported by `lib.rs` from `settings`
//! is an edge to `settings`, not to the root. Names from other crates are no
//! edges. Circles are the strongly connected components with more than one
//! module (Tarjan's algorithm).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::tree::{display, ModPath, Module};

/// How deep name resolution follows `use` chains before giving up.
const MAX_DEPTH: usize = 16;

/// Edges with, for each, the first path that made it (e.g. `use crate::state::AppState`).
#[derive(Debug, Default)]
pub struct Graph {
    /// `from → (to → evidence)`.
    pub edges: BTreeMap<ModPath, BTreeMap<ModPath, String>>,
}

/// What a name resolves to.
enum Target {
    /// A module of this crate.
    Module(ModPath),
    /// Something outside the crate (std, a dependency).
    External,
}

struct Resolver<'a> {
    mods: &'a BTreeMap<ModPath, Module>,
}

impl Resolver<'_> {
    /// The module a path names from module `from`, or `None` when it is not
    /// this crate's (a dependency, a local item, a variable).
    fn resolve(&self, from: &ModPath, segs: &[String], depth: usize) -> Option<Target> {
        if depth > MAX_DEPTH || segs.is_empty() {
            return None;
        }
        let (mut cur, mut i) = self.start(from, segs, depth)?;
        while let Some(s) = segs.get(i) {
            let m = self.mods.get(&cur)?;
            if m.children.contains(s) {
                cur.push(s.clone());
                i += 1;
                continue;
            }
            // An item of `cur` (or one it re-exports); what follows are its members.
            return match self.definer(&cur, s, depth + 1) {
                Some(t) => Some(t),
                None => Some(Target::Module(cur)),
            };
        }
        Some(Target::Module(cur))
    }

    /// Where resolution starts: `crate`, `self`, `super` (repeated), a child
    /// module, or a name a `use` of `from` binds. Answers the module and the
    /// index of the next segment.
    fn start(&self, from: &ModPath, segs: &[String], depth: usize) -> Option<(ModPath, usize)> {
        let first = segs[0].as_str();
        let mut cur = from.clone();
        let mut i = 0;
        match first {
            "crate" => return Some((Vec::new(), 1)),
            "self" | "super" => {
                if first == "self" {
                    i = 1;
                }
                while segs.get(i).map(String::as_str) == Some("super") {
                    cur.pop()?;
                    i += 1;
                }
                return Some((cur, i));
            }
            _ => {}
        }
        let m = self.mods.get(from)?;
        if m.children.contains(first) {
            cur.push(first.to_owned());
            return Some((cur, 1));
        }
        let leaf = m.uses.iter().find(|u| u.binds.as_deref() == Some(first))?;
        match self.resolve(from, &leaf.segments, depth + 1)? {
            Target::Module(base) => Some((base, 1)),
            Target::External => None,
        }
    }

    /// The module that defines `name` as seen from `module`: the module itself,
    /// or where its `use` of that name (or a glob) leads. `None`: not found.
    fn definer(&self, module: &ModPath, name: &str, depth: usize) -> Option<Target> {
        if depth > MAX_DEPTH {
            return None;
        }
        let m = self.mods.get(module)?;
        if m.items.contains(name) {
            return Some(Target::Module(module.clone()));
        }
        if let Some(leaf) = m.uses.iter().find(|u| u.binds.as_deref() == Some(name)) {
            return Some(self.resolve(module, &leaf.segments, depth + 1).unwrap_or(Target::External));
        }
        for glob in m.uses.iter().filter(|u| u.binds.is_none()) {
            if let Some(Target::Module(g)) = self.resolve(module, &glob.segments, depth + 1) {
                if &g != module {
                    if let Some(t) = self.definer(&g, name, depth + 1) {
                        return Some(t);
                    }
                }
            }
        }
        None
    }
}

/// The graph of a crate's modules (see the module documentation).
pub fn build(mods: &BTreeMap<ModPath, Module>) -> Graph {
    let r = Resolver { mods };
    let mut g = Graph::default();
    for (from, m) in mods {
        let uses = m.uses.iter().map(|u| (&u.segments, "use "));
        let paths = m.paths.iter().map(|p| (p, ""));
        for (segs, how) in uses.chain(paths) {
            if let Some(Target::Module(to)) = r.resolve(from, segs, 0) {
                if &to != from {
                    let evidence = format!("{how}{}", segs.join("::"));
                    g.edges.entry(from.clone()).or_default().entry(to).or_insert(evidence);
                }
            }
        }
    }
    g
}

impl Graph {
    /// Each circle: the modules of one strongly connected component, sorted.
    pub fn circles(&self) -> Vec<Vec<ModPath>> {
        let mut t = Tarjan {
            graph: self,
            index: 0,
            indices: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on: BTreeSet::new(),
            out: Vec::new(),
        };
        let nodes: BTreeSet<&ModPath> = self.edges.keys().chain(self.edges.values().flat_map(|m| m.keys())).collect();
        for n in nodes {
            if !t.indices.contains_key(n) {
                t.connect(n);
            }
        }
        let mut out: Vec<Vec<ModPath>> = t.out.into_iter().filter(|c| c.len() > 1).collect();
        for c in &mut out {
            c.sort();
        }
        out.sort();
        out
    }

    /// A shortest way round from `start` back to it inside `members`, as
    /// `a → b (evidence)` steps.
    pub fn cycle_through(&self, start: &ModPath, members: &[ModPath]) -> Vec<String> {
        let inside: BTreeSet<&ModPath> = members.iter().collect();
        let mut prev: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
        let mut queue: VecDeque<&ModPath> = VecDeque::from([start]);
        let mut last = None;
        'bfs: while let Some(n) = queue.pop_front() {
            for to in self.edges.get(n).into_iter().flat_map(|m| m.keys()).filter(|t| inside.contains(t)) {
                if to == start {
                    last = Some(n);
                    break 'bfs;
                }
                if !prev.contains_key(to) {
                    prev.insert(to, n);
                    queue.push_back(to);
                }
            }
        }
        let Some(mut n) = last else { return Vec::new() };
        let mut path = vec![start, n];
        while n != start {
            n = prev[n];
            path.push(n);
        }
        path.reverse();
        path.windows(2).map(|w| format!("{} → {} ({})", display(w[0]), display(w[1]), self.edges[w[0]][w[1]])).collect()
    }
}

struct Tarjan<'a> {
    graph: &'a Graph,
    index: usize,
    indices: BTreeMap<&'a ModPath, usize>,
    low: BTreeMap<&'a ModPath, usize>,
    stack: Vec<&'a ModPath>,
    on: BTreeSet<&'a ModPath>,
    out: Vec<Vec<ModPath>>,
}

impl<'a> Tarjan<'a> {
    fn connect(&mut self, v: &'a ModPath) {
        self.indices.insert(v, self.index);
        self.low.insert(v, self.index);
        self.index += 1;
        self.stack.push(v);
        self.on.insert(v);
        let graph = self.graph;
        for w in graph.edges.get(v).into_iter().flat_map(|m| m.keys()) {
            if !self.indices.contains_key(w) {
                self.connect(w);
                let lw = self.low[w];
                let lv = self.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if self.on.contains(w) {
                let iw = self.indices[w];
                let lv = self.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if self.low[v] == self.indices[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            self.out.push(component);
        }
    }
}

/// A layer rule of one crate: modules under any of `from` never import a module under any of `never`.
#[derive(Debug, Clone, Copy)]
pub struct LayerRule {
    /// The package (Cargo name), e.g. `vid-api`.
    pub package: &'static str,
    /// Top-level module names of the lower layer, e.g. `domain`.
    pub from: &'static [&'static str],
    /// Top-level module names it must not import, e.g. `routes`.
    pub never: &'static [&'static str],
}

impl LayerRule {
    /// Every edge that breaks the rule, as `a → b (evidence)`.
    pub fn violations(&self, g: &Graph) -> Vec<String> {
        let under = |p: &ModPath, tops: &[&str]| p.first().is_some_and(|t| tops.contains(&t.as_str()));
        let mut out = Vec::new();
        for (from, tos) in g.edges.iter().filter(|(f, _)| under(f, self.from)) {
            for (to, evidence) in tos.iter().filter(|(t, _)| under(t, self.never)) {
                out.push(format!(
                    "{} must not import {}: {} → {} ({evidence})",
                    self.from.join("/"),
                    self.never.join("/"),
                    display(from),
                    display(to)
                ));
            }
        }
        out
    }
}
