//! Build tasks for the uascale workspace.
//!
//! `cargo xtask codegen [--check] [--schema DIR]` regenerates
//! `crates/types/src/generated/` and `crates/server/src/generated/ns0.bin`
//! from the OPC Foundation schema files in `schema/opcua/` of the workspace
//! (or `$UASCALE_SCHEMA_DIR`, or `--schema DIR`, which wins). With
//! `--check` it writes nothing and fails when a committed file differs from
//! what the schema gives.
//!
//! `cargo xtask modules [SRC_DIR...]` lists the `use` cycles between the
//! modules of each crate and fails when there is one (see `modules.rs`).
//!
//! `cargo xtask shell` fails when the server crate uses tokio outside its
//! shell (see `shell.rs`).
//!
//! `cargo xtask refs` fails when docs, help texts or comments cite issue
//! numbers or files outside the repository (see `refs.rs`).
//!
//! `cargo xtask ci` runs everything CI checks (see `ci.rs`); `cargo xtask
//! tests` only its tests step, the test binaries a few at a time (see
//! `suite.rs`).

mod bsd;
mod ci;
mod codegen;
mod csv;
mod modules;
mod nodeset;
mod refs;
mod shell;
mod suite;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: cargo xtask codegen [--check] [--schema DIR]\n       cargo xtask modules [SRC_DIR...]\n       cargo xtask shell\n       cargo xtask refs\n       cargo xtask ci\n       cargo xtask tests"
    );
    ExitCode::from(2)
}

fn workspace_root() -> PathBuf {
    // xtask/ sits directly under the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The schema folder: `$UASCALE_SCHEMA_DIR`, else `<workspace>/schema/opcua`
/// (committed, so a plain clone can run codegen and its check).
fn schema_dir(root: &Path) -> PathBuf {
    std::env::var_os("UASCALE_SCHEMA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("schema/opcua"))
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let root = workspace_root();
    match args.next().as_deref() {
        Some("codegen") => {}
        Some("shell") => {
            return match shell::check(&root) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("xtask shell: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some("modules") => {
            let dirs: Vec<PathBuf> = args.map(PathBuf::from).collect();
            return match modules::check(&root, &dirs) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("xtask modules: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some("refs") => {
            return match refs::check(&root) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("xtask refs: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(step @ ("ci" | "tests")) => {
            let run = if step == "ci" { ci::ci } else { ci::tests };
            return match run(&root) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("xtask {step}: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => return usage(),
    }
    let mut check = false;
    let mut schema = schema_dir(&root);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--check" => check = true,
            "--schema" => match args.next() {
                Some(d) => schema = PathBuf::from(d),
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    match codegen::run(&schema, &root, check) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask codegen: {e}");
            ExitCode::FAILURE
        }
    }
}
