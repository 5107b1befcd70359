//! Builds the `gpu-kernels` crate to PTX, one file per GPU architecture, and assembles
//! each with `ptxas` to check it, to read its resource usage and to get a cubin.
//!
//! One code path for `cargo xtask build-ptx` and for `host`'s build script, so the PTX
//! that is embedded is the PTX that was checked. ptxas takes minutes on the `wgmma`
//! kernels, so each architecture keeps its last assembly (PTX, cubin, report) beside
//! its nested build: the same PTX again, from either caller, reuses it.

use std::collections::BTreeMap;
use std::env;
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_kernels::launch::EntryPoint;

/// Architectures built when none are named: cubins for Ampere and Hopper (the
/// architecture-specific `sm_90a`, whose `wgmma` only Hopper runs), and `sm_90`, whose
/// PTX newer devices compile.
pub const DEFAULT_ARCHES: &[&str] = &["sm_80", "sm_90", gpu_kernels::launch::WARPGROUP_MMA_ARCH];

const TARGET: &str = "nvptx64-nvidia-cuda";
const PROFILE: &str = "ptx";
const SETUP_HINT: &str = "run ./setup.sh (as root) from the repository root";

/// What to build and where.
pub struct PtxBuild {
    /// The workspace root (holds `gpu-kernels/` and `.tools/`).
    pub workspace: PathBuf,
    /// Architectures such as `sm_90`.
    pub arches: Vec<String>,
    /// Where `gpu_kernels.<arch>.ptx` and `.cubin` are written.
    pub out_dir: PathBuf,
    /// The nested cargo's own target directory (sharing the caller's would deadlock on
    /// its lock).
    pub target_dir: PathBuf,
}

/// ptxas's report for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub registers: u32,
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

/// The PTX and cubin for one architecture.
#[derive(Debug, Clone)]
pub struct Artifact {
    pub arch: String,
    pub ptx: PathBuf,
    pub cubin: PathBuf,
    /// Per kernel entry point, by name.
    pub kernels: BTreeMap<String, KernelResources>,
}

/// Why a build failed; each message says what to do.
#[derive(Debug)]
pub enum BuildError {
    MissingTool { tool: PathBuf },
    BadArch(String),
    Command { what: String, output: String },
    MissingKernel { arch: String, kernel: String },
    UnlistedKernel { arch: String, kernel: String },
    Io { path: PathBuf, error: std::io::Error },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingTool { tool } => {
                write!(f, "{} not found: {SETUP_HINT}", tool.display())
            }
            Self::BadArch(a) => write!(f, "architecture `{a}` is not of the form sm_XY (e.g. sm_90)"),
            Self::Command { what, output } => write!(f, "{what} failed:\n{output}"),
            Self::MissingKernel { arch, kernel } => {
                write!(f, "the {arch} PTX has no entry point `{kernel}`")
            }
            Self::UnlistedKernel { arch, kernel } => write!(
                f,
                "the {arch} PTX has an entry point `{kernel}` that gpu_kernels::entry_points() does not list for it"
            ),
            Self::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for BuildError {}

/// The project tools folder: `$GPU_KERNELS_TOOLS` (set by `.cargo/config.toml`), else
/// `<workspace>/.tools`.
pub fn tools_dir(workspace: &Path) -> PathBuf {
    env::var_os("GPU_KERNELS_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join(".tools"))
}

/// Builds and checks every architecture.
pub fn build(cfg: &PtxBuild) -> Result<Vec<Artifact>, BuildError> {
    let tools = tools_dir(&cfg.workspace).join("bin");
    for tool in ["llvm-bitcode-linker", "ptxas", "llvm-link", "opt", "llc"] {
        let path = tools.join(tool);
        if !path.exists() {
            return Err(BuildError::MissingTool { tool: path });
        }
    }
    fs::create_dir_all(&cfg.out_dir).map_err(|error| io(&cfg.out_dir, error))?;
    cfg.arches
        .iter()
        .map(|arch| build_arch(cfg, &tools, arch))
        .collect()
}

/// The number of `sm_XY[a]`: `XY`.
fn arch_number(arch: &str) -> u32 {
    let digits: String = arch
        .strip_prefix("sm_")
        .unwrap_or_default()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

fn build_arch(cfg: &PtxBuild, tools: &Path, arch: &str) -> Result<Artifact, BuildError> {
    let valid = arch
        .strip_prefix("sm_")
        .is_some_and(|n| n.len() >= 2 && n.chars().all(|c| c.is_ascii_alphanumeric()));
    if !valid {
        return Err(BuildError::BadArch(arch.to_string()));
    }
    let target_dir = cfg.target_dir.join(arch);
    let mut cargo = nvptx_cargo(&cfg.workspace, tools, arch);
    cargo
        .args([
            "rustc",
            "--quiet",
            "--package",
            "gpu-kernels",
            "--profile",
            PROFILE,
        ])
        .args([
            "--target",
            TARGET,
            "--crate-type",
            "cdylib",
            "-Zbuild-std=core,panic_abort",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    run(&mut cargo, &format!("cargo build of gpu-kernels for {arch}"))?;

    let built = target_dir.join(TARGET).join(PROFILE).join("gpu_kernels.ptx");
    let ptx = cfg.out_dir.join(format!("gpu_kernels.{arch}.ptx"));
    let cubin = cfg.out_dir.join(format!("gpu_kernels.{arch}.cubin"));
    let text = fs::read_to_string(&built).map_err(|error| io(&built, error))?;
    let built = || gpu_kernels::entry_points().filter(|entry| entry.built_for(arch));
    let text = add_launch_bounds(&text, built()).map_err(|kernel| BuildError::MissingKernel {
        arch: arch.into(),
        kernel: kernel.to_string(),
    })?;
    fs::write(&ptx, text).map_err(|error| io(&ptx, error))?;

    let report = assemble(tools, arch, &ptx, &cubin, &target_dir.join("ptxas-last"))?;
    let kernels = parse_ptxas_report(&report);
    let listed: Vec<&str> = built().map(|e| e.name).collect();
    if let Some(kernel) = listed.iter().find(|k| !kernels.contains_key(**k)) {
        return Err(BuildError::MissingKernel {
            arch: arch.into(),
            kernel: kernel.to_string(),
        });
    }
    if let Some(kernel) = kernels.keys().find(|k| !listed.contains(&k.as_str())) {
        return Err(BuildError::UnlistedKernel {
            arch: arch.into(),
            kernel: kernel.clone(),
        });
    }
    Ok(Artifact {
        arch: arch.into(),
        ptx,
        cubin,
        kernels,
    })
}

/// `ptxas -v` of `ptx` into `cubin`, its report back; reused from `last` (a folder
/// holding the previous assembly for this architecture) where that was of the same
/// PTX, and saved there otherwise. The PTX is written last, so that a folder whose
/// PTX matches holds that PTX's cubin and report.
fn assemble(tools: &Path, arch: &str, ptx: &Path, cubin: &Path, last: &Path) -> Result<String, BuildError> {
    let text = fs::read(ptx).map_err(|error| io(ptx, error))?;
    let [last_ptx, last_cubin, last_report] = ["ptx", "cubin", "report"].map(|name| last.join(name));
    if fs::read(&last_ptx).is_ok_and(|last| last == text)
        && let Ok(report) = fs::read_to_string(&last_report)
        && fs::copy(&last_cubin, cubin).is_ok()
    {
        return Ok(report);
    }
    let mut ptxas = Command::new(tools.join("ptxas"));
    ptxas
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(ptx)
        .arg("-o")
        .arg(cubin);
    let report = run(&mut ptxas, &format!("ptxas on {}", ptx.display()))?;
    // A cache only: failing to save it costs the next build an assembly. The old PTX
    // goes first, so that no step between leaves it beside another cubin.
    let save = || -> std::io::Result<()> {
        fs::create_dir_all(last)?;
        if last_ptx.exists() {
            fs::remove_file(&last_ptx)?;
        }
        fs::copy(cubin, &last_cubin)?;
        fs::write(&last_report, &report)?;
        fs::write(&last_ptx, &text)
    };
    let _ = save();
    Ok(report)
}

/// Runs clippy on `gpu-kernels` for the nvptx64 target (the code that only the GPU
/// build compiles), with warnings denied; its report is the error.
pub fn clippy(workspace: &Path, target_dir: &Path) -> Result<(), BuildError> {
    let tools = tools_dir(workspace).join("bin");
    let arch = DEFAULT_ARCHES.last().expect("an architecture");
    let mut cargo = nvptx_cargo(workspace, &tools, arch);
    cargo
        .args(["clippy", "--quiet", "--package", "gpu-kernels"])
        .args(["--target", TARGET, "-Zbuild-std=core,panic_abort"])
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--", "-D", "warnings"]);
    run(&mut cargo, &format!("clippy on gpu-kernels for {arch}")).map(drop)
}

/// A cargo command for the nvptx64 build of `arch`: the host build's settings removed,
/// the target's flags set, and the project tools first on `PATH`.
fn nvptx_cargo(workspace: &Path, tools: &Path, arch: &str) -> Command {
    let mut cargo = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.current_dir(workspace);
    // Outer cargo runs (build scripts, clippy) leak settings meant for host code.
    for var in [
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cargo.env_remove(var);
    }
    let linker = tools.join("llvm-bitcode-linker");
    // Loops over register arrays must unroll fully, or the arrays go to local memory.
    let mut rustflags = vec![
        format!("-Ctarget-cpu={arch}"),
        format!("-Clinker={}", linker.display()),
        "-Cllvm-args=-unroll-threshold=2000".to_string(),
    ];
    // Bulk copies and the mbarrier transaction counts of sm_90 need PTX ISA 8.0; the
    // tensor-map proxy fence of the sm_90a kernels, 8.3.
    if arch == gpu_kernels::launch::WARPGROUP_MMA_ARCH {
        rustflags.push("-Ctarget-feature=+ptx83".to_string());
    } else if arch_number(arch) >= 90 {
        rustflags.push("-Ctarget-feature=+ptx80".to_string());
    }
    cargo
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\x1f"))
        .env("RUSTC_BOOTSTRAP", "1")
        .env("PATH", prepend_path(tools));
    cargo
}

/// Inserts `.maxntid` and `.minnctapersm` after the parameter list of each entry point
/// that has launch bounds (rustc has no attribute for them); the name of a missing one
/// is the error.
pub fn add_launch_bounds(
    ptx: &str,
    entry_points: impl Iterator<Item = EntryPoint>,
) -> Result<String, &'static str> {
    let mut text = ptx.to_string();
    for entry in entry_points {
        let Some(bounds) = entry.bounds else {
            continue;
        };
        let start = text.find(&format!(".entry {}(", entry.name)).ok_or(entry.name)?;
        let body = start + text[start..].find("\n{").ok_or(entry.name)?;
        let directives = format!(
            "\n.maxntid {}, 1, 1\n.minnctapersm {}",
            bounds.threads, bounds.blocks_per_sm
        );
        text.insert_str(body, &directives);
    }
    Ok(text)
}

fn prepend_path(dir: &Path) -> OsString {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    env::join_paths(paths).expect("tool paths hold no separator")
}

/// Runs a command; its stdout and stderr together on success, an error holding them
/// otherwise.
fn run(cmd: &mut Command, what: &str) -> Result<String, BuildError> {
    let out = cmd.output().map_err(|error| BuildError::Command {
        what: what.into(),
        output: format!("could not start {:?}: {error} ({SETUP_HINT})", cmd.get_program()),
    })?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(text)
    } else {
        Err(BuildError::Command {
            what: what.into(),
            output: text,
        })
    }
}

fn io(path: &Path, error: std::io::Error) -> BuildError {
    BuildError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Reads `ptxas -v` output: "Function properties for NAME", then the stack/spill line,
/// then "Used N registers, ... N bytes smem".
pub fn parse_ptxas_report(report: &str) -> BTreeMap<String, KernelResources> {
    let mut kernels = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in report.lines() {
        if let Some(name) = line.split("Compiling entry function '").nth(1) {
            let name = name.split('\'').next().unwrap_or_default().to_string();
            kernels.insert(name.clone(), KernelResources::default());
            current = Some(name);
            continue;
        }
        // Callees (panic paths) get their own properties block after an entry's.
        if let Some(name) = line.split("Function properties for ").nth(1) {
            current = kernels.contains_key(name.trim()).then(|| name.trim().to_string());
            continue;
        }
        let Some(entry) = current.as_ref().and_then(|n| kernels.get_mut(n)) else {
            continue;
        };
        if line.contains("bytes stack frame") {
            entry.stack_bytes = number_before(line, "bytes stack frame");
            entry.spill_store_bytes = number_before(line, "bytes spill stores");
            entry.spill_load_bytes = number_before(line, "bytes spill loads");
        } else if line.contains("Used") && line.contains("registers") {
            entry.registers = number_before(line, "registers");
            entry.shared_bytes = number_before(line, "bytes smem");
        }
    }
    kernels
}

/// The integer just before `label` in `line`, or 0.
fn number_before(line: &str, label: &str) -> u32 {
    line.split(label)
        .next()
        .filter(|head| head.len() < line.len())
        .and_then(|head| head.split([' ', ',']).rev().find(|w| !w.is_empty()))
        .and_then(|w| w.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_numbers_ignore_suffixes() {
        assert_eq!(arch_number("sm_90a"), 90);
        assert_eq!(arch_number("sm_80"), 80);
        assert_eq!(arch_number("sm_100"), 100);
    }

    #[test]
    fn launch_bounds_go_between_the_parameters_and_the_body() {
        let ptx = ".visible .entry k(\n\t.param .u64 k_param_0\n)   // @k\n{\n\tret;\n}\n";
        let bounded = EntryPoint {
            name: "k",
            bounds: Some(gpu_kernels::launch::LaunchBounds {
                threads: 256,
                blocks_per_sm: 2,
            }),
            requires: None,
        };
        let unbounded = EntryPoint {
            name: "other",
            bounds: None,
            requires: Some("sm_90a"),
        };
        assert!(unbounded.built_for("sm_90a") && !unbounded.built_for("sm_90"));
        assert!(bounded.built_for("sm_80") && bounded.built_for("sm_90a"));
        let out = add_launch_bounds(ptx, [bounded, unbounded].into_iter()).unwrap();
        assert_eq!(
            out,
            ".visible .entry k(\n\t.param .u64 k_param_0\n)   // @k\n.maxntid 256, 1, 1\n.minnctapersm 2\n{\n\tret;\n}\n"
        );
        let missing = EntryPoint {
            name: "other",
            ..bounded
        };
        assert_eq!(add_launch_bounds(ptx, [missing].into_iter()), Err("other"));
    }

    #[test]
    fn parses_ptxas_verbose_output() {
        let report = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'copy_words' for 'sm_90'
ptxas info    : Function properties for copy_words
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 26 registers, used 1 barriers, 4096 bytes smem, 372 bytes cmem[0]
ptxas info    : Function properties for _RNvNtCs4HRfK4WwqXL_4core9panicking9panic_fmt
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'other' for 'sm_90'
ptxas info    : Function properties for other
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
";
        let k = parse_ptxas_report(report);
        assert_eq!(
            k["copy_words"],
            KernelResources {
                registers: 26,
                shared_bytes: 4096,
                stack_bytes: 8,
                spill_store_bytes: 4,
                spill_load_bytes: 12
            }
        );
        assert_eq!(k["other"].registers, 8);
        assert_eq!(k["other"].shared_bytes, 0);
        assert_eq!(k.len(), 2);
    }
}
