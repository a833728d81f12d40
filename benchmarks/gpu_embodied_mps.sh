#!/usr/bin/env bash
# Embodied PPO on the H200 through `rose execute --backend ray` with the policy's phases exposed, under MPS
# with SM quotas (issue 5): QUOTAS (policy/trainer, default "100/100 50/50 75/25"), N iterations each; per-node
# durations and SM activity (GPM, polled every >=100 ms) in nodes.json, the trace in trace.json.
# Needs .raybundle and .whlcpu (mujoco 3.3.0, gymnasium) carried.
set -u
. benchmarks/device_env.sh need || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/cpusite .whlcpu/*.whl || exit 1
export PYTHONPATH=/tmp/cpusite:$PYTHONPATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
N=${N:-5}
for q in ${QUOTAS:-"100/100 50/50 75/25"}; do
  q=${q/\// }
  set -- $q; name=ppo_gpu_mps_p$1_t$2
  echo "== $name"
  python3 -m rose_cli rewrite workflows/embodied_ppo_gpu.yaml --do "expand act" --set policy_quota=$1 \
      --set trainer_quota=$2 -o /tmp/$name.yaml --overwrite > /dev/null || exit 1
  timeout 150 python3 -m rose_cli execute workflows/embodied_ppo_gpu.yaml --plan /tmp/$name.yaml --backend ray \
      -n $N --out /tmp/runs/$name 2>&1 | tail -24
done
(cd /tmp/runs && tar czf "$OUT/ppo_mps.tgz" --exclude=tb --exclude=trace.jsonl --exclude=mps --exclude=checkpoints ppo_gpu_mps_*)
