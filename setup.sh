#!/usr/bin/env bash
# One-time, idempotent setup of a Debian 12 machine (run as root) for building the
# pure-Rust PTX kernels and the host library. Everything project-local lands in .tools/.
# After it, `cargo build`, `cargo test` and `cargo xtask ...` need no exported variables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS="$ROOT/.tools"
TOOLCHAIN_NAME=debian-1.96                       # must match rust-toolchain.toml
RUST_SRC=/usr/src/rustc-1.96.0
NVCC_WHEEL_VERSION=13.0.88                       # ptxas comes from this wheel
APT_PACKAGES=(rustc-web cargo-web rust-web-src rust-web-clippy rustfmt-web llvm-22
              python3 python3-pip python3-venv ca-certificates gcc libc6-dev)

say() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then exec sudo -E bash "$0" "$@"; fi
  echo "setup.sh must run as root (apt-get install)" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive

# --- 1. CUDA driver library to link against: an existing CUDA install wins -------------
cuda_root=""
for c in "${CUDA_PATH:-}" /usr/local/cuda; do
  if [ -n "$c" ] && { [ -e "$c/lib64/libcuda.so" ] || [ -e "$c/lib64/stubs/libcuda.so" ]; }; then
    cuda_root=$c; break
  fi
done
need_libcuda=0
if [ -z "$cuda_root" ] && [ ! -e /usr/lib/x86_64-linux-gnu/libcuda.so ]; then need_libcuda=1; fi

# --- 2. apt: contrib/non-free (Debian's libcuda1 lives there) and the packages ------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ "$need_libcuda" = 1 ] && missing+=(libcuda1)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$need_libcuda" = 1 ]; then
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      sed -i -E '/^Components:/{/non-free( |$)/!s/$/ contrib non-free/}' /etc/apt/sources.list.d/debian.sources
    fi
    if [ -f /etc/apt/sources.list ]; then
      sed -i -E '/^deb .*debian/{/non-free( |$)/!s/$/ contrib non-free/}' /etc/apt/sources.list
    fi
    say "apt sources: contrib and non-free enabled (for libcuda1)"
  fi
  say "apt-get install ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "apt packages: all present"
fi
say "compiler: $(/usr/bin/rustc --version)"

# --- 3. the rust source where -Zbuild-std looks for it ----------------------------------
if [ "$(readlink -f /usr/lib/rustlib/src/rust 2>/dev/null)" != "$RUST_SRC" ]; then
  mkdir -p /usr/lib/rustlib/src
  ln -sfn "$RUST_SRC" /usr/lib/rustlib/src/rust
  say "linked /usr/lib/rustlib/src/rust -> $RUST_SRC"
else
  say "rust source link: present"
fi

# --- 4. rustup toolchain name (when rustup manages cargo on this machine) ---------------
if command -v rustup >/dev/null; then
  if rustup toolchain list | grep -q "^$TOOLCHAIN_NAME"; then
    say "rustup toolchain $TOOLCHAIN_NAME: present"
  else
    rustup toolchain link "$TOOLCHAIN_NAME" /usr
    say "rustup toolchain $TOOLCHAIN_NAME linked to /usr"
  fi
else
  say "no rustup: /usr/bin/cargo (1.96) is used directly"
fi

mkdir -p "$TOOLS/bin"

# --- 5. llvm-bitcode-linker, built from the Debian source tree ---------------------------
if [ -x "$TOOLS/bin/llvm-bitcode-linker" ]; then
  say "llvm-bitcode-linker: present"
else
  src="$TOOLS/src/llvm-bitcode-linker"
  rm -rf "$TOOLS/src"; mkdir -p "$TOOLS/src"
  cp -r "$RUST_SRC/src/tools/llvm-bitcode-linker" "$src"
  grep -q '^\[workspace\]' "$src/Cargo.toml" || printf '\n[workspace]\n' >> "$src/Cargo.toml"
  say "building llvm-bitcode-linker"
  (cd "$src" && RUSTC=/usr/bin/rustc /usr/bin/cargo build --release -q --target-dir "$TOOLS/src/target")
  cp "$TOOLS/src/target/release/llvm-bitcode-linker" "$TOOLS/bin/"
  rm -rf "$TOOLS/src"
  say "llvm-bitcode-linker installed in .tools/bin"
fi
for t in llvm-link opt llc; do
  ln -sfn "/usr/lib/llvm-22/bin/$t" "$TOOLS/bin/$t"
done

# --- 6. ptxas from the nvidia-cuda-nvcc wheel -------------------------------------------
if [ -x "$TOOLS/bin/ptxas" ] && "$TOOLS/bin/ptxas" --version | grep -q "V${NVCC_WHEEL_VERSION%.*}"; then
  say "ptxas: present ($("$TOOLS/bin/ptxas" --version | tail -1))"
else
  wheels=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels" \
    "nvidia-cuda-nvcc==$NVCC_WHEEL_VERSION"
  python3 - "$wheels" "$TOOLS/bin/ptxas" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/bin/ptxas"))
    with open(sys.argv[2], "wb") as f:
        f.write(z.read(name))
os.chmod(sys.argv[2], 0o755)
PY
  rm -rf "$wheels"
  say "ptxas installed in .tools/bin ($("$TOOLS/bin/ptxas" --version | tail -1))"
fi

# --- 7. the folder cust's build script links libcuda from --------------------------------
mkdir -p "$TOOLS/cuda/lib64"
if [ -n "$cuda_root" ]; then
  lib=$cuda_root/lib64/libcuda.so; [ -e "$lib" ] || lib=$cuda_root/lib64/stubs/libcuda.so
else
  lib=/usr/lib/x86_64-linux-gnu/libcuda.so
fi
ln -sfn "$lib" "$TOOLS/cuda/lib64/libcuda.so"
say "libcuda for linking: $lib (found CUDA install: ${cuda_root:-none})"

# --- 8. Python: maturin (builds the wheel) and the wheels the Python tests install ------
MATURIN_VERSION=1.16.0
if [ -x "$TOOLS/python/bin/maturin" ] && "$TOOLS/python/bin/maturin" --version | grep -q "$MATURIN_VERSION"; then
  say "maturin: present"
else
  python3 -m venv --clear "$TOOLS/python"
  "$TOOLS/python/bin/pip" install -q "maturin==$MATURIN_VERSION"
  say "maturin $MATURIN_VERSION installed in .tools/python"
fi
stamp="$TOOLS/wheels/.downloaded-$(sha256sum "$ROOT/python/requirements-test.txt" | cut -c1-16)"
if [ -f "$stamp" ]; then
  say "test wheels: present"
else
  say "downloading the Python tests' wheels (PyTorch and its CUDA libraries, about 3 GB)"
  rm -rf "$TOOLS/wheels"
  python3 -m pip download -q -d "$TOOLS/wheels" -r "$ROOT/python/requirements-test.txt"
  touch "$stamp"
  say "test wheels in .tools/wheels"
fi
say "done"
