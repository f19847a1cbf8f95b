//! `cargo xtask refs`: the repository's docs, help texts, comments and
//! scripts must make sense to a reader who has only the clone. It fails on
//!
//! - a reference to this project's issues: `issue 12`, `issues 11-13`,
//!   `Issue #12`, or a bare `#12`. The issue tracker is not part of the
//!   clone; say what was done or found instead.
//! - a path to files outside the repository: `../shared`, and the design
//!   notes `SCALABILITY.md` and `DESIGN.md` kept beside it (the repository's
//!   own `docs/scalability.md` carries the section numbers code cites).
//!
//! Allowed: another project's tracker, named with the project, as a full
//! URL (`https://github.com/open62541/open62541/issues/5257`) anywhere, or
//! in Markdown as `open62541 #5257` (the project's name right before the
//! number, from [`OTHER_PROJECTS`]). `../shared` is allowed in `bench/`
//! only, where `bench/compare.sh` builds the independent `uabench` client
//! from a sibling checkout when one is there (it says so and skips it
//! otherwise).
//!
//! Checked: README.md and every `.md`, `.rs`, `.toml`, `.sh`, `.py` and
//! `.txt` file under `docs/`, `crates/`, `xtask/`, `bench/`, `tests/` and
//! `fuzz/` (not `target/`, fuzz corpora or generated code).

use std::path::{Path, PathBuf};

/// Projects whose issue numbers may be cited in Markdown as `NAME #N`.
pub const OTHER_PROJECTS: &[&str] = &[
    "open62541",
    "asyncua",
    "opcua-asyncio",
    "async-opcua",
    "tokio",
    "aws-lc",
    "aws-lc-rs",
    "rustls",
    "nats-server",
    "HAProxy",
];

const ROOTS: &[&str] = &["docs", "crates", "xtask", "bench", "tests", "fuzz"];
const EXTENSIONS: &[&str] = &["md", "rs", "toml", "sh", "py", "txt"];
/// Directories never descended into.
const SKIP_DIRS: &[&str] = &[
    "target",
    "generated",
    "artifacts",
    "corpus",
    "seeds",
    ".git",
];

/// One offending line.
#[derive(Debug, PartialEq)]
pub struct Finding {
    /// The file, relative to the workspace root.
    pub path: String,
    /// 1-based.
    pub line: usize,
    /// What is wrong.
    pub what: &'static str,
}

fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    let mut stack: Vec<PathBuf> = ROOTS.iter().map(|r| root.join(r)).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !SKIP_DIRS.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if path
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| EXTENSIONS.contains(&x))
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// `line` with every URL (`http://...`, `https://...` up to whitespace or
/// a closing bracket) blanked out.
fn without_urls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(pos) = rest.find("http") {
        let (before, from) = rest.split_at(pos);
        out.push_str(before);
        if from.starts_with("http://") || from.starts_with("https://") {
            let end = from
                .find(|c: char| c.is_whitespace() || matches!(c, ')' | '>' | ']' | '"' | '\''))
                .unwrap_or(from.len());
            out.push_str(&" ".repeat(end));
            rest = &from[end..];
        } else {
            out.push_str("http");
            rest = &from[4..];
        }
    }
    out.push_str(rest);
    out
}

/// True if `text` at byte `i` starts a run of digits that is a whole
/// number (not followed by a letter or digit).
fn number_at(text: &str, i: usize) -> bool {
    let b = text.as_bytes();
    let mut end = i;
    while end < b.len() && b[end].is_ascii_digit() {
        end += 1;
    }
    end > i && !(end < b.len() && b[end].is_ascii_alphabetic())
}

/// `issue 12`, `issues 11`, `issue #12`, case-insensitive, as a word.
fn cites_issue(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let b = lower.as_bytes();
    let mut from = 0;
    while let Some(pos) = lower[from..].find("issue") {
        let start = from + pos;
        from = start + 5;
        if start > 0 && b[start - 1].is_ascii_alphanumeric() {
            continue;
        }
        let mut i = start + 5;
        if b.get(i) == Some(&b's') {
            i += 1;
        }
        if b.get(i) != Some(&b' ') {
            continue;
        }
        i += 1;
        if b.get(i) == Some(&b'#') {
            i += 1;
        }
        if number_at(&lower, i) {
            return true;
        }
    }
    false
}

/// A bare `#12` (after the start, a space or an opening bracket), unless
/// `markdown` and the word before it is one of [`OTHER_PROJECTS`].
fn cites_bare_number(line: &str, markdown: bool) -> bool {
    let b = line.as_bytes();
    for (start, _) in line.match_indices('#') {
        let after_gap = start == 0 || matches!(b[start - 1], b' ' | b'\t' | b'(' | b'[');
        // `(#3-request-workers)` is a Markdown anchor, not a number.
        let anchor = matches!(
            b.get(
                start
                    + 1
                    + line[start + 1..]
                        .find(|c: char| !c.is_ascii_digit())
                        .unwrap_or(0)
            ),
            Some(b'-' | b'_')
        );
        if !after_gap || anchor || !number_at(line, start + 1) {
            continue;
        }
        let before = line[..start].trim_end();
        let word = before
            .rsplit(|c: char| c.is_whitespace() || c == '(' || c == '[')
            .next()
            .unwrap_or("")
            .trim_matches(|c| c == '`' || c == '*' || c == '"');
        if markdown && b.get(start.wrapping_sub(1)) == Some(&b' ') && OTHER_PROJECTS.contains(&word)
        {
            continue;
        }
        return true;
    }
    false
}

/// The findings of one file's text; `rel` is its path from the root.
pub fn check_text(rel: &str, text: &str) -> Vec<Finding> {
    let markdown = rel.ends_with(".md");
    let in_bench = rel.starts_with("bench/");
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let plain = without_urls(line);
        let mut found = |what| {
            out.push(Finding {
                path: rel.to_owned(),
                line: n + 1,
                what,
            })
        };
        if cites_issue(&plain) {
            found("cites an issue number (say what was done or found instead)");
        }
        if cites_bare_number(&plain, markdown) {
            found("a bare #NUMBER (another project's issue: name the project or give its URL)");
        }
        if !in_bench && plain.contains("../shared") {
            found("a path outside the repository (../shared)");
        }
        if plain.contains("SCALABILITY.md") || plain.contains("DESIGN.md") {
            found("a file outside the repository (use docs/scalability.md)");
        }
    }
    out
}

/// Checks every file of the workspace at `root`.
pub fn check(root: &Path) -> Result<(), String> {
    let mut findings = Vec::new();
    let mut checked = 0;
    for path in files(root) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        // This file states the rules, with examples of what they refuse.
        if rel == "xtask/src/refs.rs" {
            continue;
        }
        checked += 1;
        findings.extend(check_text(&rel, &text));
    }
    if findings.is_empty() {
        println!("references: {checked} files checked, none cites an issue number or a file outside the repository");
        return Ok(());
    }
    for f in &findings {
        eprintln!("{}:{}: {}", f.path, f.line, f.what);
    }
    Err(format!(
        "{} lines cite issue numbers or files outside the repository (rules: xtask/src/refs.rs)",
        findings.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whats(rel: &str, text: &str) -> Vec<usize> {
        let mut lines: Vec<usize> = check_text(rel, text).into_iter().map(|f| f.line).collect();
        lines.dedup();
        lines
    }

    #[test]
    fn issue_numbers_are_found() {
        let text = "fine\n(issue 12)\nIssue 16, finding 1\nissues 11-13\nissue #7\nsee #12\n\
                    tissue 3\nissue 12a\nthe issue's bound\n";
        assert_eq!(whats("docs/a.md", text), [2, 3, 4, 5, 6]);
        assert_eq!(whats("crates/x/src/a.rs", "// (issue 17)\n"), [1]);
    }

    #[test]
    fn other_projects_may_be_cited_by_name_or_url() {
        let text = "open62541 #5257 in docs, and `open62541 #5257`\n\
                    see https://github.com/open62541/open62541/issues/5257\n\
                    [the bug](https://github.com/tokio-rs/tokio/issues/12)\n\
                    unknownproject #5\n";
        assert_eq!(whats("docs/a.md", text), [4]);
        // Outside Markdown only the URL form is allowed.
        assert_eq!(whats("crates/a.rs", "// open62541 #5257\n"), [1]);
        // Colours, attributes and shebangs are not issue numbers.
        assert!(whats("crates/a.rs", "#[test]\n#!/bin/sh\ncolor:#222;\n").is_empty());
        assert!(whats("docs/a.md", "[queue](#3-request-workers)\n").is_empty());
    }

    #[test]
    fn paths_outside_the_repository_are_found() {
        assert_eq!(whats("docs/a.md", "in ../shared/uabench\n"), [1]);
        assert!(whats("bench/compare.sh", "cd ../shared/uabench\n").is_empty());
        assert_eq!(
            whats(
                "crates/a.rs",
                "// SCALABILITY.md §2\n// docs/scalability.md §2\n"
            ),
            [1]
        );
        assert_eq!(whats("docs/a.md", "see DESIGN.md\n"), [1]);
    }

    /// The repository itself passes (the same check CI runs).
    #[test]
    fn the_repository_is_clean() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root");
        assert!(files(root).len() > 100, "the walk found the files");
        check(root).unwrap();
    }
}
