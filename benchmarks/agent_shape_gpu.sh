#!/usr/bin/env bash
# Issue 62's shape check, before any plan is built: the declared multi-turn agent workflow
# (workflows/llm_agent_tools_gpu.yaml) for one warm-up and up to TIMED (default 3) timed iterations, within
# LIMIT (default 150) seconds of wall time from this script's start, hard. It writes $OUT/agent_shape.json
# (benchmarks/agent_shape.py says every field): the share of the declared iteration spent in generation
# (turn.act; the issue asks >= 40%) and in tool wait (turn.tool; >= 30%), `shape_ok`, and the declared
# graph's lower bound with unlimited overlap -- the larger of its critical path at the measured call times
# (the reorder bound of `rose optimize`'s report) and its busiest process's busy time (the bound for row-group
# splits) -- with the speedup it leaves (`speedup_bound`).
#
#   bash benchmarks/agent_shape_gpu.sh                 # on the GPU machine (carries .raybundle)
#   DEVICE=cpu bash benchmarks/agent_shape_gpu.sh      # the CPU variant, small settings (seconds)
#
# No run directory: the GPU variant's final checkpoint and export (weights and optimizer state) would cost
# more than the limit leaves. An iteration is begun only when the last one's time still fits; the JSON is
# rewritten after each, so a run stopped at the limit still leaves what it measured.
set -u
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-150}
TIMED=${TIMED:-3}
WARMUP=${WARMUP:-1}   # WARMUP=0: the first iteration is timed too (when the limit leaves room for one or two)
SETS=(${SETS:-})   # extra --set NAME=VALUE pairs
if [ "$DEVICE" = cpu ]; then
  WF=${WF:-workflows/llm_agent_tools.yaml}
  [ -n "${SETS[*]}" ] || SETS=(--set prompts=4 --set k=4 --set tool_ms_mean=2 --set tool_ms_p99=20 --set tool_timeout_ms=15)
  BACKEND=${BACKEND:-local}
  . benchmarks/device_env.sh none
else
  WF=${WF:-workflows/llm_agent_tools_gpu.yaml}
  BACKEND=${BACKEND:-ray}
  . benchmarks/device_env.sh need || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
export RAY_DEDUP_LOGS=0
set -o pipefail
left=$((LIMIT - SECONDS))   # (what unpacking the bundle took counts)
[ "$left" -ge 30 ] || { echo "only ${left} s of the ${LIMIT} s limit left after the set-up: not started" >&2; exit 1; }
timeout -k 5 $((left - 5)) python3 benchmarks/agent_shape.py "$WF" "${SETS[@]}" --backend "$BACKEND" --warmup "$WARMUP" \
  --timed "$TIMED" --limit-s $((left - 5)) --out "$OUT/agent_shape.json" 2>&1 | tee "$OUT/log_agent_shape.txt"
rc=$?
[ -f "$OUT/agent_shape.json" ] || echo "no $OUT/agent_shape.json: not one iteration completed within ${LIMIT} s" >&2
echo "wall: ${SECONDS} s (limit ${LIMIT} s)"
exit $rc
