#!/bin/bash
# acceptance: rose optimize on each new workflow, then rose compare against the hand plans
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=$PWD
run() {  # name workflow iterations hand-plans...
  local name=$1 wf=$2 its=$3; shift 3
  for i in $@; do :; done
  for k in 1 2 3; do
    [ "$name" = ppo ] && [ $k = 1 ] && [ -f /tmp/s44/opt/ppo1.yaml ] || \
      timeout 900 nice python3 -m rose_cli optimize $wf -o /tmp/s44/opt/${name}$k.yaml --set iterations=$its --overwrite > /tmp/s44/opt/${name}$k.log 2>&1
    local P="--plan rose=/tmp/s44/opt/${name}$k.yaml"
    for h in "$@"; do P="$P --plan ${h##*/}=$h"; done
    timeout 900 nice python3 -m rose_cli compare $wf $P -r 6 --set iterations=120 --json /tmp/s44/opt/${name}${k}_cmp.json --overwrite > /tmp/s44/opt/${name}${k}_cmp.txt 2>&1
  done
}
run ppo workflows/latency_ppo_trainer.yaml 400 /tmp/s44/ppo_split_rollout_step_2_interleave_rollout_step.yaml /tmp/s44/ppo_fuse_rollout_update_split_rollout_step_2_interleave_rollout_step.yaml
run trap workflows/latency_gil_trap.yaml 400 /tmp/s44/trap_split_epoch_step_2_interleave_epoch_step.yaml /tmp/s44/trap_fuse_epoch_update.yaml
run chain workflows/latency_rlhf_chain.yaml 600 /tmp/s44/chain_sc2.yaml /tmp/s44/chain_sc4.yaml
echo done > /tmp/s44/opt/ALL_DONE
