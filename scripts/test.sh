#!/usr/bin/env bash
# Quick start, command 2 (and what CI runs, see .ci/run): install what is
# missing, then build and test every configuration kiln ships:
#   release   -march=native: every target, every test
#   portable  baseline x86-64 (the generic kernel paths): op-test harness and
#             CPU kernel tests (ctest labels ops and cpu)
#   avx2      -march=x86-64-v3 (the AVX2 paths without AVX-512): the same tests
#             (skipped after release on a CPU with AVX2 and no AVX-512, where
#             release's -march=native build already is that build)
#   asan      AddressSanitizer + UBSan (fatal): every test
#   cuda      where nvcc is installed: checks that the release build has the CUDA
#             backend (docs/cuda.md) and runs its tests (ctest preset cuda; the
#             ones that need a GPU skip without one)
# SIMD paths are chosen at compile time (docs/design.md, "Backends"), so each
# instruction set is its own build. First of all, "format" checks that every
# source is formatted as .clang-format says (scripts/check-format.sh, 2 s).
#   bash scripts/test.sh [extra ctest args, e.g. -R core]
#   KILN_TEST_BUILDS="release" bash scripts/test.sh   # only some of the builds
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

KILN_TEST_BUILDS="${KILN_TEST_BUILDS:-format release cuda portable avx2 asan}"

install_deps
cd "$KILN_ROOT" || exit 1

# Builds and tests one configuration: run_build PRESET CTEST_PRESET [targets...]
# (no targets: all of them). ctest ends with its summary ("100% tests passed")
# and exits non-zero when a test fails; set -e then stops this script.
run_build() {
  local preset="$1" test_preset="$2"
  shift 2
  local start=$SECONDS
  KILN_PRESET="$preset" build_preset "$@"
  log "ctest --preset $test_preset ${CTEST_ARGS[*]+"${CTEST_ARGS[*]}"}"
  ctest --preset "$test_preset" "${CTEST_ARGS[@]+"${CTEST_ARGS[@]}"}"
  log "$preset: built and tested in $((SECONDS - start)) s"
}

CTEST_ARGS=("$@")
for b in $KILN_TEST_BUILDS; do
  case "$b" in
    format) bash scripts/check-format.sh ;;
    release) run_build release release ;;
    portable) run_build portable kernels-portable kiln_test_ops kiln_test_cpu ;;
    avx2)
      # On an AVX2 CPU without AVX-512 the release build (-march=native) has
      # just compiled and tested the same kernel paths (they are chosen by
      # __AVX2__/__FMA__/__F16C__/__AVX512*__ alone): a second build would add
      # ~5 minutes and no coverage.
      if [[ " $KILN_TEST_BUILDS " == *" release "* ]] && grep -qw avx2 /proc/cpuinfo &&
        ! grep -qw avx512f /proc/cpuinfo; then
        log "avx2: the release build already ran the AVX2 paths (this CPU has AVX2, no AVX-512)"
      else
        run_build avx2 kernels-avx2 kiln_test_ops kiln_test_cpu
      fi
      ;;
    asan) run_build asan asan ;;
    # The release preset builds the CUDA backend whenever nvcc is found (also in
    # /usr/local/cuda/bin when it is not on PATH); this checks that it did and runs
    # its tests. The other presets leave CUDA out (portable, avx2: they test the
    # CPU's SIMD paths; asan: without a device the CUDA runtime adds no checked
    # code).
    cuda)
      if have_nvcc; then
        run_build release cuda kiln_test_cuda kiln_test_ops
        KILN_PRESET=release check_cuda_built
      else
        log "cuda: nvcc not found, no CUDA build to test"
      fi
      ;;
    *) die "unknown build '$b' in KILN_TEST_BUILDS (format, release, cuda, portable, avx2, asan)" ;;
  esac
done
log "all builds passed: $KILN_TEST_BUILDS (${SECONDS} s)"
