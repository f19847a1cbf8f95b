//! `cargo xtask modules [CRATE_SRC_DIR...]`: the `use` graph between the
//! modules of a crate, and its cycles.
//!
//! A module (a file: `a/b.rs` or `a/b/mod.rs` is `a::b`) depends on another
//! when its code names it through `crate::` or `super::` (in `use` items
//! or inline paths, brace groups expanded), resolved to the longest known
//! module prefix. Not counted: `mod` declarations (ownership, not use), the
//! crate root (its `pub use` lines are aliases; `crate::Name` through them
//! is not followed), paths inside comments, and the unit tests at the
//! bottom of a file (from the first `#[cfg(test)]` followed by a `mod`
//! item). A cycle is a strongly connected component of two or more
//! modules. CI runs it on every crate and fails on any cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules of the crate whose sources are under `src`, each with the
/// modules it uses.
pub fn graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let mut files = Vec::new();
    collect(src, &mut files)?;
    let mut modules = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).map_err(|e| e.to_string())?;
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let last = parts.pop().unwrap_or_default();
        match last.as_str() {
            "lib.rs" | "main.rs" if parts.is_empty() => continue,
            "mod.rs" => {}
            other => parts.push(other.trim_end_matches(".rs").to_owned()),
        }
        modules.insert(parts.join("::"), f.clone());
    }
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let mut out = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let code = strip(&text);
        let is_mod_rs = file.ends_with("mod.rs");
        let mut deps = BTreeSet::new();
        for path in paths(&code) {
            let absolute = match path.first().map(String::as_str) {
                Some("crate") => path[1..].to_vec(),
                Some("super") => {
                    // `super` of a file module is its parent; of a mod.rs,
                    // the parent of the directory's module.
                    let mut base: Vec<String> = module.split("::").map(str::to_owned).collect();
                    let mut rest = &path[..];
                    while rest.first().map(String::as_str) == Some("super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    if is_mod_rs {
                        // `super::` in a/mod.rs names a's parent: one more.
                        base.pop();
                    }
                    base.extend(rest.iter().cloned());
                    base
                }
                _ => continue,
            };
            // The longest prefix that is a module.
            let mut target = None;
            for n in (1..=absolute.len()).rev() {
                let candidate = absolute[..n].join("::");
                if known.contains(&candidate) {
                    target = Some(candidate);
                    break;
                }
            }
            if let Some(t) = target {
                if &t != module && !module.starts_with(&format!("{t}::")) {
                    deps.insert(t);
                }
            }
        }
        out.insert(module.clone(), deps);
    }
    Ok(out)
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

/// Every path starting with `crate` or `super`, brace groups expanded.
fn paths(code: &str) -> Vec<Vec<String>> {
    let tokens = tokenize(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        let starts = (t == "crate" || t == "super")
            && tokens.get(i + 1).map(String::as_str) == Some("::")
            && (i == 0 || tokens[i - 1] != "::");
        if starts {
            let (trees, next) = tree(&tokens, i);
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
    }
    if found > 0 {
        Err(format!("{found} module cycles"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brace_groups_and_super_are_expanded() {
        let code = strip(
            "use crate::{a::{B, c}, d};\nuse super::x; // crate::z\nfn f() { crate::e::g(); let s = \"crate::q\"; }",
        );
        let p = paths(&code);
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
}
