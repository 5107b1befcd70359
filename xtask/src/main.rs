//! Project tasks. `cargo xtask` with no task prints the list.

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

const HELP: &str = "\
cargo xtask <task>

tasks:
  build-ptx [--arch sm_80,sm_90] [--out DIR]
      build gpu-kernels to PTX per architecture (default target/ptx/), check each
      with ptxas and print registers, shared memory, stack and spills per kernel
  clippy-ptx
      clippy on gpu-kernels for the nvptx64 target, warnings denied
  bundle
      gather the release GPU test binaries, the bench binary, the PTX and cubins and
      the run scripts into target/bundle/, for a GPU machine without Rust
  sanitize
      bundle, then run every GPU test under compute-sanitizer (needs a GPU here)
  bench
      bundle, then run PyTorch's baseline and the benchmark (needs a GPU here)
  wheel
      build the Python package (PyTorch operators, kernels embedded) into
      target/wheels/ with maturin (setup.sh installs it in .tools/python)
  test-python
      wheel, then install it with PyTorch in a fresh virtual environment
      (target/python-venv, offline from setup.sh's .tools/wheels) and run pytest;
      the GPU tests say SKIPPED without a GPU
";

/// The bundle must fit what travels to a GPU machine.
const BUNDLE_LIMIT_BYTES: u64 = 64 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("build-ptx") => build_ptx(&args[1..]).map(drop),
        Some("clippy-ptx") => clippy_ptx(),
        Some("bundle") => bundle().map(drop),
        Some("sanitize") => bundle().and_then(|dir| run_script(&dir.join("sanitize.sh"), &[])),
        Some("bench") => bundle().and_then(|dir| run_script(&dir.join("run.sh"), &["bench"])),
        Some("wheel") => wheel().map(drop),
        Some("test-python") => wheel().and_then(|wheel| test_python(&wheel)),
        _ => {
            print!("{HELP}");
            return;
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .into()
}

/// The value after `--name`, if given.
fn option<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn build_ptx(args: &[String]) -> Result<Vec<ptx_builder::Artifact>> {
    let root = workspace_root();
    let arches = option(args, "--arch")
        .map(|a| a.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| {
            ptx_builder::DEFAULT_ARCHES
                .iter()
                .map(|a| a.to_string())
                .collect()
        });
    let out_dir = option(args, "--out")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/ptx"));
    let artifacts = ptx_builder::build(&ptx_builder::PtxBuild {
        workspace: root.clone(),
        arches,
        out_dir,
        target_dir: root.join("target/ptx-build"),
    })?;
    for a in &artifacts {
        println!("{} -> {}", a.arch, a.ptx.display());
        println!(
            "  {:<28} {:>5} {:>10} {:>7} {:>13}",
            "kernel", "regs", "smem (B)", "stack", "spills st/ld"
        );
        for (name, k) in &a.kernels {
            println!(
                "  {:<28} {:>5} {:>10} {:>7} {:>6}/{:<6}",
                name, k.registers, k.shared_bytes, k.stack_bytes, k.spill_store_bytes, k.spill_load_bytes
            );
            if k.spill_store_bytes + k.spill_load_bytes > 0 {
                println!("  warning: {name} spills registers on {}", a.arch);
            }
        }
    }
    Ok(artifacts)
}

fn clippy_ptx() -> Result {
    let root = workspace_root();
    ptx_builder::clippy(&root, &root.join("target/ptx-clippy"))?;
    println!("clippy on gpu-kernels for nvptx64: no warnings");
    Ok(())
}

/// Builds the release test and bench executables and gathers them, the PTX and the
/// scripts into target/bundle/.
fn bundle() -> Result<PathBuf> {
    let root = workspace_root();
    let dir = root.join("target/bundle");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(dir.join("bin"))?;
    // The executables embed every image; the bundle keeps the newest cubin alone, for
    // cuobjdump, so that it fits what travels.
    let artifacts = build_ptx(&["--out".into(), dir.join("ptx").display().to_string()])?;
    let newest_cubin = artifacts
        .last()
        .map(|a| a.cubin.file_name().map(|n| n.to_owned()));
    for entry in fs::read_dir(dir.join("ptx"))? {
        let path = entry?.path();
        if newest_cubin != Some(path.file_name().map(|n| n.to_owned())) {
            fs::remove_file(&path)?;
        }
    }

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--package",
            "tests",
            "--package",
            "bench",
            "--tests",
            "--bins",
        ])
        .args(["--message-format", "json-render-diagnostics"])
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "release build failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str()) else {
            continue;
        };
        let package = msg["package_id"].as_str().unwrap_or_default();
        // The bench binary is also built as a test harness: skip that one.
        let harness = msg["profile"]["test"].as_bool().unwrap_or(false);
        let integration_test = msg["target"]["kind"].to_string().contains("test");
        let file = match (integration_test, harness) {
            (true, _) if package.contains("/tests#") => format!("test-{name}"),
            (false, false) if name == "bench" => "bench".into(),
            _ => continue,
        };
        fs::copy(exe, dir.join("bin").join(file))?;
    }
    let scripts = root.join("xtask/bundle");
    for script in ["run.sh", "sanitize.sh"] {
        fs::copy(scripts.join(script), dir.join(script))?;
    }
    for script in ["torch_baseline.py", "torch_distributed.py", "clocks.py"] {
        fs::copy(root.join("bench").join(script), dir.join(script))?;
    }
    bundle_python(&root, &dir.join("python"))?;

    let size = dir_size(&dir)?;
    println!(
        "bundle: {} ({:.1} MiB)",
        dir.display(),
        size as f64 / (1 << 20) as f64
    );
    for entry in fs::read_dir(dir.join("bin"))? {
        println!("  bin/{}", entry?.file_name().to_string_lossy());
    }
    if size > BUNDLE_LIMIT_BYTES {
        return Err(format!("the bundle is over {} MiB", BUNDLE_LIMIT_BYTES >> 20).into());
    }
    Ok(dir)
}

/// The wheel, the Python tests, examples and benchmark, and the seed models (from
/// ../shared, where it is beside the repository) into `dir`.
fn bundle_python(root: &Path, dir: &Path) -> Result {
    let wheel = wheel()?;
    fs::create_dir_all(dir)?;
    fs::copy(&wheel, dir.join(wheel.file_name().expect("a wheel file")))?;
    for folder in ["tests", "examples"] {
        fs::create_dir_all(dir.join(folder))?;
        for entry in fs::read_dir(root.join("python").join(folder))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "py") {
                fs::copy(&path, dir.join(folder).join(path.file_name().expect("a file")))?;
            }
        }
    }
    fs::copy(root.join("python/bench.py"), dir.join("bench.py"))?;
    let seed_models = root.join("../shared/seed_models.py");
    if seed_models.exists() {
        fs::copy(seed_models, dir.join("seed_models.py"))?;
    }
    Ok(())
}

/// The project's Python tools (setup.sh makes them): `.tools/python/bin/<tool>`.
fn python_tool(root: &Path, tool: &str) -> Result<PathBuf> {
    let path = root.join(".tools/python/bin").join(tool);
    if !path.exists() {
        return Err(format!("{} is missing: run ./setup.sh", path.display()).into());
    }
    Ok(path)
}

/// Builds the Python package's wheel with maturin: its path.
fn wheel() -> Result<PathBuf> {
    let root = workspace_root();
    let out = root.join("target/wheels");
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    let status = Command::new(python_tool(&root, "maturin")?)
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--quiet",
            "--manifest-path",
            "python/Cargo.toml",
            "--out",
        ])
        .arg(&out)
        .status()?;
    if !status.success() {
        return Err(format!("maturin build failed ({status})").into());
    }
    let wheel = fs::read_dir(&out)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.extension().is_some_and(|e| e == "whl"))
        .ok_or("maturin built no wheel")?;
    println!("wheel: {}", wheel.display());
    Ok(wheel)
}

/// Installs `wheel` and PyTorch in a fresh virtual environment, offline from the
/// wheels setup.sh downloaded, and runs the Python tests.
fn test_python(wheel: &Path) -> Result {
    let root = workspace_root();
    let venv = root.join("target/python-venv");
    let run = |program: &Path, args: &[&str]| -> Result {
        let status = Command::new(program).current_dir(&root).args(args).status()?;
        if !status.success() {
            return Err(format!("{} {} failed ({status})", program.display(), args.join(" ")).into());
        }
        Ok(())
    };
    run(
        Path::new("python3"),
        &["-m", "venv", "--clear", &venv.display().to_string()],
    )?;
    let python = venv.join("bin/python");
    let wheels = root.join(".tools/wheels").display().to_string();
    let requirements = root.join("python/requirements-test.txt").display().to_string();
    let install = [
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        &wheels,
    ];
    run(&python, &[&install[..], &["-r", &requirements]].concat())?;
    run(&python, &[&install[..], &[&wheel.display().to_string()]].concat())?;
    // The repository root has no `gpu_kernels` folder, so the installed package is
    // the one imported.
    run(
        &python,
        &[
            "-m",
            "pytest",
            "-q",
            "-rs",
            "python/tests",
            "--rootdir",
            "python/tests",
        ],
    )
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() {
            dir_size(&entry.path())?
        } else {
            entry.metadata()?.len()
        };
    }
    Ok(total)
}

fn run_script(script: &Path, args: &[&str]) -> Result {
    let status = Command::new("bash").arg(script).args(args).status()?;
    if !status.success() {
        return Err(format!("{} failed ({status})", script.display()).into());
    }
    Ok(())
}
