#!/bin/bash
# Issue 44's acceptance on the CPU: `rose optimize` on each of three workflows it was not developed on, three
# runs each, then `rose compare` of its plan against the hand-written plans (benchmarks/plans/unseen/), interleaved.
# Outputs go to $OUTDIR (default /tmp/s44/opt), one folder per run; `python3 benchmarks/optimize_cpu_unseen_summary.py DIR` prints the
# table and writes DIR/summary.json (the canonical copy: benchmarks/results/optimize_cpu_unseen.json).
# Run it on a quiet machine: the runs of 2026-12-06 (load 15-50) had spreads of 50-450%.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=$PWD
OUTDIR=${OUTDIR:-/tmp/s44/opt}; mkdir -p "$OUTDIR"
run() {  # name workflow iterations hand-plans...
  local name=$1 wf=$2 its=$3; shift 3
  for k in 1 2 3; do
    local d=$OUTDIR/${name}$k; mkdir -p "$d"
    timeout 900 nice python3 -m rose_cli optimize $wf -o $d/plan.yaml --report $d/report --set iterations=$its --overwrite > $d/optimize.log 2>&1
    local P="--plan rose=$d/plan.yaml"
    for h in "$@"; do P="$P --plan ${h##*/}=$h"; done
    timeout 900 nice python3 -m rose_cli compare $wf $P -r 6 --set iterations=120 --json $d/compare.json --overwrite > $d/compare.txt 2>&1
  done
}
run ppo workflows/latency_ppo_trainer.yaml 400 benchmarks/plans/unseen/ppo_split_rollout_step_2_interleave_rollout_step.yaml benchmarks/plans/unseen/ppo_fuse_rollout_update_split_rollout_step_2_interleave_rollout_step.yaml
run trap workflows/latency_gil_trap.yaml 400 benchmarks/plans/unseen/trap_split_epoch_step_2_interleave_epoch_step.yaml benchmarks/plans/unseen/trap_fuse_epoch_update.yaml
run chain workflows/latency_rlhf_chain.yaml 600 benchmarks/plans/unseen/chain_sc2.yaml benchmarks/plans/unseen/chain_sc4.yaml
echo done > $OUTDIR/ALL_DONE
