#!/usr/bin/env bash
# Issue 44's GPU check in ONE device call: `rose optimize` (stage 1, within BUDGET s) on a workflow at one
# shape, then `rose compare` of its plan against the declared workflow, interleaved over ROUNDS rounds on one
# set of workers. The optimizer's reported speedup should lie within the compare's spread.
#
#   WORKFLOW=workflows/paper_mjx_vla.yaml SETS="--set tokens=128 --set frame_skip=10" \
#     BUDGET=270 LIMIT=320 ROUNDS=5 bash benchmarks/optimize_compare_gpu.sh
#   SMOKE=1 bash benchmarks/optimize_compare_gpu.sh    # CPU check: local backend, latency workflow
# When both do not fit one call (MJX at a budget that decides: optimize ~500 s, compare ~170 s): COMPARE=0 in
# the first call; unpack its optimize.tgz into an ignored folder of the checkout (e.g. .optplan/), carry it,
# and PLAN=.optplan/optimize/plan.yaml in the second (the report beside it is read for the summary).
#
# Writes into $OUT: optimize.tgz (benchmarks/optimize_gpu.sh's archive: plan, report, log), compare.json
# (every measurement; written after each round, so a call cut short keeps the rounds it finished),
# log_compare.txt, optimize_compare.json (benchmarks/optimize_compare_summary.py: is the reported figure within
# the compare's paired ratios?). EXTRA goes to `rose optimize` (default --no-quota: stage 2 needs its own call's budget).
# COMPARE_LIMIT bounds the compare (s, default 220).
set -uo pipefail
OUT=${OUT:-/tmp/rose-optcmp-out}; mkdir -p "$OUT"
WORK_ROOT=${WORK_ROOT:-/tmp/rose-optcmp-work}
if [ "${SMOKE:-0}" = "1" ]; then
  WORKFLOW=${WORKFLOW:-workflows/latency_interaction.yaml}; BACKEND=local
  export PYTHONPATH=$PWD:${PYTHONPATH:-}
else
  WORKFLOW=${WORKFLOW:-workflows/paper_mjx_vla.yaml}; BACKEND=ray
fi
SETS=${SETS:-}
export WORKFLOW WORK_ROOT OUT
export SETS="--set iterations=${ITERATIONS:-100} $SETS"
export EXTRA=${EXTRA:---no-quota}
if [ -n "${PLAN:-}" ]; then  # the optimize ran in an earlier call: its archive's plan and report, carried
  REPORT=${REPORT:-$(dirname "$PLAN")/report/report.json}
  if [ -d .raybundle ] && [ "${SMOKE:-0}" != "1" ]; then
    . benchmarks/device_env.sh need || exit 1
    if grep -q "mjx" "$WORKFLOW"; then bash benchmarks/mjx_env.sh > /dev/null 2>&1 || exit 1; fi
  fi
else
  bash benchmarks/optimize_gpu.sh
  echo "optimize exit $?"
  PLAN=$WORK_ROOT/optimize/plan.yaml; REPORT=$WORK_ROOT/optimize/report/report.json
fi
[ "${COMPARE:-1}" = "1" ] || exit 0
[ -f "$PLAN" ] || { echo "no plan written" >&2; exit 1; }
if [ "${SMOKE:-0}" != "1" ]; then . benchmarks/device_env.sh || exit 1; fi  # optimize_gpu.sh unpacked it in its own shell
TRUST=()
if grep -q "mjx" "$WORKFLOW"; then
  TRUST=(--allow-env JAX_COMPILATION_CACHE_DIR --allow-path /tmp/mjxenv --allow-path .mjxenv)
fi
# shellcheck disable=SC2086 # SETS holds several --set options
timeout --foreground -k 20 "${COMPARE_LIMIT:-220}" python3 -m rose_cli compare "$WORKFLOW" $SETS \
  --backend "$BACKEND" --plan rose="$PLAN" --rounds "${ROUNDS:-5}" --warmup 1 "${TRUST[@]}" \
  --json "$OUT/compare.json" --overwrite 2>&1 | tee "$OUT/log_compare.txt"
if [ -f "$OUT/compare.json" ] && [ -f "$REPORT" ]; then
  python3 benchmarks/optimize_compare_summary.py "$REPORT" "$OUT/compare.json" \
    -o "$OUT/optimize_compare.json"
fi
