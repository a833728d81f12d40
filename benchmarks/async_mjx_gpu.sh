#!/usr/bin/env bash
# Issue 46's done-means on the MJX workload (GPU): the synchronous declared workflow, the best synchronous
# rose plan and the best asynchronous rose plan, with `max_staleness: 1` on the policy's rollout_weights
# (the weights `act` reads: workflows/paper_mjx_vla.yaml with `--set stale=1`; STALE=K for another budget).
#
#   MODE=compare bash benchmarks/async_mjx_gpu.sh   # one interleaved `rose compare` run: throughput ratio
#   MODE=curves  bash benchmarks/async_mjx_gpu.sh   # reward (sim/episode_return) against wall-clock time
#   MODE=check   bash benchmarks/async_mjx_gpu.sh   # the rewrites and validations only (no MJX: a CPU check)
#   DEVICE=cpu MODE=compare ROUNDS=1 SETS="--set num_envs=8 --set hidden=64 ..." bash benchmarks/async_mjx_gpu.sh
#       # the whole script on a CPU at small shapes, with MJX in .mjxenv (workflows/paper_mjx_vla.yaml's header)
#
# carries: .raybundle and .mjxbundle (benchmarks/mjx_bundle.sh), as benchmarks/paper_table_gpu.sh for mjx.
# SYNC: the best synchronous plan's rewrites, `split-time epoch 2; interleave epoch` (what `rose optimize`
# stage 1 chose on the GPU, docs/results.md: 9.67 -> 7.85 s an iteration on an H100). DEFER: the
# asynchronous rewrite, `defer sync 1`: `sync` (policy.load_weights) is the only writer of rollout_weights
# (it refreshes them from the trainer's `publish`), so deferring it by one RL iteration lets iteration k+1's
# rollout start during iteration k's PPO update, reading weights one update older (lag 1 <= max_staleness
# 1; `rose validate --explain` on best_async.yaml says so, in the log). The asynchronous plan is SYNC +
# DEFER: the split-time copies are of the simulator, never of the policy, so the deferred sync still
# refreshes the one process whose weights `act` reads, and `rose rewrite` accepts the combination (checked
# on the CPU). Should it ever be refused, the script says why and falls back to DEFER alone.
#
# MODE=compare: per round declared 2 iterations, best_sync 2, best_async 1 + a window of 5, plus 1 warm-up;
# ~9.7 + 7.85 s an iteration: ROUNDS=2 ~ 160 s of iterations + ~60 s start-up (LIMIT 540). COMPARE_PLANS
# (default best_sync,best_async) picks the rows beside declared; best_async_low is best_async with LOW's
# components (default: trainer) at a below-normal MPS client priority (benchmarks/plan_mps.py; GPU only):
# stage 2's case as one row -- the update has slack beside the rollout it shares the SMs with.
# best_async_quotaN and best_async_quotaN_low (N a percentage): best_async with LOW's components at MPS quota N %,
# and at priority 1 as well; COMPARE_PLANS and CURVE_PLANS may name several, e.g.
# best_async_quota90_low,best_async_quota95_low (the ninth session's rows: 1.59x and 1.61x declared on an H100).
# An H200 computes bf16 products wrongly at 20-40% and 60-88%, an H100 at 20-40% and at 80% at least: `rose
# compare` screens each level first and refuses an unsafe one. A priority orders waiting kernels but preempts
# none; a quota bounds the SMs the trainer's kernels can hold (docs/results.md, "Asynchronous plans on the GPU").
# MODE=curves: benchmarks/async_plans.py --rounds 0 --wall-s WALL_S (see benchmarks/async_longtail_gpu.sh):
# each plan in CURVE_PLANS (default declared,best_async) trains from scratch and stops after the first
# iteration that ends past WALL_S s of its own wall clock; async_plans.json is rewritten after every
# iteration, the SVG too. The simulator's step program takes ~26 s to compile on
# the first call (benchmarks/results/mjx_bench.json) and JAX keeps it in JAX_COMPILATION_CACHE_DIR
# (/tmp/jax-cache): the first run would pay it inside its clock and the others not, so the script compiles
# it once first, at the workflow's shapes (WARM=0 skips that). Time of one call, with s_p a plan's seconds
# per iteration (declared 9.7; best_async unmeasured, at most best_sync's 7.85), ~30 s of start-up per run
# (Ray workers, the 360M-parameter policy and trainer: not on the curve's clock) and ~75 s for the bundles,
# the rewrites, the validation and the compile:
#   75 + sum over plans of (30 + WALL_S + s_p), + s_p once more for an asynchronous plan (the iteration it
#   already has in flight when it stops) and its drain
# WALL_S=100: 75 + (30 + 100 + 10) + (30 + 100 + 2 * 8) ~ 360 s (LIMIT 420); with best_sync too, add ~140 s.
set -u
MODE=${MODE:-compare}
WF=${WF:-workflows/paper_mjx_vla.yaml}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-$([ "$MODE" = curves ] && echo 420 || echo 540)}
ROUNDS=${ROUNDS:-2}
SYNC=${SYNC:-"split-time epoch 2;interleave epoch"}
DEFER=${DEFER:-"defer sync 1"}
CURVE_ITERATIONS=${CURVE_ITERATIONS:-60}   # a cap: WALL_S ends the curve runs
WALL_S=${WALL_S:-100}
CURVE_PLANS=${CURVE_PLANS:-declared,best_async}
COMPARE_PLANS=${COMPARE_PLANS:-best_sync,best_async}
LOW=${LOW:-trainer}
REWARD=${REWARD:-sim/episode_return}
SETS=(${SETS:-})   # extra --set NAME=VALUE pairs for the workflow
# what the MJX simulator's process needs allowed (its import path, JAX's cache): paper_workloads.py's trust
TRUST=(--allow-env JAX_COMPILATION_CACHE_DIR --allow-path /tmp/mjxenv --allow-path .mjxenv)
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0
if [ "$DEVICE" != cpu ] && [ "$MODE" != check ]; then
  . benchmarks/device_env.sh || exit 1
else
  . benchmarks/device_env.sh none
fi
if [ "$MODE" != check ] && [ "$DEVICE" != cpu ]; then  # (DEVICE=cpu: MJX from .mjxenv, the workflow's header says how)
  bash benchmarks/mjx_env.sh > "$OUT/mjx_env.log" 2>&1 || { cat "$OUT/mjx_env.log"; exit 1; }
  [ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
set -o pipefail
# the workflow's `stale` param is the budget of the weights `act` reads (max_staleness, default 0): every run
# here sets it
W=$OUT/$(basename "$WF" .yaml)_stale${STALE:-1}.yaml   # a copy named after its source (the plans' written-from file)
cp "$WF" "$W" && grep -q 'max_staleness: "${stale}"' "$W" || { echo "$WF declares no \`stale\` budget" >&2; exit 1; }
SETS+=(--set "stale=${STALE:-1}")
if [ "$DEVICE" = cpu ]; then  # a CPU check of the whole script at small SETS (no CUDA graphs, no MPS)
  sed -i 's/^    device: gpu/    device: cpu/; s/cuda_graphs: true/cuda_graphs: false/' "$W"
fi
sync_do=(); IFS=';' read -ra parts <<< "$SYNC"; for p in "${parts[@]}"; do sync_do+=(--do "$p"); done
python3 -m rose_cli rewrite "$W" "${SETS[@]}" "${sync_do[@]}" -o "$OUT/best_sync.yaml" --overwrite || exit 1
if ! python3 -m rose_cli rewrite "$W" "${SETS[@]}" "${sync_do[@]}" --do "$DEFER" -o "$OUT/best_async.yaml" \
    --overwrite 2> "$OUT/async_rewrite.err"; then
  cat "$OUT/async_rewrite.err" >&2
  echo "warning: SYNC + '$DEFER' was refused (above); best_async is '$DEFER' alone" >&2
  python3 -m rose_cli rewrite "$W" "${SETS[@]}" --do "$DEFER" -o "$OUT/best_async.yaml" --overwrite || exit 1
fi
# the lag each read has in the asynchronous plan, as the analysis proves it (and the trust the runs need)
python3 -m rose_cli validate "$OUT/best_async.yaml" --explain "${TRUST[@]}" > "$OUT/best_async_explain.txt" || exit 1
grep "max_staleness" "$OUT/best_async_explain.txt" || { echo "best_async.yaml has no read within a budget" >&2; exit 1; }
if [ "$DEVICE" = cuda ]; then  # (MPS priorities bind GPU processes only)
  low=(); IFS=',' read -ra lows <<< "$LOW"; for c in "${lows[@]}"; do low+=(--priority "$c=1"); done
  python3 benchmarks/plan_mps.py "$OUT/best_async.yaml" -o "$OUT/best_async_low.yaml" "${low[@]}" || exit 1
  # best_async_quotaN[_low], for each such row COMPARE_PLANS or CURVE_PLANS names
  IFS=',' read -ra cps <<< "$COMPARE_PLANS,$CURVE_PLANS"
  for p in "${cps[@]}"; do
    [[ "$p" =~ ^best_async_quota([0-9]+)(_low)?$ ]] || continue
    mps=(); for c in "${lows[@]}"; do mps+=(--quota "$c=${BASH_REMATCH[1]}"); done
    [ -n "${BASH_REMATCH[2]}" ] && mps+=("${low[@]}")
    python3 benchmarks/plan_mps.py "$OUT/best_async.yaml" -o "$OUT/$p.yaml" "${mps[@]}" || exit 1
  done
fi

warm_sim() {  # compile the simulator's step program once, into JAX's cache, at the workflow's shapes
  [ "${WARM:-1}" = 1 ] || return 0
  PYTHONPATH="/tmp/mjxenv:.mjxenv:$PYTHONPATH" XLA_PYTHON_CLIENT_PREALLOCATE=false MUJOCO_GL=disable \
  JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache python3 - "$W" "$DEVICE" "${SETS[@]}" <<'PY'
import sys, time

import torch

from examples.embodied.sim_mjx import ReacherMjxSim
from rose_dsl import load_workflow
from rose_dsl.cli import set_overrides

wf = load_workflow(sys.argv[1], set_overrides([s for s in sys.argv[3:] if s != "--set"]))
args = dict(wf.components["sim"].args)
t0 = time.perf_counter()
sim = ReacherMjxSim(**args, device=sys.argv[2])
sim.reset(it=0, ep=0)
sim.step(torch.zeros(sim.num_envs, sim.chunk, sim.act_dim))
print(f"simulator compiled in {time.perf_counter() - t0:.1f} s (num_envs {sim.num_envs}, chunk {sim.chunk}, "
      f"frame_skip {sim.frame_skip})", flush=True)
PY
}

. benchmarks/device_out.sh   # pack_runs, pack_plans: what comes back from the device
[ "$DEVICE" = cuda ] && [ "$MODE" != check ] && trap pack_plans EXIT

case "$MODE" in
  check) echo "rewrites and validation ok: $OUT/best_sync.yaml $OUT/best_async.yaml" ;;
  compare)
    per_round=2; plan_args=(); IFS=',' read -ra cps <<< "$COMPARE_PLANS"
    for p in "${cps[@]}"; do
      case "$p" in best_sync) per_round=$((per_round + 2)) ;;
        best_async|best_async_low|best_async_quota[0-9]*) per_round=$((per_round + 6)) ;;
        *) echo "COMPARE_PLANS takes best_sync, best_async, best_async_low, best_async_quotaN," \
                "best_async_quotaN_low; not $p" >&2; exit 2 ;; esac
      [ -f "$OUT/$p.yaml" ] || { echo "$p.yaml was not written (best_async_low, best_async_quotaN: on the GPU only)" >&2
                                 exit 2; }
      plan_args+=(--plan "$p=$OUT/$p.yaml")
    done
    need=$((1 + ROUNDS * per_round))
    timeout "$LIMIT" python3 -m rose_cli compare "$W" "${SETS[@]}" --set iterations=$need --backend ray "${TRUST[@]}" \
      "${plan_args[@]}" --rounds "$ROUNDS" \
      --json "$OUT/async_compare.json" --runs /tmp/async_runs --overwrite 2>&1 | tee "$OUT/log_async_compare.txt"
    rc=$?; pack_runs /tmp/async_runs; exit $rc ;;
  curves)
    warm_sim || exit 1
    mps_plans=(); IFS=',' read -ra cvs <<< "$CURVE_PLANS"   # the MPS rows above, when CURVE_PLANS names them
    for p in "${cvs[@]}"; do [[ "$p" == best_async_* ]] && mps_plans+=(--plan "$p=$OUT/$p.yaml"); done
    timeout "$LIMIT" python3 benchmarks/async_plans.py "$W" "${SETS[@]}" --backend ray \
      --plan best_sync="$OUT/best_sync.yaml" --plan best_async="$OUT/best_async.yaml" "${mps_plans[@]}" --rounds 0 \
      --wall-s "$WALL_S" --iterations "$CURVE_ITERATIONS" --curve-plans "$CURVE_PLANS" \
      --reward "$REWARD" --out "$OUT/async_curves" 2>&1 | tee "$OUT/log_async_curves.txt" ;;
  *) echo "MODE is compare, curves or check" >&2; exit 2 ;;
esac
