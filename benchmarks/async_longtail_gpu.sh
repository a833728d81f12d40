#!/usr/bin/env bash
# Issue 46's done-means on the long-tail LLM workload (GPU): the synchronous declared workflow, the best
# synchronous rose plan and the best asynchronous rose plan, with `max_staleness: 1` on the generator's
# weights (workflows/llm_grpo_longtail_gpu.yaml with `--set stale=1`; STALE=K for another budget).
#
#   MODE=compare bash benchmarks/async_longtail_gpu.sh   # one interleaved `rose compare` run: throughput ratio
#   MODE=curves  bash benchmarks/async_longtail_gpu.sh   # reward against wall-clock time over one wall budget
#   MODE=optimize bash benchmarks/async_longtail_gpu.sh  # `rose optimize` (both stages) on the budgeted variant
#
# MODE=optimize: benchmarks/optimize_gpu.sh on the variant (OPT_BUDGET s, OPT_ITERATIONS training iterations,
# LIMIT): stage 1 may choose `defer` (the budget allows it) and stage 2 the MPS quota or priority of the process
# with slack -- in an asynchronous plan the learner, which finishes beside the generation it should not slow.
# Its optimize.tgz lands in $OUT. With DEVICE=cpu it runs as optimize_gpu.sh's SMOKE (local backend).
#
# carries: .raybundle (as benchmarks/paper_table_gpu.sh). Each mode fits one device call (LIMIT s).
# `rose compare` measures an asynchronous plan over windows of pipelined iterations (docs/cli.md) and writes
# its JSON after every round, so a call cut short keeps the rounds it finished. SYNC: the rewrites of the
# best synchronous plan (default: issue 45's chain of 4 row groups; replace it by `rose optimize`'s if that
# found a better one); the asynchronous plan is SYNC + `defer sync 1`. Target: async >= 1.5x the declared
# throughput, reward per wall-clock second not worse (the curves' picture, cut at the shortest run, and
# async_plans.json's reward_summary: the reward at that common budget and the mean reward up to it).
#
# MODE=curves: benchmarks/async_plans.py --rounds 0 (no throughput blocks: `compare` gives those) --wall-s
# WALL_S: each plan in CURVE_PLANS (default declared,best_async; add best_sync if the call has the time; any
# plan the script writes may be named, e.g. declared,best_partial_async with STALE=2)
# trains from scratch and stops after the first iteration that ends past WALL_S s of its own wall clock
# (CURVE_ITERATIONS is only a cap). async_plans.json and the SVG are rewritten after every iteration,
# so a call cut short keeps what it did. Time of one call, with s_p a plan's seconds
# per iteration (H100, issue 46's compare run: declared 26.5, best_async 18.8), ~40 s of start-up per run
# (Ray workers, model load: not on the curve's clock) and ~30 s for the bundle, the two rewrites and imports:
#   30 + sum over plans of (40 + WALL_S + s_p), + s_p once more for an asynchronous plan (the iteration it
#   already has in flight when it stops) and its drain
# WALL_S=100: 30 + (40 + 100 + 26.5) + (40 + 100 + 2 * 18.8) ~ 375 s (LIMIT 420); WALL_S=75 ~ 325 s;
# with best_sync too, add ~40 + WALL_S + 27 s.
set -u
MODE=${MODE:-compare}
WF=${WF:-workflows/llm_grpo_longtail_gpu.yaml}   # (workflows/llm_grpo_longtail.yaml with DEVICE=cpu: a CPU smoke run)
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-$([ "$MODE" = curves ] && echo 420 || echo 540)}
ROUNDS=${ROUNDS:-2}
SYNC=${SYNC:-"split-chain generate ref score 4"}
CURVE_ITERATIONS=${CURVE_ITERATIONS:-40}   # a cap: WALL_S ends the curve runs
WALL_S=${WALL_S:-100}
CURVE_PLANS=${CURVE_PLANS:-declared,best_async}
# best_partial: SYNC + `ahead submit` (partial rollouts as a plan of this workflow, lag 1), best_partial_async:
# that + `defer sync 1` (lag 2, STALE=2); the generator's partial_rollouts bound is the workflow's `stale`.
# MODE=compare: the plans beside declared (a round of all three took ~300-360 s on an H100: COMPARE_PLANS=best_async
# fits two rounds in one call). best_async_low: best_async with LOW's components at a below-normal MPS client
# priority (benchmarks/plan_mps.py; default LOW=learner): what stage 2 would screen, as one row;
# best_partial_async_low: the same for best_partial_async (written when it is, STALE >= 2)
COMPARE_PLANS=${COMPARE_PLANS:-best_sync,best_async}
# PLAN_FILES: more plans beside them, NAME=PATH[,NAME=PATH...] (e.g. found=plan.yaml: what `rose optimize` returned
# in an earlier call -- MODE=optimize's optimize.tgz holds it -- measured in the same rounds as the hand plans);
# each counts as an asynchronous plan's turn in the iteration budget
PLAN_FILES=${PLAN_FILES:-}
LOW=${LOW:-learner}
SETS=(${SETS:-})   # extra --set NAME=VALUE pairs for the workflow, e.g. SETS="--set prompts=64"
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0
if [ "$DEVICE" = cuda ]; then . benchmarks/device_env.sh || exit 1; else . benchmarks/device_env.sh none; fi
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
set -o pipefail
# the workflow's `stale` param is its generator's budget (max_staleness, default 0): every run here sets it
W=$OUT/$(basename "$WF" .yaml)_stale${STALE:-1}.yaml   # a copy named after its source (the plans' written-from file)
cp "$WF" "$W" && grep -q 'max_staleness: "${stale}"' "$W" || { echo "$WF declares no \`stale\` budget" >&2; exit 1; }
SETS+=(--set "stale=${STALE:-1}")
sync_do=(); IFS=';' read -ra parts <<< "$SYNC"; for p in "${parts[@]}"; do sync_do+=(--do "$p"); done
python3 -m rose_cli rewrite "$W" "${SETS[@]}" "${sync_do[@]}" -o "$OUT/best_sync.yaml" --overwrite || exit 1
python3 -m rose_cli rewrite "$W" "${SETS[@]}" "${sync_do[@]}" --do "defer sync 1" -o "$OUT/best_async.yaml" --overwrite || exit 1
# partial rollouts as plans (`ahead submit`: the next iteration's prompts queued while this one decodes; lag 1),
# and with the sync deferred too (lag 2: written only when STALE >= 2)
python3 -m rose_cli rewrite "$W" "${SETS[@]}" "${sync_do[@]}" --do "ahead submit" -o "$OUT/best_partial.yaml" --overwrite \
  || echo "best_partial not written (refused above: a SYNC that already runs calls ahead has it)"
python3 -m rose_cli rewrite "$W" "${SETS[@]}" "${sync_do[@]}" --do "ahead submit" --do "defer sync 1" \
  -o "$OUT/best_partial_async.yaml" --overwrite 2>/dev/null || echo "best_partial_async needs STALE >= 2 (not written)"
if [ "$DEVICE" = cuda ]; then  # (MPS priorities bind GPU processes only)
  low=(); IFS=',' read -ra lows <<< "$LOW"; for c in "${lows[@]}"; do low+=(--priority "$c=1"); done
  python3 benchmarks/plan_mps.py "$OUT/best_async.yaml" -o "$OUT/best_async_low.yaml" "${low[@]}" || exit 1
  if [ -f "$OUT/best_partial_async.yaml" ]; then
    python3 benchmarks/plan_mps.py "$OUT/best_partial_async.yaml" -o "$OUT/best_partial_async_low.yaml" "${low[@]}" || exit 1
  fi
fi
. benchmarks/device_out.sh   # pack_runs, pack_plans: what comes back from the device
[ "$DEVICE" = cuda ] && trap pack_plans EXIT

case "$MODE" in
  compare)
    # per round: declared 2 iterations, a synchronous plan 2, an asynchronous one 1 + a window of 5; plus 1 warm-up
    per_round=2; plan_args=(); IFS=',' read -ra cps <<< "$COMPARE_PLANS"
    for p in "${cps[@]}"; do
      case "$p" in best_sync) per_round=$((per_round + 2)) ;;
        best_async|best_async_low|best_partial) per_round=$((per_round + 6)) ;;
        best_partial_async|best_partial_async_low) per_round=$((per_round + 7)) ;;
        *) echo "COMPARE_PLANS takes best_sync, best_async, best_async_low, best_partial, best_partial_async," \
                "best_partial_async_low; not $p" >&2
           exit 2 ;; esac
      [ -f "$OUT/$p.yaml" ] || { echo "$p.yaml was not written (best_async_low, best_partial_async_low: on the GPU" \
                                      "only; best_partial_async: STALE >= 2)" >&2; exit 2; }
      plan_args+=(--plan "$p=$OUT/$p.yaml")
    done
    if [ -n "$PLAN_FILES" ]; then IFS=',' read -ra pfs <<< "$PLAN_FILES"; for pf in "${pfs[@]}"; do
      [ -f "${pf#*=}" ] || { echo "PLAN_FILES: no file ${pf#*=}" >&2; exit 2; }
      plan_args+=(--plan "$pf"); per_round=$((per_round + 7)); done; fi
    need=$((1 + ROUNDS * per_round))
    timeout "$LIMIT" python3 -m rose_cli compare "$W" "${SETS[@]}" --set iterations=$need --backend ray \
      "${plan_args[@]}" --rounds "$ROUNDS" \
      --json "$OUT/async_compare.json" --runs /tmp/async_runs --overwrite 2>&1 | tee "$OUT/log_async_compare.txt"
    rc=$?; pack_runs /tmp/async_runs; exit $rc ;;
  curves)
    # each plan in CURVE_PLANS trains from scratch (same seed) for WALL_S s of its wall clock; any plan written
    # above may be named (best_partial_async: STALE >= 2)
    plan_args=(); for p in best_sync best_async best_async_low best_partial best_partial_async best_partial_async_low; do
      [ -f "$OUT/$p.yaml" ] && plan_args+=(--plan "$p=$OUT/$p.yaml"); done
    timeout "$LIMIT" python3 benchmarks/async_plans.py "$W" "${SETS[@]}" --backend ray \
      "${plan_args[@]}" --rounds 0 \
      --wall-s "$WALL_S" --iterations "$CURVE_ITERATIONS" --curve-plans "$CURVE_PLANS" \
      --reward reward/mean_reward --out "$OUT/async_curves" 2>&1 | tee "$OUT/log_async_curves.txt" ;;
  optimize)
    [ "$DEVICE" = cpu ] && smoke=1 || smoke=0
    WORKFLOW="$W" SETS="${SETS[*]} --set iterations=${OPT_ITERATIONS:-30}" BUDGET=${OPT_BUDGET:-420} \
      LIMIT=$LIMIT SMOKE=$smoke OUT=$OUT bash benchmarks/optimize_gpu.sh 2>&1 | tee "$OUT/log_async_optimize.txt" ;;
  *) echo "MODE is compare, curves or optimize" >&2; exit 2 ;;
esac
