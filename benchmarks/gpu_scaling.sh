#!/usr/bin/env bash
# Issue 8's run on a machine with several GPUs: embodied PPO (workflows/embodied_ppo_gpu.yaml, 256 envs and
# one policy + trainer per replica: a fixed per-GPU workload) on 1 GPU, on 2 GPUs colocated (replicas=2:
# each GPU holds one replica's policy and trainer; gradients all-reduced over NCCL) and on 2 GPUs
# disaggregated (one replica, the policy on GPU 0 and the trainer on GPU 1). N iterations each; metrics,
# nodes and traces in $OUT/scaling.tgz. Needs .raybundle and .whlcpu carried.
set -u
. benchmarks/device_env.sh need || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/cpusite .whlcpu/*.whl || exit 1
export PYTHONPATH=/tmp/cpusite:$PYTHONPATH NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
N=${N:-3}
nvidia-smi --query-gpu=index,name --format=csv,noheader
run() {
  local name=$1; shift
  echo "== $name $*"
  timeout 170 python3 -m rose_cli execute workflows/embodied_ppo_gpu.yaml --backend ray -n $N --out /tmp/runs/$name "$@" \
      2>&1 | grep -E "component|^it |done|error|Error|warning" | cut -c1-260 | tail -14
}
run scale_1gpu
run scale_2gpu_colocated --set replicas=2
run scale_2gpu_disaggregated --set trainer_gpu=1
(cd /tmp/runs && tar czf "$OUT/scaling.tgz" --exclude=tb --exclude=trace.jsonl --exclude=mps --exclude=checkpoints scale_*)
