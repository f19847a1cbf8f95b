//! docs/cli.md cannot drift from `uascale --help`:
//!
//! - every usage line of `uascale --help` (a line starting `uascale ...`
//!   with its continuation lines starting `[`) appears in docs/cli.md, in an
//!   indented code block, with the same words (whitespace may differ);
//! - the options (`--flag`) the help names and the ones docs/cli.md names
//!   are the same set (the few that are not `uascale`'s own are listed in
//!   [`OTHER_TOOLS_FLAGS`]);
//! - every command of the help is in docs/cli.md's table of commands (the
//!   first table), bench subcommands included;
//! - every security policy the crypto crate offers is named in both.

use std::collections::BTreeSet;
use std::process::Command;

use uascale_crypto::policy::SecurityPolicy;

/// Flags docs/cli.md names that belong to other tools (cargo, the bench
/// scripts).
const OTHER_TOOLS_FLAGS: &[&str] = &["--latency", "--release"];

fn help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_uascale"))
        .arg("--help")
        .output()
        .expect("run uascale");
    assert!(out.status.success());
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");
    std::fs::read_to_string(path).expect("docs/cli.md")
}

/// The usage lines of `text`: a line whose text (after an optional
/// `usage: `) starts with `uascale `, joined with the lines after it that
/// start with `[`, whitespace collapsed. With `indented_only`, only lines
/// indented by at least four spaces (Markdown code blocks) count.
fn synopses(text: &str, indented_only: bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for line in text.lines() {
        if indented_only && !line.starts_with("    ") {
            open = false;
            continue;
        }
        let t = line.trim();
        let t = t.strip_prefix("usage: ").unwrap_or(t);
        if t.starts_with("uascale ") {
            out.push(t.to_owned());
            open = true;
        } else if open && t.starts_with('[') {
            if let Some(last) = out.last_mut() {
                last.push(' ');
                last.push_str(t);
            }
        } else {
            open = false;
        }
    }
    out.into_iter()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Every `--flag` named in `text`.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("--") {
        let start = i + pos;
        let before_ok =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'-');
        let mut end = start + 2;
        while end < b.len()
            && (b[end].is_ascii_lowercase() || b[end].is_ascii_digit() || b[end] == b'-')
        {
            end += 1;
        }
        let name = text[start..end].trim_end_matches('-');
        if before_ok && name.len() > 2 && b[start + 2].is_ascii_lowercase() {
            out.insert(name.to_owned());
        }
        i = end.max(start + 2);
    }
    out
}

/// The commands of a usage line: `uascale` and the words after it up to
/// the first argument (an upper-case placeholder, an option, a bracket).
fn command_of(synopsis: &str) -> String {
    synopsis
        .split_whitespace()
        .skip(1)
        .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn every_usage_line_of_the_help_is_in_the_doc() {
    let help = help();
    let documented = synopses(&doc(), true);
    let from_help = synopses(&help, false);
    assert!(from_help.len() >= 20, "{from_help:#?}");
    let missing: Vec<&String> = from_help
        .iter()
        .filter(|s| !documented.contains(s))
        .collect();
    assert!(
        missing.is_empty(),
        "usage lines of `uascale --help` that docs/cli.md does not show (in a code block, \
         whitespace aside): {missing:#?}"
    );
}

#[test]
fn the_help_and_the_doc_name_the_same_options() {
    let help = flags(&help());
    let doc = flags(&doc());
    let undocumented: Vec<&String> = help.difference(&doc).collect();
    assert!(
        undocumented.is_empty(),
        "options `uascale --help` names that docs/cli.md does not: {undocumented:?}"
    );
    let stale: Vec<&String> = doc
        .difference(&help)
        .filter(|f| !OTHER_TOOLS_FLAGS.contains(&f.as_str()))
        .collect();
    assert!(
        stale.is_empty(),
        "options docs/cli.md names that `uascale --help` does not: {stale:?}"
    );
}

#[test]
fn the_doc_table_lists_every_command() {
    let doc = doc();
    // The first table: `| Command | What |` up to the first blank line.
    let table: String = doc
        .lines()
        .skip_while(|l| !l.starts_with("| Command"))
        .take_while(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    let cells: BTreeSet<String> = table
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|c| {
            c.trim_start_matches("uascale ")
                .split_whitespace()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase()))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let commands: BTreeSet<String> = synopses(&help(), false)
        .iter()
        .map(|s| command_of(s))
        .collect();
    assert!(commands.contains("bench storm"), "{commands:?}");
    // A cell may name a subcommand alone (`browse` after `endpoints`, `show`
    // after `cert create`): its group is the first word of the row.
    let missing: Vec<&String> = commands
        .iter()
        .filter(|c| {
            let last = c.rsplit(' ').next().unwrap_or(c);
            !cells.contains(*c) && !cells.contains(last)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "commands docs/cli.md's table of commands does not list: {missing:?}"
    );
}

#[test]
fn every_security_policy_is_named_in_the_help_and_the_doc() {
    let help = help();
    let doc = doc();
    for policy in SecurityPolicy::ALL {
        let name = policy.uri().rsplit('#').next().unwrap_or_default();
        assert!(help.contains(name), "`uascale --help` does not name {name}");
        assert!(doc.contains(name), "docs/cli.md does not name {name}");
    }
}

/// The parsers find what they should, so the tests above cannot pass by
/// finding nothing.
#[test]
fn the_parsers_find_usage_lines_and_flags() {
    let text = "usage: uascale serve [--port N]\n                     [--bind ADDR]\n  \
                serve  run it (--nodes N)\n       uascale bench read URL\n";
    assert_eq!(
        synopses(text, false),
        [
            "uascale serve [--port N] [--bind ADDR]",
            "uascale bench read URL"
        ]
    );
    assert_eq!(
        synopses("uascale x\n    uascale y [--a]\n", true),
        ["uascale y [--a]"]
    );
    assert_eq!(
        flags(text).into_iter().collect::<Vec<_>>(),
        ["--bind", "--nodes", "--port"]
    );
    assert_eq!(
        command_of("uascale bench floor serve --port P"),
        "bench floor serve"
    );
    assert_eq!(command_of("uascale read URL NODE..."), "read");
}
