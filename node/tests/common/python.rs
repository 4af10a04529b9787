//! Tests that run a Python tool (the stock gRPC clients, schemathesis,
//! Selenium): which interpreter to use, and a loud, explicit skip when the
//! tool is missing, unless CI's `TALLY_REQUIRE_*` switch says it must run.
//!
//! The interpreter is named by an environment variable when set (`.ci/run`
//! sets `TALLY_HTTP_PYTHON` to the virtualenv it installs schemathesis and
//! Selenium into), else `python3`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The Python interpreter named by `$env_var`, or `python3`.
pub fn python(env_var: &str) -> String {
    std::env::var(env_var).unwrap_or_else(|_| "python3".to_string())
}

/// Why `imports` (a Python statement) fails with `python`, or `None` when it works.
pub fn unavailable(python: &str, imports: &str, install_hint: &str) -> Option<String> {
    match Command::new(python).args(["-c", imports]).output() {
        Err(error) => Some(format!("{python} cannot be run: {error}")),
        Ok(out) if !out.status.success() => Some(format!(
            "{python} lacks the modules ({}); {install_hint}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("no error text")
        )),
        Ok(_) => None,
    }
}

/// True when the test may run; otherwise prints a SKIPPED banner, or panics
/// when the environment variable `require` is `1`.
pub fn can_run(test: &str, why_not: Option<String>, require: &str) -> bool {
    let Some(why) = why_not else {
        return true;
    };
    let message = format!("{test} cannot run: {why}");
    if std::env::var(require).as_deref() == Ok("1") {
        panic!("{message} (and {require}=1 requires it)");
    }
    // Straight to the process's stderr, not through `eprintln!`, which the
    // test harness captures and hides for a test that passes.
    let bar = "!".repeat(72);
    let _ = writeln!(std::io::stderr(), "\n{bar}\nSKIPPED: {message}\n{bar}\n");
    false
}

/// Why headless Chromium and Selenium cannot run here (`python` lacks
/// Selenium, or Debian's `chromium` or `chromium-driver` is missing), or `None`.
pub fn browser_missing(python: &str) -> Option<String> {
    for tool in ["chromium", "chromedriver"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|out| out.status.success());
        if !found {
            return Some(format!(
                "{tool} is not installed (Debian: apt-get install chromium chromium-driver)"
            ));
        }
    }
    unavailable(
        python,
        "import selenium",
        "install it with `python3 -m pip install selenium` (or set TALLY_HTTP_PYTHON)",
    )
}

/// Runs `node/tests/python/{script}` with `args`; fails with its output
/// when it fails.
pub fn run_script(python: &str, script: &str, args: &[String]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = Command::new(python)
        .arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{script} stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        out.status.success(),
        "{script} exited with {}:\n{stdout}\n{stderr}",
        out.status
    );
}
