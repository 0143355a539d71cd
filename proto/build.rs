//! Compiles tier.proto with protox (pure Rust), so no system protoc is needed.
//! The encoded descriptor set (with comments) is kept for server reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=tier.proto");
    let mut compiler = protox::Compiler::new(["."])?;
    compiler
        .include_source_info(true)
        .open_files(["tier.proto"])?;
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").ok_or("cargo sets OUT_DIR")?);
    std::fs::write(
        out.join("tier_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
