//! `cargo xtask modules [CRATE_SRC_DIR...]`: the `use` graph between the
//! modules of a crate, and its cycles.
//!
//! A module (a file: `a/b.rs` or `a/b/mod.rs` is `a::b`) depends on another
//! when its code names it through `crate::`, `self::` or `super::` (in
//! `use` items or inline paths, brace groups expanded; a `use` item may
//! also start at a child module), resolved to the longest known module
//! prefix. Names are followed through the top-level `use` items of
//! the module they are named in (`pub use` re-exports, and the private
//! imports a child may name through `super::`), globs included, to the
//! module that defines them: `crate::Name` behind `pub use a::b::Name` in
//! the crate root is an edge to `a::b`, and `crate::a::Name` behind
//! `pub use b::Name` in `a/mod.rs` is an edge to `a` and to `a::b`. A glob
//! import (`use crate::*`) is an edge to the defining module of each name
//! the file uses that the glob brings in. Not counted: `mod` declarations
//! (ownership, not use), the crate root as a node (it owns the modules),
//! edges from a module to its own ancestors, paths inside comments and
//! literals, and the unit tests at the bottom of a file (from the first
//! `#[cfg(test)]` followed by a `mod` item). A cycle is a strongly
//! connected component of two or more modules. CI runs it on every crate
//! and fails on any cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// How deep a chain of re-exports is followed; legal Rust has short ones,
/// the bound only stops glob loops (`a` re-exports `b::*` and `b` `a::*`).
const MAX_HOPS: usize = 16;

/// What a module's top level makes nameable in it: its own items, the
/// names its `use` items import (`None` for a name from another crate),
/// and the modules it glob-imports.
#[derive(Default)]
struct Names {
    defs: BTreeSet<String>,
    imports: BTreeMap<String, Option<Vec<String>>>,
    globs: Vec<Vec<String>>,
}

/// One name a `use` tree brings in.
#[derive(Debug, PartialEq)]
enum UseEntry {
    /// `path` imported as `name` (its last segment or its `as` alias).
    Name { path: Vec<String>, name: String },
    /// `path::*`.
    Glob { path: Vec<String> },
}

/// A crate's modules keyed by path (`""` is the crate root), with the
/// stripped code and the names of each.
struct Crate {
    code: BTreeMap<String, String>,
    names: BTreeMap<String, Names>,
}

impl Crate {
    /// The absolute path (without `crate`) of `path` named in `module`, or
    /// `None` for a path into another crate. `relative_children` also
    /// resolves a bare first segment naming a child module, as `use` items
    /// do since the 2018 edition.
    fn absolute(
        &self,
        module: &str,
        path: &[String],
        relative_children: bool,
    ) -> Option<Vec<String>> {
        let first = path.first()?.as_str();
        let mut base = split(module);
        match first {
            "crate" => Some(path[1..].to_vec()),
            "self" => {
                base.extend(path[1..].iter().cloned());
                Some(base)
            }
            "super" => {
                // `super` of a file module is its parent; `super` in
                // a/mod.rs names a's parent too (the module is `a`).
                let mut rest = path;
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                Some(base)
            }
            child if relative_children => {
                let mut candidate = base.clone();
                candidate.push(child.to_owned());
                if self.code.contains_key(&candidate.join("::")) {
                    base.extend(path.iter().cloned());
                    Some(base)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// The longest prefix of `abs` that is a module (the root at least),
    /// and its length.
    fn owner(&self, abs: &[String]) -> (String, usize) {
        for n in (1..=abs.len()).rev() {
            let candidate = abs[..n].join("::");
            if self.code.contains_key(&candidate) {
                return (candidate, n);
            }
        }
        (String::new(), 0)
    }

    /// The modules `abs` depends on: the module it falls in, and, when the
    /// name after it was imported there, the modules the import leads to.
    fn resolve(&self, abs: &[String], hops: usize, out: &mut BTreeSet<String>) {
        let (module, n) = self.owner(abs);
        if !module.is_empty() {
            out.insert(module.clone());
        }
        let Some(name) = abs.get(n) else { return };
        if hops >= MAX_HOPS {
            return;
        }
        if let Some(Some(target)) = self.lookup(&module, name, hops) {
            if target[..] == abs[..=n] {
                // Defined right here.
                return;
            }
            let mut next = target;
            next.extend(abs[n + 1..].iter().cloned());
            self.resolve(&next, hops + 1, out);
        }
    }

    /// Where `name`, named in `module`, comes from: `Some(Some(path))` for
    /// an item of this crate (defined in `module` or imported into it),
    /// `Some(None)` for one of another crate, `None` when not found (a
    /// variant, a macro, a name of the prelude).
    fn lookup(&self, module: &str, name: &str, hops: usize) -> Option<Option<Vec<String>>> {
        let names = self.names.get(module)?;
        if names.defs.contains(name) {
            let mut p = split(module);
            p.push(name.to_owned());
            return Some(Some(p));
        }
        if let Some(target) = names.imports.get(name) {
            return Some(target.clone());
        }
        if hops >= MAX_HOPS {
            return None;
        }
        for g in &names.globs {
            let (gm, n) = self.owner(g);
            if n == g.len() {
                if let Some(found) = self.lookup(&gm, name, hops + 1) {
                    return Some(found);
                }
            }
        }
        None
    }
}

fn split(module: &str) -> Vec<String> {
    if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    }
}

/// The modules of the crate whose sources are under `src`, each with the
/// modules it uses.
pub fn graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let mut files = Vec::new();
    collect(src, &mut files)?;
    let mut code = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).map_err(|e| e.to_string())?;
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let last = parts.pop().unwrap_or_default();
        match last.as_str() {
            "lib.rs" | "main.rs" if parts.is_empty() => {}
            "mod.rs" => {}
            other => parts.push(other.trim_end_matches(".rs").to_owned()),
        }
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        code.insert(parts.join("::"), strip(&text));
    }
    Ok(graph_of(code))
}

/// The graph of a crate given each module's path (`""` for the root) and
/// stripped code.
fn graph_of(code: BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut krate = Crate {
        code,
        names: BTreeMap::new(),
    };
    let mut names = BTreeMap::new();
    for (module, text) in &krate.code {
        let tokens = tokenize(text);
        let mut n = Names {
            defs: definitions(&tokens),
            ..Names::default()
        };
        for entry in top_level_uses(&tokens) {
            match entry {
                UseEntry::Name { path, name } => {
                    let abs = krate.absolute(module, &path, true);
                    n.imports.insert(name, abs);
                }
                UseEntry::Glob { path } => {
                    if let Some(abs) = krate.absolute(module, &path, true) {
                        n.globs.push(abs);
                    }
                }
            }
        }
        names.insert(module.clone(), n);
    }
    krate.names = names;
    let mut out = BTreeMap::new();
    for (module, text) in &krate.code {
        if module.is_empty() {
            continue;
        }
        let mut reached = BTreeSet::new();
        let tokens = tokenize(text);
        for path in paths(&tokens) {
            if let Some(abs) = krate.absolute(module, &path, false) {
                krate.resolve(&abs, 0, &mut reached);
            }
        }
        // `use` items may also start at a child module (`use conn::X`).
        for entry in top_level_uses(&tokens) {
            let (UseEntry::Name { path, .. } | UseEntry::Glob { path }) = entry;
            if let Some(abs) = krate.absolute(module, &path, true) {
                krate.resolve(&abs, 0, &mut reached);
            }
        }
        // Names a glob import brings into this module, each followed to
        // where it is defined.
        let own = &krate.names[module];
        if !own.globs.is_empty() {
            for ident in path_heads(&tokens) {
                if own.defs.contains(ident) || own.imports.contains_key(ident) {
                    continue;
                }
                for g in &own.globs {
                    let (gm, n) = krate.owner(g);
                    if n != g.len() {
                        continue;
                    }
                    if let Some(found) = krate.lookup(&gm, ident, 0) {
                        reached.insert(gm.clone());
                        if let Some(target) = found {
                            krate.resolve(&target, 1, &mut reached);
                        }
                        break;
                    }
                }
            }
        }
        let deps = reached
            .into_iter()
            .filter(|t| !t.is_empty() && t != module && !module.starts_with(&format!("{t}::")))
            .collect();
        out.insert(module.clone(), deps);
    }
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let p = e.map_err(|e| e.to_string())?.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// The code without comments, string literals and the trailing unit-test
/// module.
fn strip(text: &str) -> String {
    let cut = text
        .match_indices("#[cfg(test)]")
        .find(|(i, _)| {
            let after = &text[i + 12..];
            let next = after
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with("#["));
            next.is_some_and(|l| l.starts_with("mod ") || l.starts_with("pub mod "))
        })
        .map_or(text.len(), |(i, _)| i);
    let text = &text[..cut];
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'r'
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
            && matches!(b.get(i + 1), Some(b'"' | b'#'))
            && raw_string_end(b, i + 1).is_some()
        {
            // r"..." or r#"..."#: no escapes, ends at `"` and as many `#`.
            i = raw_string_end(b, i + 1).unwrap_or(b.len());
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '{') becomes ' '; a lifetime stays.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b.get(i + 3..)
                    .and_then(|r| r.iter().position(|&c| c == b'\''))
                    .map(|p| i + 3 + p)
            } else {
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match end {
                Some(e) => {
                    out.push_str("' '");
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The index after the raw string whose `#`s or `"` start at `i`.
fn raw_string_end(b: &[u8], mut i: usize) -> Option<usize> {
    let mut hashes = 0;
    while b.get(i) == Some(&b'#') {
        hashes += 1;
        i += 1;
    }
    if b.get(i) != Some(&b'"') {
        return None;
    }
    i += 1;
    while i < b.len() {
        if b[i] == b'"'
            && b[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == b'#')
                .count()
                == hashes
        {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(b.len())
}

/// Every path starting with `crate`, `self` or `super`, brace groups
/// expanded.
fn paths(tokens: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        let starts = (t == "crate" || t == "super" || t == "self")
            && tokens.get(i + 1).map(String::as_str) == Some("::")
            && (i == 0 || tokens[i - 1] != "::");
        if starts {
            let (trees, next) = tree(tokens, i);
            out.extend(trees);
            i = next;
        } else {
            i += 1;
        }
    }
    out
}

/// Parses `ident (:: (ident | { tree, ... }))*` at `i`; returns the
/// expanded paths and the index after it.
fn tree(tokens: &[String], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        match tokens.get(i).map(String::as_str) {
            Some("{") => {
                let mut all = Vec::new();
                i += 1;
                loop {
                    match tokens.get(i).map(String::as_str) {
                        Some("}") => {
                            i += 1;
                            break;
                        }
                        Some(",") => i += 1,
                        None => break,
                        _ => {
                            let (subs, next) = tree(tokens, i);
                            for s in subs {
                                let mut p = prefix.clone();
                                p.extend(s);
                                all.push(p);
                            }
                            if next == i {
                                i += 1;
                            } else {
                                i = next;
                            }
                        }
                    }
                }
                return (all, i);
            }
            Some(t) if is_ident(t) => {
                prefix.push(t.to_owned());
                i += 1;
                if tokens.get(i).map(String::as_str) == Some("::") {
                    i += 1;
                } else {
                    // `as alias` and the like end the path here.
                    return (vec![prefix], i);
                }
            }
            _ => return (vec![prefix], i),
        }
    }
}

/// The identifiers that start a path or stand alone (not a field, method
/// or later path segment): the names a glob import could have brought in.
fn path_heads(tokens: &[String]) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    for (i, t) in tokens.iter().enumerate() {
        let after_sep = i > 0 && (tokens[i - 1] == "::" || tokens[i - 1] == ".");
        if is_ident(t) && !after_sep {
            out.insert(t.as_str());
        }
    }
    out
}

/// The names of the items a module defines at its top level.
fn definitions(tokens: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "struct" | "enum" | "union" | "trait" | "type" | "fn" | "const" | "static" | "mod"
            | "macro_rules"
                if depth == 0 =>
            {
                // `macro_rules! name`, `static mut NAME`, `const fn name`.
                let mut j = i + 1;
                while tokens
                    .get(j)
                    .is_some_and(|n| matches!(n.as_str(), "!" | "mut"))
                {
                    j += 1;
                }
                if let Some(name) = tokens.get(j) {
                    let keyword = matches!(
                        name.as_str(),
                        "fn" | "unsafe" | "async" | "extern" | "const"
                    );
                    if is_ident(name) && !keyword {
                        out.insert(name.clone());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// What the `use` items at a module's top level import.
fn top_level_uses(tokens: &[String]) -> Vec<UseEntry> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "use" if depth == 0 => {
                let mut start = i + 1;
                // `use ::std::...`: another crate.
                if tokens.get(start).map(String::as_str) == Some("::") {
                    start += 1;
                }
                let (entries, next) = use_tree(tokens, start, Vec::new());
                out.extend(entries);
                i = next.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Parses a `use` tree at `i` under `prefix`: `a::b`, `a::b as c`,
/// `a::*`, `a::{self, b::c, d::*}`.
fn use_tree(tokens: &[String], mut i: usize, mut prefix: Vec<String>) -> (Vec<UseEntry>, usize) {
    loop {
        match tokens.get(i).map(String::as_str) {
            Some("*") => return (vec![UseEntry::Glob { path: prefix }], i + 1),
            Some("{") => {
                let mut all = Vec::new();
                i += 1;
                loop {
                    match tokens.get(i).map(String::as_str) {
                        Some("}") => return (all, i + 1),
                        Some(",") => i += 1,
                        None => return (all, i),
                        _ => {
                            let (subs, next) = use_tree(tokens, i, prefix.clone());
                            all.extend(subs);
                            i = next.max(i + 1);
                        }
                    }
                }
            }
            Some("self")
                if !prefix.is_empty() && tokens.get(i + 1).map(String::as_str) != Some("::") =>
            {
                // `a::{self}` imports `a` itself.
                let name = prefix.last().cloned().unwrap_or_default();
                return alias(tokens, i + 1, prefix, name);
            }
            Some(t) if is_ident(t) => {
                prefix.push(t.to_owned());
                i += 1;
                if tokens.get(i).map(String::as_str) == Some("::") {
                    i += 1;
                } else {
                    let name = t.to_owned();
                    return alias(tokens, i, prefix, name);
                }
            }
            _ => return (Vec::new(), i),
        }
    }
}

/// The end of a `use` leaf: `as name`, `as _` (nothing nameable), or none.
fn alias(tokens: &[String], i: usize, path: Vec<String>, name: String) -> (Vec<UseEntry>, usize) {
    if tokens.get(i).map(String::as_str) == Some("as") {
        match tokens.get(i + 1) {
            Some(a) if a == "_" => (Vec::new(), i + 2),
            Some(a) => (
                vec![UseEntry::Name {
                    path,
                    name: a.clone(),
                }],
                i + 2,
            ),
            None => (Vec::new(), i + 1),
        }
    } else {
        (vec![UseEntry::Name { path, name }], i)
    }
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

fn tokenize(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut s = String::from(c);
            while let Some(&d) = chars.peek() {
                if d.is_alphanumeric() || d == '_' {
                    s.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(s);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push("::".into());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

/// The strongly connected components of two or more modules (Tarjan).
pub fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.g.get(v) {
            for w in ws {
                let w = w.as_str();
                if !t.g.contains_key(w) {
                    continue;
                }
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// Checks every crate under `crates/` (or the given source folders):
/// prints each crate's cycles, fails when there is one.
pub fn check(root: &Path, dirs: &[PathBuf]) -> Result<(), String> {
    let dirs = if dirs.is_empty() {
        let mut d: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path().join("src")))
            .filter(|p| p.is_dir())
            .collect();
        d.sort();
        d
    } else {
        dirs.to_vec()
    };
    let mut found = 0;
    for dir in &dirs {
        let g = graph(dir)?;
        let edges: usize = g.values().map(BTreeSet::len).sum();
        let cs = cycles(&g);
        eprintln!(
            "{}: {} modules, {edges} use edges, {} cycles",
            dir.display(),
            g.len(),
            cs.len()
        );
        for c in &cs {
            eprintln!("  cycle: {}", c.join(", "));
            for m in c {
                let inside: Vec<&str> = g[m]
                    .iter()
                    .filter(|d| c.contains(d))
                    .map(String::as_str)
                    .collect();
                eprintln!("    {m} -> {}", inside.join(", "));
            }
        }
        found += cs.len();
        if cs.is_empty() && std::env::var_os("XTASK_MODULES_LAYERS").is_some() {
            let folded = fold(&g);
            for c in cycles(&folded) {
                eprintln!("  folded loop: {}", c.join(", "));
                for m in &c {
                    let inside: Vec<&str> = folded[m]
                        .iter()
                        .filter(|d| c.contains(d))
                        .map(String::as_str)
                        .collect();
                    eprintln!("    {m} -> {}", inside.join(", "));
                }
            }
            for (m, ds) in &folded {
                let ds: Vec<&str> = ds.iter().map(String::as_str).collect();
                eprintln!("  uses: {m} -> {}", ds.join(" "));
            }
        }
    }
    if found > 0 {
        Err(format!("{found} module cycles"))
    } else {
        Ok(())
    }
}

/// `g` with submodules folded into their top-level module (uses inside
/// one dropped).
fn fold(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, ds) in g {
        let e = deps.entry(top(m)).or_default();
        e.extend(ds.iter().map(|d| top(d)).filter(|d| *d != top(m)));
    }
    deps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The graph of an in-memory crate: (module path, source) pairs.
    fn graph_from(modules: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        graph_of(
            modules
                .iter()
                .map(|(m, text)| ((*m).to_owned(), strip(text)))
                .collect(),
        )
    }

    fn deps(g: &BTreeMap<String, BTreeSet<String>>, m: &str) -> Vec<String> {
        g[m].iter().cloned().collect()
    }

    #[test]
    fn brace_groups_and_super_are_expanded() {
        let code = strip(
            "use crate::{a::{B, c}, d};\nuse super::x; // crate::z\nfn f() { crate::e::g(); let s = \"crate::q\"; }",
        );
        let p = paths(&tokenize(&code));
        let joined: Vec<String> = p.iter().map(|p| p.join("::")).collect();
        assert_eq!(
            joined,
            [
                "crate::a::B",
                "crate::a::c",
                "crate::d",
                "super::x",
                "crate::e::g"
            ]
        );
    }

    #[test]
    fn a_two_module_loop_is_a_cycle() {
        let mut g = BTreeMap::new();
        g.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
        g.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
        g.insert("c".to_owned(), BTreeSet::from(["a".to_owned()]));
        assert_eq!(cycles(&g), vec![vec!["a".to_owned(), "b".to_owned()]]);
    }

    #[test]
    fn a_loop_through_a_root_re_export_is_a_cycle() {
        // config names pki directly; pki names config only through the
        // crate root's `pub use`.
        let g = graph_from(&[
            ("", "mod config;\nmod pki;\npub use config::ServerConfig;"),
            (
                "config",
                "use crate::pki::Pki;\npub struct ServerConfig { pki: Pki }",
            ),
            (
                "pki",
                "use crate::ServerConfig;\npub struct Pki;\nfn f(_: &ServerConfig) {}",
            ),
        ]);
        assert_eq!(deps(&g, "pki"), ["config"]);
        assert_eq!(
            cycles(&g),
            vec![vec!["config".to_owned(), "pki".to_owned()]]
        );
    }

    #[test]
    fn a_re_export_in_a_mod_rs_leads_to_the_defining_child() {
        // c names a::Thing, which a/mod.rs re-exports from a::b; a::b
        // names c: a cycle between a::b and c, and a (which uses a::b by
        // re-exporting it).
        let g = graph_from(&[
            ("", "mod a;\nmod c;"),
            ("a", "mod b;\npub(crate) use self::b::{Other as _, Thing};"),
            ("a::b", "pub struct Thing(crate::c::Z);"),
            ("c", "pub struct Z;\nfn f(_: crate::a::Thing) {}"),
        ]);
        assert_eq!(deps(&g, "c"), ["a", "a::b"]);
        assert_eq!(deps(&g, "a"), ["a::b"]);
        assert_eq!(
            cycles(&g),
            vec![vec!["a".to_owned(), "a::b".to_owned(), "c".to_owned()]]
        );
    }

    #[test]
    fn chains_globs_and_private_imports_are_followed() {
        let g = graph_from(&[
            // The root glob-re-exports gen, which re-exports from deep.
            ("", "mod gen;\nmod x;\nmod p;\npub use gen::*;"),
            (
                "gen",
                "mod deep;\npub use deep::Table;\npub enum Kind { A }",
            ),
            ("gen::deep", "pub struct Table;"),
            // x takes everything from the root by glob and uses two names.
            (
                "x",
                "use crate::*;\nfn f(_: Table, k: Kind) { k.len(); let v = Vec::new(); }",
            ),
            // p imports privately; its child p::q names that through super.
            ("p", "mod q;\nuse crate::gen::deep::Table as T;"),
            ("p::q", "fn f(_: super::T) {}"),
        ]);
        assert_eq!(deps(&g, "x"), ["gen", "gen::deep"]);
        assert_eq!(deps(&g, "p::q"), ["gen::deep"]);
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn super_in_a_mod_rs_names_the_parent() {
        let g = graph_from(&[
            ("", "mod a;"),
            ("a", "mod b;\nmod c;"),
            ("a::b", "mod d;\nfn f() { super::c::g(); }"),
            ("a::b::d", "fn f() { super::super::c::g(); self::e(); }"),
            ("a::c", "pub fn g() {}"),
        ]);
        assert_eq!(deps(&g, "a::b"), ["a::c"]);
        assert_eq!(deps(&g, "a::b::d"), ["a::c"]);
    }

    #[test]
    fn use_items_parse_into_names_and_globs() {
        let tokens = tokenize(&strip(
            "pub use a::{self, b::C as D, e::*};\nuse ::std::fmt;\nfn f() { use z::Inner; }\nconst fn g() {}\nmacro_rules! m { () => {} }\nstatic mut S: u8 = 0;",
        ));
        let name = |p: &[&str], n: &str| UseEntry::Name {
            path: p.iter().map(|s| (*s).to_owned()).collect(),
            name: n.to_owned(),
        };
        assert_eq!(
            top_level_uses(&tokens),
            [
                name(&["a"], "a"),
                name(&["a", "b", "C"], "D"),
                UseEntry::Glob {
                    path: vec!["a".to_owned(), "e".to_owned()]
                },
                name(&["std", "fmt"], "fmt"),
            ]
        );
        let defs: Vec<String> = definitions(&tokens).into_iter().collect();
        assert_eq!(defs, ["S", "f", "g", "m"]);
    }

    #[test]
    fn char_literals_and_raw_strings_do_not_hide_code() {
        // An unbalanced brace in a char or raw string must not make the
        // `use` after it look nested; a lifetime is no char literal.
        let code = strip(
            "fn f<'a>(x: &'a str) -> char { let _ = r#\"crate::no \"}\"#; '{' }\nconst C: char = '\\'';\nuse crate::yes::Y;",
        );
        let tokens = tokenize(&code);
        let joined: Vec<String> = paths(&tokens).iter().map(|p| p.join("::")).collect();
        assert_eq!(joined, ["crate::yes::Y"]);
        assert_eq!(top_level_uses(&tokens).len(), 1);
    }

    #[test]
    fn a_crate_on_disk_maps_files_to_modules() {
        let dir = std::env::temp_dir().join(format!("xtask-modules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let write = |rel: &str, text: &str| {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap_or(&dir)).map_err(|e| e.to_string())?;
            std::fs::write(p, text).map_err(|e| e.to_string())
        };
        let setup = write("lib.rs", "mod net;\nmod state;\npub use net::Server;")
            .and_then(|()| write("net/mod.rs", "mod conn;\npub use conn::Server;"))
            .and_then(|()| write("net/conn.rs", "pub struct Server(crate::state::S);"))
            .and_then(|()| write("state.rs", "pub struct S;\nfn f(_: crate::Server) {}"));
        let g = setup.and_then(|()| graph(&dir));
        let _ = std::fs::remove_dir_all(&dir);
        let g = g.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(deps(&g, "state"), ["net", "net::conn"]);
        assert_eq!(
            cycles(&g),
            vec![vec![
                "net".to_owned(),
                "net::conn".to_owned(),
                "state".to_owned()
            ]]
        );
    }
}
