#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build kiln (Release, Ninja,
# preset `release`) and run the main job: a small training run.
#   bash scripts/quickstart.sh [args for the training program]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_deps
build_preset

# The main job. The MNIST example replaces the synthetic training demo here once
# it exists.
main_job="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-train-demo"
[[ -x "$main_job" ]] || die "$main_job was not built (is KILN_BUILD_EXAMPLES off?)"
log "run $(basename "$main_job") $*"
exec "$main_job" "$@"
