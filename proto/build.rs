//! Compiles `tally/v1/*.proto` with the pure-Rust `protox`, so no `protoc` is needed.

const PROTOS: [&str; 3] = [
    "tally/v1/counters.proto",
    "tally/v1/replication.proto",
    "tally/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(PROTOS, ["."])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
