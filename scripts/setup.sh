#!/usr/bin/env bash
# Install everything roam needs on a fresh Debian bookworm machine (as root or
# with sudo): WebAssembly toolchains, Binaryen, qemu-user and cross linkers,
# the headless browser the dashboard's tests use (chromium), and the Rust
# targets. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PKGS=(binaryen clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32
      libc++-16-dev-wasm32 libc++abi-16-dev-wasm32 tcl zstd curl xz-utils
      qemu-user gcc-aarch64-linux-gnu gcc-riscv64-linux-gnu
      libc6-dev-arm64-cross libc6-dev-riscv64-cross build-essential pkg-config
      redis-tools etcd-server protobuf-compiler chromium)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v rustup >/dev/null; then
  echo "setup: rustup is required (https://rustup.rs); install it and rerun" >&2
  exit 1
fi
# rust-toolchain.toml pins the toolchain and lists the targets; make sure
# they are present.
rustup show active-toolchain >/dev/null
# wasm32-wasip1-threads: the multi-threaded workloads (workloads/threads/).
rustup target add wasm32-wasip1 wasm32-wasip1-threads aarch64-unknown-linux-gnu \
  riscv64gc-unknown-linux-gnu >/dev/null
# The real-program suite (workloads/real/) builds one Go program for
# GOOS=wasip1, which needs Go 1.21 or newer (bookworm's golang is 1.19).
if ! command -v go >/dev/null; then
  echo "setup: warning: Go >= 1.21 is needed for workloads/real (https://go.dev/dl/);" \
       "without it workloads/real/build.sh skips golua (and fails under CI=true)" >&2
fi
echo "setup: done"
