//! docs/configuration.md cannot drift from the configuration: every key
//! `uascale serve --print-config` prints is listed there, under its
//! section's `## [section]` heading, as a table row whose first cell is the
//! key in backticks and whose third cell is its default as printed - or,
//! for a key whose default is derived (from the CPUs, another key), a cell
//! starting with `derived`; and every key listed there is printed.
//!
//! An optional key (an `Option` unset by default, which `--print-config`
//! leaves out) has the default cell [`UNSET`]: it must not be printed with
//! the defaults, and must be printed once a file sets it.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use uascale_server::admission::host;
use uascale_server::ServerConfig;

use common::TempDir;

/// `section.key` -> the default's cell (None for `[[users]]`, which has no
/// defaults).
type Keys = BTreeMap<String, Option<String>>;

/// The default cell of an optional key, unset by default.
const UNSET: &str = "(unset)";

fn is_optional(documented: &Keys, key: &str) -> bool {
    documented.get(key).and_then(Option::as_deref) == Some(UNSET)
}

fn print_config(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_uascale"))
        .arg("serve")
        .args(args)
        .arg("--print-config")
        .output()
        .expect("run uascale");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The keys of the printed TOML, with their values as one-line TOML.
fn printed_keys(text: &str) -> Keys {
    let table: toml::Table = toml::from_str(text).expect("printed config parses");
    let mut keys = Keys::new();
    for (section, value) in table {
        match value {
            toml::Value::Table(t) => {
                for (key, v) in t {
                    keys.insert(format!("{section}.{key}"), Some(format!("`{v}`")));
                }
            }
            toml::Value::Array(entries) => {
                for entry in entries {
                    let toml::Value::Table(t) = entry else {
                        panic!("[{section}] is an array of non-tables")
                    };
                    for key in t.keys() {
                        keys.insert(format!("{section}.{key}"), None);
                    }
                }
            }
            other => panic!("top-level key {section} = {other} outside a section"),
        }
    }
    keys
}

/// The keys of the doc: table rows ``| `key` | type | default | meaning |``
/// under `## [section]` or `## [[section]]` headings.
fn documented_keys(doc: &str) -> Keys {
    let mut keys = Keys::new();
    let mut section: Option<(String, bool)> = None;
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = if let Some(name) = heading
                .strip_prefix("[[")
                .and_then(|h| h.strip_suffix("]]"))
            {
                Some((name.to_owned(), true))
            } else {
                heading
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .map(|name| (name.to_owned(), false))
            };
            continue;
        }
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let (name, array) = section
            .as_ref()
            .unwrap_or_else(|| panic!("key row outside a section: {line}"));
        let cells: Vec<&str> = row.split(" | ").collect();
        assert!(
            cells.len() >= 4,
            "a row needs key, type, default, meaning: {line}"
        );
        let key = cells[0]
            .strip_suffix('`')
            .unwrap_or_else(|| panic!("the key cell is one `key`: {line}"));
        let default = (!array).then(|| cells[2].trim().to_owned());
        assert!(
            keys.insert(format!("{name}.{key}"), default).is_none(),
            "{name}.{key} is listed twice"
        );
    }
    keys
}

#[test]
fn configuration_doc_lists_every_key_with_its_default() {
    let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let doc = std::fs::read_to_string(doc_path).expect("docs/configuration.md");
    let documented = documented_keys(&doc);

    // The defaults, and a user so that [[users]] is printed too, and
    // every optional key set.
    let mut printed = printed_keys(&print_config(&[]));
    let unset_printed: Vec<_> = printed
        .keys()
        .filter(|k| is_optional(&documented, k))
        .collect();
    assert!(
        unset_printed.is_empty(),
        "optional keys printed with the defaults: {unset_printed:?}"
    );
    let dir = TempDir::new("config-doc");
    let file = dir.join("users.toml");
    std::fs::write(
        &file,
        "[[users]]\nname = \"alice\"\npassword_hash = \
         \"$argon2id$v=19$m=64,t=1,p=1$MDEyMzQ1Njc4OWFiY2RlZg$VqTeVXbWRg6XKh3mS9Zb5B5y4gFHmT1nbC3WlbnJEhc\"\n\
         [metrics]\nlisten = \"127.0.0.1:9464\"\n\
         [cluster]\nurl = \"nats://127.0.0.1:4222\"\nnode_id = \"n1\"\nnode_index = 3\n\
         endpoint_url = \"opc.tcp://front:4840\"\n\
         [https]\nlisten = \"127.0.0.1:4843\"\ncertificate = \"tls.pem\"\nprivate_key = \"tls.key\"\n",
    )
    .unwrap();
    let with_user = printed_keys(&print_config(&["--config", file.to_str().unwrap()]));
    drop(dir);
    printed.extend(
        with_user
            .into_iter()
            .filter(|(k, _)| k.starts_with("users.") || is_optional(&documented, k)),
    );
    assert!(printed.contains_key("users.password_hash"), "{printed:?}");
    assert!(printed.contains_key("metrics.listen"), "{printed:?}");
    assert!(printed.contains_key("cluster.url"), "{printed:?}");

    let missing: Vec<_> = printed
        .keys()
        .filter(|k| !documented.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "keys --print-config prints that docs/configuration.md does not list: {missing:?}"
    );
    let stale: Vec<_> = documented
        .keys()
        .filter(|k| !printed.contains_key(*k))
        .collect();
    assert!(
        stale.is_empty(),
        "keys docs/configuration.md lists that no longer exist: {stale:?}"
    );
    // Derived defaults: printed resolved (for this machine's CPUs), but
    // absent from the defaults before resolving.
    let plain = printed_keys(&toml::to_string(&ServerConfig::default()).unwrap());
    let resolved = printed_keys(
        &toml::to_string(&ServerConfig::default().resolved(host::usable_cpus())).unwrap(),
    );
    let derived: Vec<&String> = resolved
        .keys()
        .filter(|k| !plain.contains_key(*k))
        .collect();
    assert!(
        derived.contains(&&"admission.max_channel_count".to_owned()),
        "{derived:?}"
    );
    for (key, value) in &printed {
        if is_optional(&documented, key) {
            continue;
        }
        let Some(value) = value else { continue };
        if derived.contains(&key) {
            // --print-config prints the resolved value.
            assert_eq!(resolved.get(key), Some(&Some(value.clone())), "{key}");
            let cell = documented[key].as_deref().unwrap_or("");
            assert!(
                cell.starts_with("derived"),
                "the default of {key} in docs/configuration.md is derived, not {cell:?}"
            );
        } else {
            assert_eq!(
                documented[key].as_ref(),
                Some(value),
                "the default of {key} in docs/configuration.md"
            );
        }
    }
}

/// The parser finds what it should, so the test above cannot pass by
/// finding nothing.
#[test]
fn doc_rows_are_recognised() {
    let keys = documented_keys(
        "## [a]\n\n| Key | Type | Default | Meaning |\n|---|---|---|---|\n\
         | `x` | integer | `1` | what |\n\n## [[b]]\n\n| `y` | string | (required) | who |\n",
    );
    assert_eq!(
        keys,
        Keys::from([
            ("a.x".to_owned(), Some("`1`".to_owned())),
            ("b.y".to_owned(), None),
        ])
    );
}
