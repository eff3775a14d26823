#!/usr/bin/env bash
# Checks that every op's code lives in the files named by its family (the second
# column of include/kiln/ops.def), in every layer:
#   core       src/core/ops/<family>.cpp          backward_<OP> (ops with a rule)
#   CPU        src/backends/cpu/kernels/<family>*.cpp   kernel_<OP> (COMPUTE, ALIAS)
#   CUDA       src/backends/cuda/<family>.cu      <family>_kernel(), when launch.h
#                                                 declares the family implemented
#   reference  tests/ops/reference/ref_<family>*.cpp    ref_<OP>
#   cases      tests/ops/cases/cases_<family>.cpp  add_<family>_cases (that each op
#              has a case in its family's list is checked by OpsCoverage)
# and that every file of those folders is named after a family, so `ls *<family>*`
# in each folder shows one family's whole code. Run by ctest (op_families).
# Usage: check_op_families.sh [repo root]
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2
errors=0
err() {
  echo "check_op_families: $*" >&2
  errors=$((errors + 1))
}

# ENUM family kind grad, one op a line.
ops=$(sed -n 's/^KILN_OP(\([A-Z0-9_]*\), *\([a-z0-9_]*\), *\([A-Z]*\), *[01], *\([01]\)).*/\1 \2 \3 \4/p' \
  include/kiln/ops.def)
[[ -n $ops ]] || { echo "check_op_families: no KILN_OP lines in include/kiln/ops.def" >&2; exit 2; }
families=$(echo "$ops" | awk '{print $2}' | sort -u)

# Files whose names must start with a family name (prefix, suffix, exceptions).
check_names() {
  local dir=$1 prefix=$2 suffix=$3 except=$4 f base fam ok
  for f in "$dir"/"$prefix"*"$suffix"; do
    [[ -e $f ]] || continue
    base=$(basename "$f" "$suffix")
    base=${base#"$prefix"}
    [[ " $except " == *" $base "* ]] && continue
    ok=0
    for fam in $families; do [[ $base == "$fam"* ]] && ok=1; done
    ((ok)) || err "$f is not named after an op family of ops.def ($(echo $families))"
  done
}
check_names src/core/ops "" .cpp ""
check_names src/backends/cpu/kernels "" .cpp ""
check_names src/backends/cuda "" .cu ""
check_names tests/ops/reference ref_ .cpp ""
check_names tests/ops/cases cases_ .cpp "threads"

# Does some file of the glob define the pattern?
defined_in() {
  local pattern=$1
  shift
  local f
  for f in "$@"; do [[ -f $f ]] && grep -qE "$pattern" "$f" && return 0; done
  return 1
}

while read -r op fam kind grad; do
  # The optimizer steps' builders belong to the training layer (src/opt), which
  # core may not include; their family has no core file.
  if [[ $fam != optim && $kind != LEAF ]]; then
    [[ -f src/core/ops/$fam.cpp ]] || err "$op: src/core/ops/$fam.cpp is missing"
  fi
  if [[ $grad == 1 ]] && ! defined_in "void backward_${op}\(" "src/core/ops/$fam.cpp"; then
    err "$op: backward_${op} is not defined in src/core/ops/$fam.cpp"
  fi
  if [[ $kind == COMPUTE || $kind == ALIAS ]] &&
    ! defined_in "void kernel_${op}\(" src/backends/cpu/kernels/"$fam"*.cpp; then
    err "$op: kernel_${op} is not defined in src/backends/cpu/kernels/$fam*.cpp"
  fi
  if ! defined_in "RefValue ref_${op}\(" tests/ops/reference/ref_"$fam"*.cpp; then
    err "$op: ref_${op} is not defined in tests/ops/reference/ref_$fam*.cpp"
  fi
done <<<"$ops"

for fam in $families; do
  defined_in "void add_${fam}_cases\(" "tests/ops/cases/cases_$fam.cpp" ||
    err "family $fam: add_${fam}_cases is not defined in tests/ops/cases/cases_$fam.cpp"
  # CUDA: launch.h declares every family's kernel table, either implemented in
  # <family>.cu or inline and empty (no CUDA kernels: the CPU runs them).
  launch=src/backends/cuda/launch.h
  if grep -qE "^OpKernel ${fam}_kernel\(Op op\);" "$launch"; then
    defined_in "^OpKernel ${fam}_kernel\(Op op\)" "src/backends/cuda/$fam.cu" ||
      err "family $fam: ${fam}_kernel is not defined in src/backends/cuda/$fam.cu"
  elif grep -qE "^inline OpKernel ${fam}_kernel\(Op\)" "$launch"; then
    [[ ! -f src/backends/cuda/$fam.cu ]] ||
      err "family $fam: launch.h declares no CUDA kernels but src/backends/cuda/$fam.cu exists"
  else
    err "family $fam: $launch declares no ${fam}_kernel (add one, inline and empty if CUDA lacks it)"
  fi
done

if ((errors)); then
  echo "check_op_families: $errors problem(s); see include/kiln/ops.def and docs/adding-an-op.md" >&2
  exit 1
fi
echo "check_op_families: $(echo "$ops" | wc -l) ops in $(echo $families | wc -w) families, all in place"
