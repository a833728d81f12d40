#!/usr/bin/env bash
# Issue 62's benchmark on the multi-turn agent workload (workflows/llm_agent_tools_gpu.yaml): in one
# interleaved `rose compare` run (ROUNDS >= 3), the turn-synchronous declared workflow (every row decodes,
# then every row's tool calls, then the next turn), a per-sample asynchronous configuration and rose's plan.
#
#   bash benchmarks/agent_tools_gpu.sh                      # on the GPU machine (carries .raybundle)
#   DEVICE=cpu bash benchmarks/agent_tools_gpu.sh           # a CPU smoke run of the CPU variant, small settings
#
# The plans, both rewrites of the declared workflow (so one set of workers runs all three, interleaved):
# - rose_plan: `split-chain turn finish G` (G row groups of prompts, default 4), every finish@g moved after
#   the last group's turn loop, and the groups' turn loops interleaved: group g's tool calls run while
#   another group decodes, with the declared tokens (tests/examples/test_agent_tools.py).
# - per_sample: the same with one group per prompt (ASYNC_G, default: every prompt), the finest grouping the
#   language has -- each prompt's samples go decode -> tool -> decode on their own, the way a verl or SkyRL
#   agent loop runs a sample as its own coroutine. Unlike those systems' inference server, the agent
#   component decodes one group's call at a time (no batching across groups' calls), so on the GPU this is a
#   lower bound for that configuration, said as such beside its row.
# Check the declared shape first (generation >= 40%, tool wait >= 30% of the iteration: the compare JSON's
# per-node times time/turn.act and time/turn.tool of the declared rows).
set -u
WF=${WF:-}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LIMIT=${LIMIT:-560}
ROUNDS=${ROUNDS:-3}
G=${G:-4}
SETS=(${SETS:-})   # extra --set NAME=VALUE pairs, e.g. SETS="--set prompts=32"
if [ "$DEVICE" = cpu ]; then
  WF=${WF:-workflows/llm_agent_tools.yaml}
  [ -n "${SETS[*]}" ] || SETS=(--set prompts=4 --set k=4 --set tool_ms_mean=2 --set tool_ms_p99=20 --set tool_timeout_ms=15)
  BACKEND=${BACKEND:-local}
else
  WF=${WF:-workflows/llm_agent_tools_gpu.yaml}
  BACKEND=${BACKEND:-ray}
fi
export RAY_DEDUP_LOGS=0
if [ "$DEVICE" = cuda ]; then . benchmarks/device_env.sh need || exit 1; else . benchmarks/device_env.sh none; fi
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
set -o pipefail
# the number of prompts (row groups of the per-sample configuration): the --set's, else the workflow's
PROMPTS=$(python3 - "$WF" "${SETS[@]}" <<'EOF'
import sys
from rose_dsl import load_workflow
from rose_dsl.cli import set_overrides
print(load_workflow(sys.argv[1], set_overrides([a for a in sys.argv[2:] if a != "--set"])).params["prompts"])
EOF
) || exit 1
ASYNC_G=${ASYNC_G:-$PROMPTS}

# the requests of a plan with $1 row groups whose turn loops take turns
grouped() {
  local n=$1 req=(--do "split-chain turn finish $1") il="interleave"
  for g in $(seq 0 $((n - 2))); do req+=(--do "rewire finish@$g after turn@$((n - 1))"); done
  for g in $(seq 0 $((n - 1))); do il+=" turn@$g"; done
  printf '%s\n' "${req[@]}" --do "$il"
}
write_plan() {  # NAME GROUPS
  mapfile -t req < <(grouped "$2")
  python3 -m rose_cli rewrite "$WF" "${SETS[@]}" "${req[@]}" -o "$OUT/$1.yaml" --overwrite > "$OUT/$1.err" 2>&1 \
    || { cat "$OUT/$1.err" >&2; exit 1; }
}
write_plan rose_plan "$G"
write_plan per_sample "$ASYNC_G"
. benchmarks/device_out.sh   # pack_runs, pack_plans: what comes back from the device
[ "$DEVICE" = cuda ] && trap pack_plans EXIT

# what `rose compare` may train: one warm-up iteration, and per round up to two iterations of each of the three
need=$((1 + ROUNDS * 3 * 2))
timeout "$LIMIT" python3 -m rose_cli compare "$WF" "${SETS[@]}" --set iterations=$need --backend "$BACKEND" \
  --plan "rose_plan=$OUT/rose_plan.yaml" --plan "per_sample=$OUT/per_sample.yaml" --rounds "$ROUNDS" \
  --json "$OUT/agent_compare.json" --runs /tmp/agent_runs --overwrite 2>&1 | tee "$OUT/log_agent_compare.txt"
rc=$?
[ "$DEVICE" = cuda ] && pack_runs /tmp/agent_runs
exit $rc
