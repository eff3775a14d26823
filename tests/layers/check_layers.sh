#!/usr/bin/env bash
# The layer check (a ctest test, see tests/CMakeLists.txt): every #include of
# kiln's sources goes the right way. Layers, in order; each may use only the
# layers before it (docs/design.md, "Layers"):
#   0 core          src/core, include/kiln/{dtype,error,tensor,context,graph,ops,op_params}.h, ops.def, detail/
#   1 backend API   src/backend, kiln/{backend,registry}.h
#   2 allocators    src/alloc, kiln/alloc.h
#   3 backends      src/backends/*, kiln/{cpu,blas,cuda}.h
#   4 scheduler     src/sched, kiln/sched.h
#   5 io            src/io, kiln/{io,safetensors,state_dict}.h
#   6 nn            src/nn, kiln/nn.h, kiln/nn/*.h
#   7 training      src/opt, kiln/{opt,dataset}.h
#   8 distributed   src/dist, kiln/dist.h
#   9 models        src/models, kiln/models.h
#  10 programs      examples/, tools/ (public headers only; kiln/kiln.h includes all)
# A layer's private headers ("core/...", "backends/cpu/...": paths under src/) are
# for that layer alone. Checks (tests/, bench/) may use everything and are not
# scanned.
#   bash tests/layers/check_layers.sh [ROOT]     exit 0: no violation
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
cd "$root"

names=(core "backend API" allocators backends scheduler io nn training distributed models programs)

# Layer of a file of the tree (-1: not scanned).
file_layer() {
  case "$1" in
    src/core/*) echo 0 ;;
    src/backend/*) echo 1 ;;
    src/alloc/*) echo 2 ;;
    src/backends/*) echo 3 ;;
    src/sched/*) echo 4 ;;
    src/io/*) echo 5 ;;
    src/nn/*) echo 6 ;;
    src/opt/*) echo 7 ;;
    src/dist/*) echo 8 ;;
    src/models/*) echo 9 ;;
    include/kiln/*) public_layer "${1#include/kiln/}" ;;
    examples/* | tools/*) echo 10 ;;
    *) echo -1 ;;
  esac
}

# Layer of a public header, by its path under include/kiln/ (-1: unknown).
public_layer() {
  case "$1" in
    dtype.h | error.h | tensor.h | context.h | graph.h | ops.h | ops.def | op_params.h | detail/*) echo 0 ;;
    backend.h | registry.h) echo 1 ;;
    alloc.h) echo 2 ;;
    cpu.h | blas.h | cuda.h) echo 3 ;;
    sched.h) echo 4 ;;
    io.h | safetensors.h | state_dict.h) echo 5 ;;
    nn.h | nn/*) echo 6 ;;
    opt.h | grad_store.h | dataset.h | token_dataset.h) echo 7 ;;
    dist.h) echo 8 ;;
    models.h) echo 9 ;;
    kiln.h) echo 10 ;;
    *) echo -1 ;;
  esac
}

# Layer whose private header this is (path under src/; -1: not a private header).
private_layer() {
  case "$1" in
    core/*) echo 0 ;;
    backend/*) echo 1 ;;
    alloc/*) echo 2 ;;
    backends/*) echo 3 ;;
    sched/*) echo 4 ;;
    io/*) echo 5 ;;
    nn/*) echo 6 ;;
    opt/*) echo 7 ;;
    dist/*) echo 8 ;;
    models/*) echo 9 ;;
    *) echo -1 ;;
  esac
}

bad=0
report() {
  printf '%s\n' "$1"
  bad=$((bad + 1))
}

files=()
for d in src include/kiln examples tools; do
  [[ -d "$d" ]] || continue
  while IFS= read -r f; do files+=("$f"); done < <(find "$d" -type f \( -name '*.h' -o -name '*.hpp' \
    -o -name '*.cpp' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.def' \) | sort)
done

for f in "${files[@]}"; do
  layer="$(file_layer "$f")"
  if [[ "$layer" == -1 ]]; then
    [[ "$f" == include/kiln/* ]] && report "$f: public header of no layer: add it to tests/layers/check_layers.sh"
    continue
  fi
  while IFS=: read -r line inc; do
    inc="${inc#*\"}"
    inc="${inc%%\"*}"
    if [[ "$inc" == kiln/* ]]; then
      hl="$(public_layer "${inc#kiln/}")"
      if [[ "$hl" == -1 ]]; then
        report "$f:$line: includes $inc, which is in no layer: add it to tests/layers/check_layers.sh"
      elif ((hl > layer)); then
        report "$f:$line: ${names[$layer]} includes $inc (${names[$hl]}): a layer may use only the layers before it"
      fi
    elif [[ -e "$(dirname "$f")/$inc" ]]; then
      continue  # next to the including file (a program's own header)
    else
      pl="$(private_layer "$inc")"
      [[ "$pl" == -1 ]] && continue
      if ((layer == 10)); then
        report "$f:$line: ${names[$layer]} include $inc, a private header of ${names[$pl]}: use include/kiln"
      elif ((pl > layer)); then
        report "$f:$line: ${names[$layer]} includes $inc (${names[$pl]}): a layer may use only the layers before it"
      elif ((pl < layer)); then
        report "$f:$line: ${names[$layer]} includes $inc, a private header of ${names[$pl]}: use its public header (include/kiln) or move what is shared there"
      fi
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
done

if ((bad > 0)); then
  printf 'layer check: %d wrong-way include(s) in %s\n' "$bad" "$root"
  exit 1
fi
printf 'layer check: %d files, every include goes the right way\n' "${#files[@]}"
