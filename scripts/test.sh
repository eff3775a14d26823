#!/usr/bin/env bash
# Quick start, command 2 (and what CI runs, see .ci/run): install what is
# missing, build the `release` preset and run every test with ctest.
#   bash scripts/test.sh [extra ctest args, e.g. -R core]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_deps
build_preset

log "ctest --preset $KILN_PRESET $*"
cd "$KILN_ROOT" || exit 1
# ctest ends with its summary ("100% tests passed, 0 tests failed out of N") and
# exits non-zero when a test fails; the exit status is this script's.
ctest --preset "$KILN_PRESET" "$@"
