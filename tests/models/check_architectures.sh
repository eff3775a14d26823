#!/usr/bin/env bash
# Checks that every row of src/models/architectures.def has its files, fixture
# and docs (as check_op_families.sh does for ops.def):
#   src/models/<name>_arch.cpp defines arch_<name>() (config.json, GGUF, builder)
#   src/models/<modules>.cpp exists (its nn::Modules)
#   tests/models/fixtures/<fixture>/ holds config.json (model_type one of the
#     row's), model weights and expected.safetensors, and make_fixtures.py writes it
#   the fixture's logits and both exports are tested (test_logits.cpp, test_export.cpp)
#   docs/models.md names every model_type and GGUF architecture of the row
# and that no src/models/*_arch.cpp lacks a row. Run by ctest (model_architectures).
# Usage: check_architectures.sh [repo root]
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2
errors=0
err() {
  echo "check_architectures: $*" >&2
  errors=$((errors + 1))
}

# name modules "model types" "gguf archs" fixture, one row a line (tab separated).
rows=$(sed -n 's/^KILN_ARCH(\([a-z0-9_]*\), *\([a-z0-9_]*\), *"\([^"]*\)", *"\([^"]*\)", *\([a-z0-9_]*\)).*/\1\t\2\t\3\t\4\t\5/p' \
  src/models/architectures.def)
[[ -n $rows ]] || { echo "check_architectures: no KILN_ARCH rows in src/models/architectures.def" >&2; exit 2; }

while IFS=$'\t' read -r name modules types ggufs fixture; do
  f=src/models/${name}_arch.cpp
  if [[ ! -f $f ]]; then
    err "$name: $f is missing"
  elif ! grep -qE "^const ArchHooks& arch_${name}\(\)" "$f"; then
    err "$name: $f does not define arch_${name}()"
  fi
  [[ -f src/models/$modules.cpp ]] || err "$name: its modules' file src/models/$modules.cpp is missing"
  d=tests/models/fixtures/$fixture
  if [[ ! -f $d/config.json || ! -f $d/expected.safetensors ]]; then
    err "$name: fixture $d lacks config.json or expected.safetensors"
  else
    ls "$d"/model*.safetensors >/dev/null 2>&1 || err "$name: fixture $d has no model weights"
    t=$(sed -n 's/^ *"model_type": *"\([a-z0-9_]*\)".*/\1/p' "$d/config.json" | head -1)
    [[ " $types " == *" $t "* ]] || err "$name: fixture $d has model_type '$t', not one of '$types'"
  fi
  grep -q "\"$fixture\"" tests/models/make_fixtures.py ||
    err "$name: tests/models/make_fixtures.py does not write fixture '$fixture'"
  for t in test_logits.cpp test_export.cpp; do
    grep -q "\"$fixture\"" "tests/models/$t" || err "$name: tests/models/$t does not test fixture '$fixture'"
  done
  for t in $types $ggufs; do
    grep -q "\`$t\`" docs/models.md || err "$name: docs/models.md does not name \`$t\`"
  done
done <<<"$rows"

names=$(echo "$rows" | cut -f1)
for f in src/models/*_arch.cpp; do
  [[ -e $f ]] || continue
  n=$(basename "$f" _arch.cpp)
  echo "$names" | grep -qx "$n" || err "$f has no row in src/models/architectures.def"
done
[[ -f docs/adding-a-model.md ]] || err "docs/adding-a-model.md is missing"

if ((errors)); then
  echo "check_architectures: $errors problem(s); see src/models/architectures.def and docs/adding-a-model.md" >&2
  exit 1
fi
echo "check_architectures: $(echo "$rows" | wc -l) architectures, all in place"
