//! Reads a crate's module tree from its root file, as rustc finds it: `mod
//! name;` is `name.rs` or `name/mod.rs` next to a root or `mod.rs` file, and
//! under `<file stem>/` next to any other file; `#[path]` is honoured; inline
//! `mod name { … }` nests. Items under `#[cfg(test)]` are left out: tests may
//! reach anywhere. Each module records the paths it names: its `use` trees,
//! every other path of two or more segments in its code (types, calls,
//! patterns), the items it defines, and the names its `use`s bind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use syn::visit::Visit;

/// A module path from the crate root: `[]` is the root, `["routes", "uploads"]` is `crate::routes::uploads`.
pub type ModPath = Vec<String>;

/// One `use` leaf: `use a::b::{c, d as e, *}` gives `a::b::c` (binds `c`),
/// `a::b::d` (binds `e`) and `a::b` (a glob, binds nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseLeaf {
    /// The path as written, e.g. `["crate", "routes", "Router"]`.
    pub segments: Vec<String>,
    /// The name it binds in the module; `None` for a glob.
    pub binds: Option<String>,
}

/// One module of a crate.
#[derive(Debug, Clone, Default)]
pub struct Module {
    /// Its path from the crate root.
    pub path: ModPath,
    /// The file it is in (an inline module is in its parent's file).
    pub file: PathBuf,
    /// Names of its child modules (`mod name;` or `mod name { … }`).
    pub children: BTreeSet<String>,
    /// The names of the items it defines (types, functions, traits, constants, macros).
    pub items: BTreeSet<String>,
    /// Its `use` leaves, including those inside function bodies.
    pub uses: Vec<UseLeaf>,
    /// Every other path of at least two segments (or starting with `crate`,
    /// `self` or `super`) in its code.
    pub paths: Vec<Vec<String>>,
}

impl Module {
    /// `crate`, or `crate::a::b`.
    pub fn name(&self) -> String {
        display(&self.path)
    }
}

/// `crate::a::b` for `["a", "b"]`, `crate` for the root.
pub fn display(path: &[String]) -> String {
    std::iter::once("crate").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join("::")
}

/// Every module of the crate whose root file is `root` (`lib.rs`, `main.rs`,
/// a test or an example), keyed by path. Errors: a file that cannot be read
/// or parsed, or a `mod name;` with no file.
pub fn load(root: &Path) -> anyhow::Result<BTreeMap<ModPath, Module>> {
    let mut out = BTreeMap::new();
    let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
    load_file(root, Vec::new(), &dir, &mut out)?;
    Ok(out)
}

fn load_file(file: &Path, path: ModPath, child_dir: &Path, out: &mut BTreeMap<ModPath, Module>) -> anyhow::Result<()> {
    let src = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let ast = syn::parse_file(&src).with_context(|| format!("parsing {}", file.display()))?;
    load_items(&ast.items, path, file, child_dir, out)
}

fn load_items(
    items: &[syn::Item],
    path: ModPath,
    file: &Path,
    child_dir: &Path,
    out: &mut BTreeMap<ModPath, Module>,
) -> anyhow::Result<()> {
    let mut module = Module { path: path.clone(), file: file.to_path_buf(), ..Default::default() };
    let mut refs = Refs::default();
    for item in items {
        if is_cfg_test(item_attrs(item)) {
            continue;
        }
        if let Some(name) = item_name(item) {
            module.items.insert(name);
        }
        match item {
            syn::Item::Mod(m) => {
                let name = m.ident.to_string();
                module.children.insert(name.clone());
                let mut child = path.clone();
                child.push(name.clone());
                match &m.content {
                    Some((_, inner)) => load_items(inner, child, file, &child_dir.join(&name), out)?,
                    None => {
                        let (child_file, grand_dir) = mod_file(file, child_dir, &name, &m.attrs)?;
                        load_file(&child_file, child, &grand_dir, out)?;
                    }
                }
            }
            other => refs.visit_item(other),
        }
    }
    module.uses = refs.uses;
    module.paths = refs.paths;
    out.insert(path, module);
    Ok(())
}

/// The file of `mod name;` declared in `file`, and the directory of its own children.
fn mod_file(file: &Path, child_dir: &Path, name: &str, attrs: &[syn::Attribute]) -> anyhow::Result<(PathBuf, PathBuf)> {
    if let Some(p) = path_attr(attrs) {
        let f = file.parent().unwrap_or(Path::new(".")).join(p);
        let dir = f.parent().unwrap_or(Path::new(".")).to_path_buf();
        return Ok((f, dir));
    }
    let flat = child_dir.join(format!("{name}.rs"));
    if flat.is_file() {
        return Ok((flat, child_dir.join(name)));
    }
    let nested = child_dir.join(name).join("mod.rs");
    if nested.is_file() {
        return Ok((nested, child_dir.join(name)));
    }
    bail!("{}: `mod {name};` has no file ({} or {})", file.display(), flat.display(), nested.display())
}

/// `#[path = "…"]`.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
        syn::Meta::NameValue(nv) => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// `#[cfg(test)]`, `#[cfg(all(test, …))]` (not `#[cfg(not(test))]`).
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let syn::Meta::List(list) = &a.meta else { return false };
        if !list.path.is_ident("cfg") {
            return false;
        }
        let text = list.tokens.to_string();
        let words: Vec<&str> = text.split(|c: char| !(c.is_alphanumeric() || c == '_')).collect();
        words.contains(&"test") && !words.contains(&"not")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The name an item defines in its module's namespace, if any (modules are children, not items).
fn item_name(item: &syn::Item) -> Option<String> {
    use syn::Item::*;
    let ident = match item {
        Const(i) => &i.ident,
        Enum(i) => &i.ident,
        Fn(i) => &i.sig.ident,
        Macro(i) => i.ident.as_ref()?,
        Static(i) => &i.ident,
        Struct(i) => &i.ident,
        Trait(i) => &i.ident,
        TraitAlias(i) => &i.ident,
        Type(i) => &i.ident,
        Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Collects the paths a module's items name.
#[derive(Default)]
struct Refs {
    uses: Vec<UseLeaf>,
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_cfg_test(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }
    // Inline modules are modules of their own (see `load_items`); one nested in a function is skipped.
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            flatten(&u.tree, Vec::new(), &mut self.uses);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    // `pub(in crate::a)` names a path without depending on it.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
    // Attribute arguments (`#[utoipa::path(responses(crate::openapi::X))]`) and
    // macro bodies (`json!`, `select!`) are tokens, not syntax: their paths are
    // read from the tokens.
    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        if let syn::Meta::List(list) = &a.meta {
            token_paths(list.tokens.clone(), &mut self.paths);
        }
        if let syn::Meta::NameValue(nv) = &a.meta {
            self.visit_expr(&nv.value);
        }
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        syn::visit::visit_path(self, &m.path);
        token_paths(m.tokens.clone(), &mut self.paths);
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let relative = matches!(segments.first().map(String::as_str), Some("crate" | "self" | "super"));
        if p.leading_colon.is_none() && (segments.len() >= 2 || relative) {
            self.paths.push(segments);
        }
        syn::visit::visit_path(self, p);
    }
}

/// Every `a::b…` sequence in `tokens` (groups included) of at least two
/// segments, or starting with `crate`, `self` or `super`.
fn token_paths(tokens: proc_macro2::TokenStream, out: &mut Vec<Vec<String>>) {
    use proc_macro2::{Spacing, TokenTree};
    let mut current: Vec<String> = Vec::new();
    // `colon`: the first `:` of a `::` right after a segment; `sep`: a whole `::`.
    let (mut colon, mut sep) = (false, false);
    for tt in tokens {
        match tt {
            TokenTree::Ident(i) if current.is_empty() || sep => {
                current.push(i.to_string());
                (colon, sep) = (false, false);
            }
            TokenTree::Punct(p) if p.as_char() == ':' && !current.is_empty() && !sep => {
                if colon {
                    sep = true;
                } else if p.spacing() == Spacing::Joint {
                    colon = true;
                } else {
                    keep_path(&mut current, out);
                }
            }
            other => {
                keep_path(&mut current, out);
                (colon, sep) = (false, false);
                match other {
                    TokenTree::Group(g) => token_paths(g.stream(), out),
                    TokenTree::Ident(i) => current.push(i.to_string()),
                    _ => {}
                }
            }
        }
    }
    keep_path(&mut current, out);
}

/// Moves `current` to `out` when it is a path worth resolving; empties it.
fn keep_path(current: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let relative = matches!(current.first().map(String::as_str), Some("crate" | "self" | "super"));
    if current.len() >= 2 || relative {
        out.push(std::mem::take(current));
    }
    current.clear();
}

/// The leaves of a `use` tree, each with its full path.
pub fn flatten(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<UseLeaf>) {
    let with = |name: &syn::Ident| {
        let mut p = prefix.clone();
        p.push(name.to_string());
        p
    };
    match tree {
        syn::UseTree::Path(p) => flatten(&p.tree, with(&p.ident), out),
        syn::UseTree::Name(n) if n.ident == "self" => out.push(UseLeaf { binds: prefix.last().cloned(), segments: prefix }),
        syn::UseTree::Name(n) => out.push(UseLeaf { segments: with(&n.ident), binds: Some(n.ident.to_string()) }),
        syn::UseTree::Rename(r) if r.ident == "self" => out.push(UseLeaf { segments: prefix, binds: Some(r.rename.to_string()) }),
        syn::UseTree::Rename(r) => out.push(UseLeaf { segments: with(&r.ident), binds: Some(r.rename.to_string()) }),
        syn::UseTree::Glob(_) => out.push(UseLeaf { segments: prefix, binds: None }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix.clone(), out);
            }
        }
    }
}
