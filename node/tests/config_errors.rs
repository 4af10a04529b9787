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

#[test]
fn the_cluster_id_cache_disk_floor_and_peer_ip_name_their_source_too() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let data = data.to_str().unwrap();
    let file = root.path().join("tally.toml");
    let config = file.to_str().unwrap();
    let cases: [(&str, &str, &str); 4] = [
        ("cluster_id = \"\"\n", "cluster_id in", "--cluster-id"),
        (
            "store_cache_bytes = 4096\n",
            "store_cache_bytes in",
            "--store-cache-bytes",
        ),
        (
            "min_free_disk = \"plenty\"\n",
            "min_free_disk in",
            "--min-free-disk",
        ),
        (
            "peer_source_ip = \"10.0.1.5:7100\"\n",
            "peer_source_ip in",
            "--peer-source-ip",
        ),
    ];
    for (toml, source, flag) in cases {
        std::fs::write(&file, toml).unwrap();
        let output = run(&["--data-dir", data, "--config", config], &[]);
        refused_naming(&output, &format!("{source} {}", file.display()), &[flag]);
    }

    let output = run(
        &["--data-dir", data],
        &[("TALLY_STORE_CACHE_BYTES", "4096")],
    );
    refused_naming(
        &output,
        "TALLY_STORE_CACHE_BYTES 4096",
        &["--store-cache-bytes"],
    );
    let output = run(&["--data-dir", data], &[("TALLY_MIN_FREE_DISK", "plenty")]);
    refused_naming(&output, "TALLY_MIN_FREE_DISK", &["--min-free-disk"]);
    let output = run(&["--data-dir", data, "--peer-source-ip", "nowhere"], &[]);
    refused_naming(
        &output,
        "--peer-source-ip \"nowhere\"",
        &["TALLY_PEER_SOURCE_IP"],
    );
}
