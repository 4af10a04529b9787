//! Start-up errors of the configuration name where the bad value came from:
//! the flag, the environment variable or the config file (issue 10, item
//! 17), and `--help` shows the data directory's default. Real processes.

mod common;

use std::process::{Command, Output, Stdio};

use common::node_binary;

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(node_binary());
    command.args(args).stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("running tally-node")
}

#[track_caller]
fn refused_naming(output: &Output, source: &str, not: &[&str]) {
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the node started:\n{text}");
    assert!(text.contains(source), "{source} is not named:\n{text}");
    for other in not {
        assert!(!text.contains(other), "{other} is named:\n{text}");
    }
}

#[test]
fn a_bad_value_is_named_by_where_it_came_from() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let data = data.to_str().unwrap();

    let output = run(&["--data-dir", data, "--grpc-addr", "nowhere"], &[]);
    refused_naming(&output, "--grpc-addr \"nowhere\"", &["TALLY_GRPC_ADDR"]);

    let output = run(&["--data-dir", data], &[("TALLY_GRPC_ADDR", "nowhere")]);
    refused_naming(&output, "TALLY_GRPC_ADDR \"nowhere\"", &["--grpc-addr"]);

    let file = root.path().join("tally.toml");
    std::fs::write(&file, "grpc_addr = \"nowhere\"\nsync_interval = \"soon\"\n").unwrap();
    let output = run(
        &["--data-dir", data, "--config", file.to_str().unwrap()],
        &[],
    );
    refused_naming(
        &output,
        &format!("grpc_addr in {}", file.display()),
        &["--grpc-addr", "TALLY_GRPC_ADDR"],
    );

    std::fs::write(&file, "sync_interval = \"soon\"\n").unwrap();
    let output = run(
        &["--data-dir", data, "--config", file.to_str().unwrap()],
        &[],
    );
    refused_naming(&output, "sync_interval in", &["--sync-interval"]);

    std::fs::write(&file, "region = \"a b\"\n").unwrap();
    let output = run(
        &["--data-dir", data, "--config", file.to_str().unwrap()],
        &[],
    );
    refused_naming(&output, "region in", &["--region"]);
}

#[test]
fn help_shows_the_data_dir_default() {
    let output = run(&["--help"], &[]);
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .skip_while(|line| !line.contains("--data-dir"))
        .take(3)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(line.contains("[default: tally-data]"), "{line}");
}
