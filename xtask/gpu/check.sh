#!/bin/bash
# Grove's GPU check, laid out by `cargo xtask gpu-check` in a folder that travels to the device
# machine. The device runs a call for at most 10 minutes, so the check is two calls, each
# time-boxed to BUDGET seconds (450 by default on the device; a step that would run past it is
# cut or skipped, and the summary says so):
#   bash <folder>/check.sh 1   parity with transformers on the golden tiny models (f32, bf16);
#                              a random-weight Qwen2.5-0.5B made on the device by make_model.py;
#                              `trainer bench` beside HF transformers (hf_bench.py) on it; tree
#                              and chain rollouts through an env-server on the device.
#   bash <folder>/check.sh 2   one training micro-batch per logits path (chunked, chunked +
#                              checkpointing, full), each alone in its process so that its sampled
#                              peak GPU memory is its own, beside HF's; the same for a 3B model.
# Part 2 reuses part 1's model when the machine is still the same one (it makes it otherwise).
# Output: $OUT/summary.txt (one line per step: rc, ms, peak GPU MiB) and $OUT/all.log.
# DEV=cpu runs both parts in one go on a CPU, a tiny random model with the Qwen2.5 vocabulary
# standing in for every shape (what `cargo xtask test` does, so the script cannot rot).
set -u
PART=${1:-all}
case "$PART" in 1 | 2 | all) ;; *) echo "usage: check.sh [1|2|all]" >&2; exit 2 ;; esac
D=$(cd "$(dirname "$0")" && pwd)
W=${TMPDIR:-/tmp}/grove-gpu-check
# A fresh scratch folder, unless models made by an earlier run should be reused (KEEP_MODELS=1,
# the default of part 2).
KEEP=${KEEP_MODELS:-0}; [ "$PART" = 2 ] && KEEP=${KEEP_MODELS:-1}
[ "$KEEP" = 1 ] || rm -rf "$W"
mkdir -p "$W"
OUT=${OUT:-$W/out}; mkdir -p "$OUT"
DEV=${DEV:-cuda}
# Seconds this part may take in all (0: no limit, the CPU mode's default).
if [ "$DEV" = cuda ]; then BUDGET=${BUDGET:-450}; else BUDGET=${BUDGET:-0}; fi
T0=$(date +%s)
in_part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
# The binaries and the tokenizer travel gzipped (the carry limit); unpacked once into $W.
unpack() {
  if [ -e "$D/$1" ]; then ln -sf "$D/$1" "$W/$1"; elif [ ! -e "$W/$1" ]; then gunzip -c "$D/$1.gz" >"$W/$1"; fi
}
for f in trainer env-server; do unpack "$f"; chmod +x "$W/$f" 2>/dev/null; done
mkdir -p "$W/tok"
for f in tokenizer.json tokenizer_config.json; do
  if [ -e "$D/tok/$f" ]; then cp "$D/tok/$f" "$W/tok/$f"; elif [ ! -e "$W/tok/$f" ]; then gunzip -c "$D/tok/$f.gz" >"$W/tok/$f"; fi
done
if [ "$DEV" = cuda ]; then
  SIZES=${SIZES:-0.5b}; BIG=${BIG:-3b}; MB=${MB:-4}; BMB=${BMB:-2}; MT=${MT:-4096}
  GEN=${GEN:-1,8,64,256}; NEW=${NEW:-128}; PROMPTS=${PROMPTS:-32}; REPEATS=${REPEATS:-3}
  TL=${TL:-1024}; TURN_NEW=${TURN_NEW:-48}
else
  SIZES=${SIZES:-tiny}; BIG=${BIG:-tiny}; MB=${MB:-1}; BMB=${BMB:-1}; MT=${MT:-128}
  GEN=${GEN:-1,8}; NEW=${NEW:-8}; PROMPTS=${PROMPTS:-2}; REPEATS=${REPEATS:-1}
  TL=${TL:-64}; TURN_NEW=${TURN_NEW:-8}
fi
: >"$OUT/summary.txt"

# The trainer: on CUDA it runs on the device's own torch libraries with libtorch_cuda preloaded
# (the binary was linked against the CPU libtorch of the same version).
G=$W/trainer
if [ "$DEV" = cuda ]; then
  TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
  LDP=$TORCH_LIB:$(ls -d "$TORCH_LIB"/../../nvidia/*/lib 2>/dev/null | tr '\n' ':')
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s LD_PRELOAD=%s exec %s "$@"\n' "$LDP" "$TORCH_LIB/libtorch_cuda.so" "$W/trainer" >"$W/grove"
  chmod +x "$W/grove"; G=$W/grove
fi
HF=0
python3 -c 'import torch, transformers' 2>/dev/null && HF=1

# run NAME TIMEOUT CMD...: output to $W/NAME.log and $OUT/all.log; peak GPU memory sampled every
# 50 ms while it runs (when nvidia-smi is there). Within the part's BUDGET: the timeout is cut to
# what is left, and a step with less than 20 s left is skipped.
run() {
  local name=$1 t=$2; shift 2
  if [ "$BUDGET" -gt 0 ]; then
    local left=$((BUDGET - ($(date +%s) - T0) - 5))
    if [ "$left" -lt 20 ]; then skip "$name" "less than 20 s of part $PART's ${BUDGET} s left"; return; fi
    [ "$t" -gt "$left" ] && t=$left
  fi
  local s=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$W/$name.mem" 2>/dev/null &
    s=$!
  fi
  local t0; t0=$(date +%s%N)
  timeout "$t" "$@" >"$W/$name.log" 2>&1; local rc=$?
  [ -n "$s" ] && { kill "$s" 2>/dev/null; wait "$s" 2>/dev/null; }
  local peak=-
  [ -s "$W/$name.mem" ] && peak=$(sort -n "$W/$name.mem" | tail -1)
  printf '%s rc=%s ms=%s peak_mib=%s\n' "$name" "$rc" "$((($(date +%s%N) - t0) / 1000000))" "$peak" | tee -a "$OUT/summary.txt"
  { echo "== $name rc=$rc"; grep -v 'Loading weights\|Writing model' "$W/$name.log" | tail -60; } >>"$OUT/all.log"
}
skip() { printf '%s skipped (%s)\n' "$1" "$2" | tee -a "$OUT/summary.txt"; }

{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  [ "$HF" = 1 ] && python3 -c 'import torch,transformers;print("torch",torch.__version__,"transformers",transformers.__version__)'
  nproc; } >>"$OUT/all.log" 2>&1

# 1. Parity with transformers (the golden cases were made by transformers).
in_part 1 && for m in "$D"/golden/*/; do
  for p in f32 bf16; do
    run "parity-$(basename "$m")-$p" 60 "$G" parity --json --model "$m" --device "$DEV" --precision "$p"
  done
done

# 2. Models: random weights of real shapes where transformers is there, else a tiny random one.
model() {
  local s=$1
  [ -d "$W/q$s" ] && return
  if [ "$HF" = 1 ]; then
    run "make-$s" 150 python3 "$D/make_model.py" "$W/q$s" "$s" "$W/tok" "$DEV"
  else
    run "make-$s" 120 "$G" init-small --tokenizer "$W/tok" --hidden 64 --layers 2 --out "$W/q$s"
  fi
}

first=${SIZES%% *}
for s in $SIZES; do
  model "$s"
  # 3. The bench beside transformers on the same shape.
  in_part 1 && run "grove-bench-$s" 240 "$G" bench --json --model "$W/q$s" --device "$DEV" --gen-batches "$GEN" \
    --new-tokens "$NEW" --repeats "$REPEATS" --train-batch 4 --train-len "$TL"
  if ! in_part 1; then
    :
  elif [ "$HF" = 1 ]; then
    run "hf-bench-$s" 180 python3 "$D/hf_bench.py" "$W/q$s" --gen-batches "$GEN" --new-tokens "$NEW" \
      --train-batch 4 --train-len "$TL"
  else
    skip "hf-bench-$s" "no transformers"
  fi
  [ "$s" = "$first" ] || continue
  # 4. Tree and chain rollouts through an env-server on the device (random policy: speed only).
  if in_part 1; then
    "$W/env-server" serve --bind 127.0.0.1:18556 --corpus "$D/world/corpus.jsonl" >"$W/env-server.log" 2>&1 &
    srv=$!
    for _ in $(seq 120); do
      (exec 3<>/dev/tcp/127.0.0.1/18556) 2>/dev/null && break
      sleep 0.5
    done
    run "grove-rollout-$s" 240 "$G" bench --json --model "$W/q$s" --device "$DEV" --gen-batches 1 --new-tokens 8 \
      --repeats "$REPEATS" --env ws://127.0.0.1:18556/ --data "$D/world/test.jsonl" --data-source synthetic \
      --prompt-template "$D/world/prompt.txt" --prompts "$PROMPTS" --max-turns 3 --max-new-tokens "$TURN_NEW" --topk 1
    kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
  fi
  in_part 2 || continue
  # 5. One training micro-batch per path, each alone in its process.
  for path in "chunked" "chunked --checkpoint" "full"; do
    tag=$(echo "$path" | tr -d ' -')
    # shellcheck disable=SC2086
    run "grove-train-$s-${MB}x$MT-$tag" 150 "$G" bench --json --model "$W/q$s" --device "$DEV" \
      --train-step "${MB}x$MT" --repeats "$REPEATS" --logits $path
  done
  if [ "$HF" = 1 ]; then
    run "hf-train-$s-${MB}x$MT" 150 python3 "$D/hf_bench.py" "$W/q$s" --only-train --train-batch "$MB" --train-len "$MT"
  else
    skip "hf-train-$s" "no transformers"
  fi
done

# 6. A larger model's training micro-batch, chunked with checkpointing, beside transformers.
if in_part 2 && [ "$BIG" != "$first" ]; then
  model "$BIG"
  run "grove-train-$BIG-${BMB}x$MT-chunkedcheckpoint" 150 "$G" bench --json --model "$W/q$BIG" --device "$DEV" \
    --train-step "${BMB}x$MT" --repeats 1 --logits chunked --checkpoint
  run "grove-train-$BIG-${BMB}x$MT-chunked" 150 "$G" bench --json --model "$W/q$BIG" --device "$DEV" \
    --train-step "${BMB}x$MT" --repeats 1 --logits chunked
  if [ "$HF" = 1 ]; then
    run "hf-train-$BIG-${BMB}x$MT" 150 python3 "$D/hf_bench.py" "$W/q$BIG" --only-train --train-batch "$BMB" --train-len "$MT"
  fi
fi
echo done | tee -a "$OUT/summary.txt"
