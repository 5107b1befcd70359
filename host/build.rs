//! Builds the kernels to PTX (and cubins) through ptx-builder, the same path as
//! `cargo xtask build-ptx`, and generates the table of images that `Gpu` embeds,
//! each LZ4-compressed.

use std::env;
use std::fmt::Write;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest
        .parent()
        .expect("host sits in the workspace")
        .to_path_buf();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("gpu-kernels").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        ptx_builder::tools_dir(&workspace).join("bin").display()
    );
    println!("cargo:rerun-if-env-changed=GPU_KERNELS_TOOLS");

    let build = ptx_builder::PtxBuild {
        workspace: workspace.clone(),
        arches: ptx_builder::DEFAULT_ARCHES
            .iter()
            .map(|a| a.to_string())
            .collect(),
        out_dir: out_dir.join("ptx"),
        target_dir: workspace.join("target/ptx-build"),
    };
    let artifacts = match ptx_builder::build(&build) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: building the GPU kernels failed: {e}");
            std::process::exit(1);
        }
    };

    // Every cubin, and the PTX of the newest portable architecture only (not an `a`
    // target, whose PTX no other architecture compiles): a device of an embedded major
    // architecture runs its cubin, and only newer devices compile PTX.
    let newest = artifacts
        .iter()
        .map(|a| a.arch.clone())
        .filter(|arch| arch.ends_with(|c: char| c.is_ascii_digit()))
        .max_by_key(|arch| arch_number(arch));
    let mut table = String::from("&[\n");
    for a in &artifacts {
        let mut images = vec![("Cubin", &a.cubin)];
        if Some(&a.arch) == newest.as_ref() {
            images.push(("Ptx", &a.ptx));
        }
        for (format, path) in images {
            let compressed = compress(path, &out_dir);
            writeln!(
                table,
                "    KernelImage {{ arch: {:?}, format: ImageFormat::{format}, lz4: include_bytes!({:?}) }},",
                a.arch,
                compressed.display().to_string()
            )
            .expect("writing to a String");
        }
    }
    table.push(']');
    std::fs::write(out_dir.join("kernel_images.rs"), table).expect("OUT_DIR is writable");
}

/// Writes `path` LZ4-compressed (its size prepended) beside the table, and returns where.
fn compress(path: &Path, out_dir: &Path) -> PathBuf {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut name = path.file_name().expect("an image is a file").to_owned();
    name.push(".lz4");
    let compressed = out_dir.join(name);
    std::fs::write(&compressed, lz4_flex::compress_prepend_size(&bytes)).expect("OUT_DIR is writable");
    compressed
}

/// The number of `sm_XY`, for ordering architectures.
fn arch_number(arch: &str) -> u32 {
    arch.trim_start_matches("sm_")
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or(0)
}
