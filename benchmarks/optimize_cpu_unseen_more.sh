#!/bin/bash
# `rose optimize` on seven CPU workflows of shapes unlike the shipped latency_* ones (benchmarks/unseen_workflows/),
# then `rose compare` of its plan against hand-written plans, interleaved (result: benchmarks/results/
# optimize_cpu_unseen_more.json; benchmarks/optimize_cpu_unseen.sh does the same for three shipped ones).
# The hand plans are written here with `rose rewrite` (the rewrites a user would try). RUNS runs per workflow
# (default 1); outputs in $OUTDIR/<workflow><k>/ (optimize.log, report/, compare.txt, compare.json).
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=$PWD
OUTDIR=${OUTDIR:-/tmp/unseen_more}; RUNS=${RUNS:-1}; W=benchmarks/unseen_workflows; mkdir -p "$OUTDIR/hand"
hand() {  # workflow label requests...
  local wf=$1 label=$2; shift 2; local args=()
  for r in "$@"; do args+=(--do "$r"); done
  [ -f "$OUTDIR/hand/$label.yaml" ] || nice python3 -m rose_cli rewrite $W/$wf.yaml "${args[@]}" -o "$OUTDIR/hand/$label.yaml" > /dev/null
}
run() {  # workflow hand-labels...
  local wf=$1; shift
  for k in $(seq 1 "$RUNS"); do
    local d=$OUTDIR/$wf$k; mkdir -p "$d"
    timeout 900 nice python3 -m rose_cli optimize $W/$wf.yaml -o $d/plan.yaml --report $d/report --set iterations=400 --budget-s 60 --overwrite > $d/optimize.log 2>&1
    local P="--plan rose=$d/plan.yaml"
    for h in "$@"; do P="$P --plan $h=$OUTDIR/hand/$h.yaml"; done
    timeout 900 nice python3 -m rose_cli compare $W/$wf.yaml $P -r 6 --set iterations=200 --json $d/compare.json --overwrite > $d/compare.txt 2>&1
  done
}
hand two_sims ts_split2 "split step 2" "interleave step"
hand two_sims ts_split4 "split step 4" "interleave step"
hand judge jd_chain2 "split-chain generate score 2"
hand judge jd_chain4 "split-chain generate score 4"
hand actor_critic ac_fuse "fuse rollout update"
hand actor_critic ac_split2 "split rollout.step 2" "interleave rollout.step"
hand actor_critic ac_fuse_split2 "fuse rollout update" "split rollout.step 2" "interleave rollout.step"
hand actor_critic_rows acr_split2 "split rollout.step 2" "interleave rollout.step"
hand actor_critic_rows acr_time3 "split-time rollout 3"
hand actor_critic_rows acr_fuse_split2 "fuse rollout update" "split rollout.step 2" "interleave rollout.step"
hand actor_critic_rows acr_time3_split2 "split-time rollout 3" "split rollout@0.step 2" "interleave rollout@0.step" "split rollout@1.step 2" "interleave rollout@1.step" "split rollout@2.step 2" "interleave rollout@2.step"
hand chain3 c3_chain2 "split-chain generate score value 2"
hand chain3 c3_chain4 "split-chain generate score value 4"
hand chain3 c3_chain8 "split-chain generate score value 8"
hand step_loop sl_split2 "split rollout.step 2" "interleave rollout.step"
hand step_loop sl_split4 "split rollout.step 4" "interleave rollout.step"
hand chain3_gil cg_chain2 "split-chain generate score value 2"
hand chain3_gil cg_chain4 "split-chain generate score value 4"
run two_sims ts_split2 ts_split4
run judge jd_chain2 jd_chain4
run actor_critic ac_fuse ac_split2 ac_fuse_split2
run actor_critic_rows acr_split2 acr_time3 acr_fuse_split2 acr_time3_split2
run chain3 c3_chain2 c3_chain4 c3_chain8
run step_loop sl_split2 sl_split4
run chain3_gil cg_chain2 cg_chain4
echo done > "$OUTDIR/ALL_DONE"
