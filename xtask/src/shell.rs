//! The server crate's shell boundary: tokio - the runtime, its tasks,
//! timers, sockets and channels - is used only by the shell, so that
//! everything else (the endpoint, the scheduler, admission, the services)
//! stays drivable on simulated time. The shell is `net/` and the cluster's
//! runtime side: its store adapters (NATS, in memory, the store trait's
//! watch channel) and the node's tasks (`cluster/node.rs`). Tests are
//! exempt: a file's `#[cfg(test)]` module at the end and `#[tokio::test]`
//! functions.

use std::path::{Path, PathBuf};

/// Where tokio may appear, relative to `crates/server/src`.
const SHELL: &[&str] = &[
    "net/",
    "cluster/nats.rs",
    "cluster/node.rs",
    "cluster/memory.rs",
    "cluster/store.rs",
];

/// Fails with the places outside the shell that use tokio.
pub fn check(root: &Path) -> Result<(), String> {
    let src = root.join("crates/server/src");
    let mut files = Vec::new();
    collect(&src, &mut files).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut found = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .unwrap_or(&file)
            .to_string_lossy()
            .replace('\\', "/");
        if SHELL.iter().any(|s| rel.starts_with(s)) {
            continue;
        }
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{rel}: {e}"))?;
        found.extend(
            uses(&text)
                .into_iter()
                .map(|(line, code)| format!("crates/server/src/{rel}:{line}: {code}")),
        );
    }
    if found.is_empty() {
        println!("no tokio outside the server's shell");
        return Ok(());
    }
    Err(format!(
        "tokio used outside the server's shell (net/ and the cluster's runtime side):\n{}",
        found.join("\n")
    ))
}

/// The lines of `text` (1-based, trimmed) that use tokio outside comments
/// and tests.
fn uses(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let code = line.trim();
        // The tests at the end of a file.
        if code == "#[cfg(test)]"
            && lines.peek().is_some_and(|(_, next)| {
                next.trim_start().starts_with("mod ")
                    || next.trim_start().starts_with("pub(super) mod ")
                    || next.trim_start().starts_with("pub(crate) mod ")
            })
        {
            break;
        }
        if code.starts_with("//") || code.starts_with("#[tokio::test") {
            continue;
        }
        let code = code.split("//").next().unwrap_or(code);
        if code.contains("tokio::") || code.starts_with("use tokio") {
            out.push((i + 1, line.trim().to_owned()));
        }
    }
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::uses;

    #[test]
    fn finds_tokio_in_code_but_not_in_comments_or_tests() {
        let text = "\
//! Not tokio::spawn in a doc comment.
use std::sync::Arc;
fn a() { tokio::spawn(async {}); } // tokio::here too
/// tokio::time::sleep in docs
#[tokio::test]
async fn b() {}
#[cfg(test)]
mod tests {
    fn c() { tokio::spawn(async {}); }
}
";
        let found = uses(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, 3);
        assert!(uses("use tokio::sync::Notify;\n").len() == 1);
    }
}
