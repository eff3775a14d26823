#!/usr/bin/env bash
# Fails when a C++/CUDA source is not formatted as the root .clang-format says.
# Formatting differs between clang-format releases, so the check runs only with
# the release the tree was formatted with (Debian 12's clang-format 14) and says
# so otherwise. Fix what it reports with: clang-format -i FILE...
#   bash scripts/check-format.sh
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$KILN_ROOT" || exit 1

KILN_CLANG_FORMAT_MAJOR=14

if ! have clang-format; then
  log "format: clang-format not found, not checked"
  exit 0
fi
major="$(clang-format --version | sed -E 's/.*version ([0-9]+).*/\1/')"
if [[ "$major" != "$KILN_CLANG_FORMAT_MAJOR" ]]; then
  log "format: clang-format $major is not $KILN_CLANG_FORMAT_MAJOR (the tree's), not checked"
  exit 0
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
else
  mapfile -t files < <(find include src tests bench examples \
    \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -type f)
fi
# One run over all files; each difference is reported as "FILE:LINE:COL: error".
mapfile -t bad < <(clang-format --dry-run -Werror "${files[@]}" 2>&1 |
  sed -nE 's/^([^:]+):[0-9]+:[0-9]+: error.*/\1/p' | sort -u)
if ((${#bad[@]})); then
  printf '  %s\n' "${bad[@]}" >&2
  die "format: ${#bad[@]} file(s) differ from .clang-format; run: clang-format -i FILE..."
fi
log "format: ${#files[@]} files formatted as .clang-format says"
