//! Runs the Python client library's tests (`python/tests`: the codec, the
//! client against a fake daemon, and two real daemons of this build on
//! loopback) so that `cargo test --workspace` covers them. Python 3.11 or
//! later must be installed as `python3`; without it this test fails, saying
//! so, rather than skipping.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The repository's root (this crate is `crates/shoal`).
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// Runs `python3` with `args` at the repository's root, failing clearly if
/// there is no `python3`.
fn python3(args: &[&str]) -> Output {
    Command::new("python3")
        .args(args)
        .current_dir(repo_root())
        .env("SHOAL_EXE", env!("CARGO_BIN_EXE_shoal"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run python3 ({e}): the Python client's tests (python/tests) need \
                 Python 3.11 or later on PATH as `python3`; install it"
            )
        })
}

#[test]
fn python_client_tests_pass_against_real_daemons() {
    let version = python3(&[
        "-c",
        "import sys; print(sys.version.split()[0]); sys.exit(sys.version_info < (3, 11))",
    ]);
    assert!(
        version.status.success(),
        "the Python client needs Python 3.11 or later; python3 is {}",
        String::from_utf8_lossy(&version.stdout).trim()
    );

    let run = python3(&["-m", "unittest", "discover", "-s", "python/tests", "-v"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "the Python client's tests failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
    // unittest reports to stderr. Nothing may have been skipped (the daemon
    // tests skip without SHOAL_EXE), and the daemon tests did run.
    assert!(
        !stderr.contains("skipped"),
        "some Python tests were skipped:\n{stderr}"
    );
    assert!(
        stderr.contains("test_daemon.TwoDaemons") && stderr.contains("\nOK"),
        "the daemon tests did not run:\n{stderr}"
    );
    println!("{stderr}");
}
