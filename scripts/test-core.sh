#!/usr/bin/env bash
# Runs the Core lane: the tests of crates/potluck/tests/core_lane.rs (serve's
# money path, the node's channel lifecycle) against a real Bitcoin Core,
# `bitcoind -regtest` without `-txindex`, instead of the development chain.
#
# Bitcoin Core is built from source once, into a cache outside the checkout
# (${POTLUCK_CORE_CACHE:-$HOME/.cache/potluck-core}); later runs reuse it. The
# source is the one the crates.io package `libbitcoinkernel-sys` ships (a
# pinned version, fetched with cargo, so no other host is needed). The build
# takes about 40 minutes of both cores of the project's machine and runs
# under `nice -n 19`; it is too slow for every CI run, which keeps the
# development chain (the same tests run there, without the variable below).
#
# Usage: bash scripts/test-core.sh [--build-only] [nextest arguments...]
# Environment:
#   POTLUCK_CORE_CACHE  where the source, the build and the binary go
#   POTLUCK_CORE_JOBS   parallel compile jobs (default: nproc)
#   POTLUCK_BITCOIND    use this bitcoind instead of building one
set -euo pipefail
cd "$(dirname "$0")/.."

# The crate whose `bitcoin/` folder is Bitcoin Core's source tree. Pinned so
# that every run builds the same Core; bump it on purpose.
KERNEL_SYS_VERSION=0.4.1
CACHE=${POTLUCK_CORE_CACHE:-$HOME/.cache/potluck-core}
JOBS=${POTLUCK_CORE_JOBS:-$(nproc)}
PREFIX="$CACHE/libbitcoinkernel-sys-$KERNEL_SYS_VERSION"
BITCOIND="$PREFIX/bin/bitcoind"

BUILD_ONLY=0
if [ "${1:-}" = "--build-only" ]; then
  BUILD_ONLY=1
  shift
fi

install_build_deps() {
  if command -v cmake >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1 \
     && [ -e /usr/include/boost/version.hpp ] && [ -e /usr/include/event2/event.h ]; then
    return 0
  fi
  echo "== installing cmake, pkg-config, libboost-dev, libevent-dev (Bitcoin Core's build)"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    cmake pkg-config libboost-dev libevent-dev >/dev/null
}

# Brings the pinned crate into cargo's registry cache through a scratch
# project (cargo is the only client the source is fetched with) and copies
# its `bitcoin/` tree into the cache.
fetch_source() {
  local src="$CACHE/src-$KERNEL_SYS_VERSION"
  if [ -f "$src/CMakeLists.txt" ]; then
    echo "$src"
    return 0
  fi
  local scratch="$CACHE/fetch"
  mkdir -p "$scratch/src"
  cat >"$scratch/Cargo.toml" <<EOF
[package]
name = "potluck-core-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
libbitcoinkernel-sys = "=$KERNEL_SYS_VERSION"
EOF
  : >"$scratch/src/lib.rs"
  (cd "$scratch" && cargo fetch --quiet) >&2
  local registry crate_dir=""
  for registry in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/; do
    if [ -d "$registry/libbitcoinkernel-sys-$KERNEL_SYS_VERSION/bitcoin" ]; then
      crate_dir="$registry/libbitcoinkernel-sys-$KERNEL_SYS_VERSION"
    fi
  done
  if [ -z "$crate_dir" ]; then
    echo "libbitcoinkernel-sys $KERNEL_SYS_VERSION was fetched but its bitcoin/ tree is not in cargo's registry" >&2
    exit 1
  fi
  rm -rf "$src.tmp"
  cp -a "$crate_dir/bitcoin" "$src.tmp"
  mv "$src.tmp" "$src"
  echo "$src"
}

build_bitcoind() {
  install_build_deps
  mkdir -p "$CACHE"
  local src
  src=$(fetch_source)
  local build="$CACHE/build-$KERNEL_SYS_VERSION"
  echo "== configuring Bitcoin Core from $src (build in $build)"
  # Only bitcoind: no wallet (the project has its own), no GUI, no tests or
  # benchmarks, no IPC (it would need Cap'n Proto), no external signer, no
  # ccache; the embedded ASMap is not needed on regtest.
  cmake -S "$src" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_DAEMON=ON -DBUILD_BITCOIN_BIN=OFF -DBUILD_CLI=OFF -DBUILD_TX=OFF \
    -DBUILD_UTIL=OFF -DBUILD_WALLET_TOOL=OFF -DBUILD_UTIL_CHAINSTATE=OFF \
    -DBUILD_KERNEL_LIB=OFF -DENABLE_WALLET=OFF -DBUILD_GUI=OFF \
    -DBUILD_TESTS=OFF -DBUILD_BENCH=OFF -DBUILD_FUZZ_BINARY=OFF \
    -DENABLE_IPC=OFF -DENABLE_EXTERNAL_SIGNER=OFF -DWITH_ZMQ=OFF \
    -DWITH_CCACHE=OFF -DWITH_EMBEDDED_ASMAP=OFF -DINSTALL_MAN=OFF
  echo "== building bitcoind with $JOBS jobs under nice -n 19 (about 40 minutes on 2 cores)"
  local started=$SECONDS
  nice -n 19 cmake --build "$build" --target bitcoind -j "$JOBS"
  mkdir -p "$PREFIX/bin"
  cp "$build/bin/bitcoind" "$BITCOIND.tmp"
  mv "$BITCOIND.tmp" "$BITCOIND"
  echo "== built $("$BITCOIND" -version | head -n1) in $((SECONDS - started)) s"
}

if [ -n "${POTLUCK_BITCOIND:-}" ]; then
  BITCOIND=$POTLUCK_BITCOIND
elif [ ! -x "$BITCOIND" ]; then
  build_bitcoind
fi
echo "== using $BITCOIND: $("$BITCOIND" -version | head -n1)"
[ "$BUILD_ONLY" = 1 ] && exit 0

if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
# The black-box tests need the test-hooks feature (see scripts/test.sh).
# --no-capture runs them one at a time (one bitcoind at a time, wall times of
# each alone) and shows the line each prints with the chain it ran on.
POTLUCK_TEST_BITCOIND="$BITCOIND" cargo nextest run -p potluck \
  --features potluck/test-hooks --no-fail-fast --no-capture -E 'binary(core_lane)' "$@"
