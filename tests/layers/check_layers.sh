#!/usr/bin/env bash
# The layer check (a ctest test, see tests/CMakeLists.txt): every #include of
# kiln's sources goes the right way. Layers, in order; each may use only the
# layers before it (docs/design.md, "Layers"):
#   0 core          src/core, include/kiln/{dtype,error,tensor,context,graph,graph_passes,ops,optim_hyper}.h,
#                   ops.def, quant_types.def, kiln/ext/{tensor_node,op_params,op_builder,rng}.h
#   1 backend API   src/backend, kiln/{backend,registry}.h, kiln/ext/registry.h
#   2 allocators    src/alloc, kiln/memory_plan.h, kiln/ext/alloc.h
#   3 backends      src/backends/*, kiln/{cpu,blas,cuda}.h
#   4 scheduler     src/sched, kiln/ext/sched.h
#   5 io            src/io, kiln/{io,safetensors,state_dict}.h
#   6 tokenizer     src/tokenizer, src/chat, kiln/{tokenizer,chat}.h (optional: KILN_TOKENIZER)
#   7 nn            src/nn, kiln/nn.h, kiln/nn/*.h
#   8 training      src/opt, kiln/{opt,grad_store,dataset,token_dataset,token_train,chat_dataset}.h
#   9 distributed   src/dist, kiln/dist.h
#  10 models       src/models, kiln/models.h, kiln/generate.h, kiln/sampling.h
#  11 programs      examples/ (user API only; kiln/kiln.h includes all of it)
# Headers are user API (include/kiln/*.h) or extension API (include/kiln/ext/*.h:
# tensor metadata, op parameters and builders, allocators, the scheduler,
# registering backends). User headers and programs must not include extension
# headers; the library's layers and the checks may.
# A layer's private headers ("core/...", "backends/cpu/...": paths under src/) are
# for that layer alone. Checks (tests/, bench/) may use everything and are not
# scanned.
#   bash tests/layers/check_layers.sh [ROOT]     exit 0: no violation
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
cd "$root"

names=(core "backend API" allocators backends scheduler io tokenizer nn training distributed models programs)
programs_layer=$((${#names[@]} - 1))

# Layer of a file of the tree (-1: not scanned).
file_layer() {
  case "$1" in
    src/core/*) echo 0 ;;
    src/backend/*) echo 1 ;;
    src/alloc/*) echo 2 ;;
    src/backends/*) echo 3 ;;
    src/sched/*) echo 4 ;;
    src/io/*) echo 5 ;;
    src/tokenizer/* | src/chat/*) echo 6 ;;
    src/nn/*) echo 7 ;;
    src/opt/*) echo 8 ;;
    src/dist/*) echo 9 ;;
    src/models/*) echo 10 ;;
    include/kiln/*) public_layer "${1#include/kiln/}" ;;
    examples/*) echo "$programs_layer" ;;
    *) echo -1 ;;
  esac
}

# Layer of a public header, by its path under include/kiln/ (-1: unknown).
public_layer() {
  case "$1" in
    dtype.h | error.h | tensor.h | context.h | graph.h | graph_passes.h | ops.h | ops.def | quant_types.def | optim_hyper.h) echo 0 ;;
    ext/tensor_node.h | ext/op_params.h | ext/op_builder.h | ext/rng.h) echo 0 ;;
    backend.h | registry.h | ext/registry.h) echo 1 ;;
    memory_plan.h | ext/alloc.h) echo 2 ;;
    cpu.h | blas.h | cuda.h) echo 3 ;;
    ext/sched.h) echo 4 ;;
    io.h | safetensors.h | state_dict.h) echo 5 ;;
    tokenizer.h | chat.h) echo 6 ;;
    nn.h | nn/*) echo 7 ;;
    opt.h | grad_store.h | dataset.h | token_dataset.h | token_train.h | chat_dataset.h) echo 8 ;;
    dist.h) echo 9 ;;
    models.h | generate.h | sampling.h | lora.h) echo 10 ;;
    kiln.h) echo "$programs_layer" ;;
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
    tokenizer/* | chat/*) echo 6 ;;
    nn/*) echo 7 ;;
    opt/*) echo 8 ;;
    dist/*) echo 9 ;;
    models/*) echo 10 ;;
    *) echo -1 ;;
  esac
}

bad=0
report() {
  printf '%s\n' "$1"
  bad=$((bad + 1))
}

files=()
for d in src include/kiln examples; do
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
    if [[ "$inc" == kiln/ext/* && ( "$layer" == "$programs_layer" || ( "$f" == include/kiln/* && "$f" != include/kiln/ext/* ) ) ]]; then
      report "$f:$line: includes $inc, an extension header: user headers and programs use the user API (include/kiln/*.h) only"
    fi
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
      if ((layer == programs_layer)); then
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
