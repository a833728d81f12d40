#!/usr/bin/env bash
# The embodied PPO GPU variant on the H200 through `rose execute --backend ray` under MPS: declared, and
# with the policy's phases exposed (`rose rewrite --do "expand act"`). The image lacks gymnasium and
# MuJoCo 3.3.0: carry `.whlcpu` (python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
# --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whlcpu
# mujoco==3.3.0 gymnasium==1.4.0 farama-notifications glfw pyopengl).
set -u
. benchmarks/device_env.sh need || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/cpusite .whlcpu/*.whl || exit 1
export PYTHONPATH=/tmp/cpusite:$PYTHONPATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m rose_cli rewrite workflows/embodied_ppo_gpu.yaml --do "expand act" -o /tmp/ppo_gpu_phases.yaml --overwrite > /dev/null
N=${N:-5}
echo "== embodied PPO GPU (declared)"; timeout 240 python3 -m rose_cli execute workflows/embodied_ppo_gpu.yaml --backend ray -n $N --out /tmp/runs/ppo_gpu 2>&1 | tail -22
echo "== embodied PPO GPU (phases exposed)"; timeout 240 python3 -m rose_cli execute workflows/embodied_ppo_gpu.yaml --plan /tmp/ppo_gpu_phases.yaml --backend ray -n $N --out /tmp/runs/ppo_gpu_phases 2>&1 | tail -22
(cd /tmp/runs && tar czf "$OUT/gpu_runs_ppo.tgz" --exclude=tb --exclude=trace.jsonl --exclude=mps .)
ls -la "$OUT"
