#!/usr/bin/env bash
# The GPT mixed-precision figures (docs/benchmarks.md, "GPT in bf16") in one run:
# kiln-gpt's default recipe in f32 and with --precision bf16, and the same model
# and recipe in PyTorch (bench/gpt_pytorch.py) in f32 and under CPU autocast to
# bf16, all on the same number of threads, the four runs alternated in every
# repeat so that each sees the same machine. Prints every run's summary line
# (val_loss, train_tokens_per_s, train_time_s, peak_rss_mb; kiln also
# planned_mb), then the medians and the ratios the targets name: kiln bf16 over
# kiln f32, over PyTorch f32 and over PyTorch autocast, and the val_loss gap
# between kiln bf16 and f32. Logs stay in out/bench-gpt-bf16/.
#   bash scripts/bench-gpt-bf16.sh [ITERS (2000)] [REPEATS (1)] [THREADS (2)]
# On a quiet 2-core machine one repeat of 2000 iterations takes about 5 minutes
# (kiln ~40 s per run, PyTorch ~2 min per run).
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

iters="${1:-2000}" repeats="${2:-1}" threads="${3:-2}"
install_deps
build_preset kiln-gpt
bash "$KILN_ROOT/scripts/get-sotu.sh"

py="$(torch_python)"

gpt="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-gpt"
out="$KILN_ROOT/out/bench-gpt-bf16"
mkdir -p "$out"
log "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores," \
  "commit $(git -C "$KILN_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
  "$iters iterations, $threads threads, load $(cut -d' ' -f1-3 /proc/loadavg)"

# Median of the KEY= fields of the lines in file $2.
median() {
  sed -nE "s/.*$1=([0-9.]+).*/\\1/p" "$2" | sort -n |
    awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

runs=(kiln-f32 kiln-bf16 pytorch-f32 pytorch-autocast)
for name in "${runs[@]}"; do : >"$out/$name.txt"; done
for ((r = 1; r <= repeats; ++r)); do
  for name in "${runs[@]}"; do
    log "run $r/$repeats: $name"
    case $name in
      kiln-*)
        "$gpt" train --data "$KILN_ROOT/data/sotu" --out "$out/$name.gguf" --threads "$threads" \
          --iters "$iters" --precision "${name#kiln-}" >"$out/$name-$r.log" 2>&1
        ;;
      pytorch-*)
        flag=()
        [[ $name == pytorch-autocast ]] && flag=(--autocast)
        OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$threads" "$py" "$KILN_ROOT/bench/gpt_pytorch.py" \
          --data "$KILN_ROOT/data/sotu" --out "$out/$name.pt" --threads "$threads" \
          --iters "$iters" "${flag[@]}" >"$out/$name-$r.log"
        ;;
    esac
    tail -n1 "$out/$name-$r.log" | tee -a "$out/$name.txt"
  done
done

declare -A rate loss rss
for name in "${runs[@]}"; do
  rate[$name]="$(median train_tokens_per_s "$out/$name.txt")"
  loss[$name]="$(median val_loss "$out/$name.txt")"
  rss[$name]="$(median peak_rss_mb "$out/$name.txt")"
  log "$name (median of $repeats): ${rate[$name]} tokens/s, val_loss ${loss[$name]}," \
    "peak RSS ${rss[$name]} MB"
done
log "planned MB (kiln): f32 $(median planned_mb "$out/kiln-f32.txt")," \
  "bf16 $(median planned_mb "$out/kiln-bf16.txt")"
log "kiln bf16 tokens/s: $(ratio "${rate[kiln-bf16]}" "${rate[kiln-f32]}")x kiln f32 (target 1.6)," \
  "$(ratio "${rate[kiln-bf16]}" "${rate[pytorch-f32]}")x PyTorch f32 (target 5)," \
  "$(ratio "${rate[kiln-bf16]}" "${rate[pytorch-autocast]}")x PyTorch autocast"
# The same ratio repeat by repeat (each pair ran back to back): on a VM whose
# speed moves between minutes, its spread shows how far the medians can be
# trusted.
pairs="$(paste -d' ' <(sed -nE 's/.*train_tokens_per_s=([0-9.]+).*/\1/p' "$out/kiln-bf16.txt") \
  <(sed -nE 's/.*train_tokens_per_s=([0-9.]+).*/\1/p' "$out/kiln-f32.txt") |
  awk '{printf "%s%.2f", (NR > 1 ? " " : ""), $1 / $2}')"
log "kiln bf16 / f32 repeat by repeat: $pairs"
log "val_loss kiln bf16 - f32: $(awk -v a="${loss[kiln-bf16]}" -v b="${loss[kiln-f32]}" \
  'BEGIN {printf "%+.4f", a - b}') (target within 0.02)"
