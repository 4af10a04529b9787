//! Every shell example the documentation marks as runnable (README.md and
//! every page of docs/src; the markers are described in
//! `docs_examples/blocks.rs`) is run against a real dev cluster, the one the
//! quick start starts (`tally-node dev`), here on free loopback ports.
//!
//! The examples stay as a reader copies them: they name the dev cluster's
//! usual ports (7100 gRPC, 7102 HTTP, 7110, 7122, ...) and `tally` without a
//! path. The test does what the quick start does (the binaries it built put
//! first on `PATH`) and moves the ports: each `127.0.0.1:71NN` or
//! `localhost:71NN` of an example becomes the cluster's base port plus NN,
//! and `TALLY_ENDPOINT` (which `tally` reads when no `--endpoint` is given)
//! names the first node. `curl` fails on an HTTP error (`--fail-with-body`)
//! so an example that is refused fails here, and ends each answer with a
//! newline (the JSON API's answers have none), as pages show them one a
//! line. An example whose page shows its output (a ```` ```text ```` block
//! below it) must print that output. Unmarked shell blocks (hosts,
//! containers, synopses with placeholders, the cluster itself) are counted
//! and listed as skipped.

#[path = "docs_examples/blocks.rs"]
mod blocks;
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blocks::{output_matches, shell_blocks, Block, Run};

/// The longest one example may run before it is stopped and fails.
const EXAMPLE_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn every_marked_shell_example_of_the_docs_runs_against_a_dev_cluster() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = tempfile::tempdir().unwrap();
    let base = common::free_port_block(30);
    let cluster = DevCluster::start(scratch.path(), base);
    let shell = Shell::new(scratch.path(), base);

    let (mut ran, mut skipped, mut checked) = (Vec::new(), Vec::new(), 0);
    for page in blocks::pages(&root) {
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&page).unwrap();
        let blocks = shell_blocks(&name, &text).unwrap_or_else(|problem| panic!("{problem}"));
        let mut background = Vec::new();
        for block in blocks {
            let script = with_ports(&block.script, base);
            match block.run {
                Run::Skipped => skipped.push(block.place),
                Run::ToTheEnd => {
                    shell.run_to_the_end(&block, &script, &cluster);
                    checked += usize::from(block.output.is_some());
                    ran.push(block.place);
                }
                Run::Background => {
                    background.push(shell.start_in_background(&block.place, &script));
                    ran.push(block.place);
                }
            }
        }
        drop(background);
    }
    println!(
        "ran {} shell example(s), {checked} of them with the output their page shows:",
        ran.len()
    );
    for place in &ran {
        println!("  ran      {place}");
    }
    println!(
        "skipped {} shell example(s) as not runnable here (no doc-test marker):",
        skipped.len()
    );
    for place in &skipped {
        println!("  skipped  {place}");
    }
    // The quick start, the getting-started page, the CLI page and the HTTP
    // page each have runnable examples: a run that found none tested nothing.
    for page in [
        "README.md",
        "docs/src/getting-started.md",
        "docs/src/cli.md",
        "docs/src/api/http.md",
    ] {
        assert!(
            ran.iter()
                .any(|place| place.starts_with(&format!("{page}:"))),
            "no example of {page} ran: mark its runnable examples with <!-- doc-test -->"
        );
    }
    assert!(
        checked >= 3,
        "only {checked} example(s) show their output: the README's should"
    );
}

/// `tally-node dev` as the quick start runs it, on `base` and the ports above.
struct DevCluster {
    child: Child,
    log: PathBuf,
}

impl DevCluster {
    fn start(scratch: &Path, base: u16) -> DevCluster {
        let log = scratch.join("dev.log");
        let mut child = Command::new(common::node_binary())
            .args(["dev", "--base-port", &base.to_string()])
            .arg("--dir")
            .arg(scratch.join("tally-dev"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting tally-node dev");
        let stdout = child.stdout.take().unwrap();
        let banner: Vec<String> = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .take_while(|line| !line.starts_with("Ctrl-C"))
            .collect();
        let cluster = DevCluster { child, log };
        assert!(
            banner.iter().any(|line| line.contains("eu-west-1")),
            "tally-node dev printed no banner: {banner:?}\n{}",
            cluster.log_text()
        );
        // Like sets take writes once the dev cluster has moved to the newest
        // cluster version, which it does by itself shortly after start.
        for http_port in [base + 2, base + 12, base + 22] {
            let api = common::http::Api::new(format!("127.0.0.1:{http_port}").parse().unwrap());
            common::wait_until(
                Duration::from_secs(60),
                "the dev cluster takes likes",
                || {
                    let reply =
                        api.call("PUT", "/v1/likes/doc-test-ready/members/probe", &[], None);
                    (reply.status == 200).then_some(())
                },
            );
        }
        cluster
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The example with the dev cluster's usual ports (7100 to 7149) moved to
/// `base` and up.
fn with_ports(script: &str, base: u16) -> String {
    let mut script = script.to_owned();
    for offset in (0..50u16).rev() {
        for host in ["127.0.0.1", "localhost"] {
            script = script.replace(
                &format!("{host}:{}", 7100 + offset),
                &format!("{host}:{}", base + offset),
            );
        }
    }
    script
}

/// Where and how the examples run: in a scratch directory, with `PATH`
/// and `TALLY_ENDPOINT` set as the quick start leaves a reader's shell.
struct Shell {
    work: PathBuf,
    path: String,
    endpoint: String,
}

impl Shell {
    /// `PATH` for the examples: a `curl` that fails on an HTTP error, then
    /// the directory of the binaries under test (what the quick start puts
    /// first on `PATH`), then the test's own.
    fn new(scratch: &Path, base: u16) -> Shell {
        let shims = scratch.join("shims");
        std::fs::create_dir_all(&shims).unwrap();
        let real_curl = ["/usr/bin/curl", "/bin/curl", "/usr/local/bin/curl"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .expect("the HTTP examples need curl");
        let shim = shims.join("curl");
        std::fs::write(
            &shim,
            format!(
                "#!/bin/sh\nexec {real_curl} --silent --show-error --fail-with-body --write-out '\\n' \"$@\"\n"
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let binaries = common::cli_binary().parent().unwrap().to_path_buf();
        let path = format!(
            "{}:{}:{}",
            shims.display(),
            binaries.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let work = scratch.join("work");
        std::fs::create_dir_all(&work).unwrap();
        Shell {
            work,
            path,
            endpoint: format!("http://127.0.0.1:{base}"),
        }
    }

    fn command(&self, script: &str) -> Command {
        let mut command = Command::new("bash");
        command
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(&self.work)
            .env("PATH", &self.path)
            .env("TALLY_ENDPOINT", &self.endpoint)
            .stdin(Stdio::null());
        command
    }

    /// Runs `script` (`block`'s, its ports moved) to the end and fails the
    /// test unless it exits 0 and prints the output its page shows.
    fn run_to_the_end(&self, block: &Block, script: &str, cluster: &DevCluster) {
        let place = &block.place;
        let mut child = self
            .command(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting bash");
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > EXAMPLE_LIMIT {
                let _ = child.kill();
                panic!("the example at {place} still runs after {EXAMPLE_LIMIT:?}:\n{script}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("== {place}\n{script}\n-- stdout:\n{stdout}-- stderr:\n{stderr}");
        assert!(
            out.status.success(),
            "the example at {place} failed ({}):\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}\ndev cluster log:\n{}",
            out.status,
            cluster.log_text()
        );
        if let Some(shown) = &block.output {
            assert!(
                output_matches(shown, &stdout),
                "the example at {place} does not print the output its page shows below it \
                 (`...` stands for any text in a line, a line of `...` for any lines):\n\
                 {script}\nshown:\n{shown}\nprinted:\n{stdout}"
            );
        }
    }

    /// Starts `script` in its own process group and waits for its first line.
    fn start_in_background(&self, place: &str, script: &str) -> Background {
        use std::os::unix::process::CommandExt;
        let mut child = self
            .command(script)
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting bash");
        let stdout = child.stdout.take().unwrap();
        let (line_tx, line_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut first = String::new();
            let _ = BufReader::new(stdout).read_line(&mut first);
            let _ = line_tx.send(first);
        });
        match line_rx.recv_timeout(EXAMPLE_LIMIT) {
            Ok(line) if !line.is_empty() => {
                println!("== {place} (background)\n{script}\n-- first line: {line}")
            }
            _ => {
                drop(Background(child));
                panic!("the background example at {place} printed nothing:\n{script}");
            }
        }
        Background(child)
    }
}

/// A background example: stopped, with everything it started, when
/// dropped (at the end of its page, or when the test fails).
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}
