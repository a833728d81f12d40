#!/usr/bin/env bash
# Issue 46, item 5 on the GPU: partial rollouts on the long-tail LLM workload, in ONE device call.
#
#   bash benchmarks/partial_longtail_gpu.sh                     # H100/H200, carries .raybundle
#   DEVICE=cpu WF=workflows/llm_grpo_longtail.yaml bash benchmarks/partial_longtail_gpu.sh   # CPU smoke run
#
# 1. `rose compare` of the partial-rollout variant (benchmarks/llm_partial_variant.py: the next iteration's
#    prompts submitted ahead, so that they decode in the slots the long tail leaves free; per-token versions,
#    the generator's bound PARTIAL, max_staleness STALENESS) as declared against its asynchronous plan
#    (+ `defer sync 1`), ROUNDS_P interleaved rounds;
# 2. `rose compare` of the synchronous declared workflow alone (ROUNDS_S rounds): the baseline, in the same
#    call (separate processes, minutes apart: not interleaved with 1 -- say so beside any ratio).
# Time (H100, declared ~26.5 s/iteration, model loads ~40 s each): 1. ~40 + (1 + ROUNDS_P) x ~25 + ROUNDS_P x 5 x
# ~20 s (unmeasured: the variant's iteration; an H200 call did not finish one round in 190 s); 2. ~40 +
# (1 + ROUNDS_S) x 26.5 s. Defaults (ROUNDS_P=1 ROUNDS_S=1): limits 400 + 110 s, one 540-s call. Each step
# writes its JSON after every round and prints a line per round (a call cut short keeps what finished).
set -u
WF=${WF:-workflows/llm_grpo_longtail_gpu.yaml}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PARTIAL=${PARTIAL:-1}; STALENESS=${STALENESS:-2}
ROUNDS_P=${ROUNDS_P:-1}; ROUNDS_S=${ROUNDS_S:-1}
LIMIT_P=${LIMIT_P:-400}; LIMIT_S=${LIMIT_S:-110}
SETS=(${SETS:-})
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0
if [ -d .raybundle ] && [ "${DEVICE:-cuda}" = cuda ]; then
  . benchmarks/device_env.sh need || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  . benchmarks/device_env.sh none
fi
set -o pipefail
P=$OUT/partial.yaml
python3 benchmarks/llm_partial_variant.py "$WF" -o "$P" --partial "$PARTIAL" --staleness "$STALENESS" || exit 1
python3 -m rose_cli rewrite "$P" "${SETS[@]}" --do "defer sync 1" -o "$OUT/partial_async.yaml" --overwrite || exit 1
timeout --foreground -k 20 "$LIMIT_P" python3 -m rose_cli compare "$P" "${SETS[@]}" \
  --set iterations=$((2 + ROUNDS_P * 7)) --backend ray --plan partial_async="$OUT/partial_async.yaml" \
  --rounds "$ROUNDS_P" --json "$OUT/partial_compare.json" --overwrite 2>&1 | tee "$OUT/log_partial.txt"
echo "partial compare exit $?"
timeout --foreground -k 20 "$LIMIT_S" python3 -m rose_cli compare "$WF" "${SETS[@]}" \
  --set iterations=$((2 + ROUNDS_S)) --backend ray --rounds "$ROUNDS_S" --json "$OUT/sync_declared.json" \
  --overwrite 2>&1 | tee "$OUT/log_sync.txt"
echo "sync compare exit $?"
