//! Compiles `tally/v1/*.proto` with the pure-Rust `protox`, so no `protoc` is
//! needed, and keeps the encoded descriptor set for gRPC server reflection.

use prost::Message;

const PROTOS: [&str; 4] = [
    "tally/v1/counters.proto",
    "tally/v1/likes.proto",
    "tally/v1/replication.proto",
    "tally/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("tally_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
