#!/usr/bin/env bash
# Second device call: GPM without MPS, dispatch with the compiled backend, the embodied PPO GPU variant
# (declared, and with the policy's phases exposed), and the LLM GRPO GPU variant, all through
# `rose execute --backend ray` under MPS. Results in $OUT.
set -u
. benchmarks/device_env.sh need || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "== gpm check (no MPS)"; timeout 60 python3 benchmarks/gpm_check.py "$OUT/gpm_check.json" 2>&1 | tail -3
echo "== dispatch"; timeout 240 python3 benchmarks/dispatch.py --calls 200 --cg-calls 100 --rounds 7 --out "$OUT/dispatch.json" 2>&1 | tail -8
rose() { python3 -m rose_cli "$@"; }
rose rewrite workflows/embodied_ppo_gpu.yaml --do "expand act" -o /tmp/ppo_gpu_phases.yaml --overwrite > /dev/null
echo "== embodied PPO GPU (declared)"; timeout 200 python3 -m rose_cli execute workflows/embodied_ppo_gpu.yaml --backend ray -n 4 --out /tmp/runs/ppo_gpu 2>&1 | grep -v "^it " | tail -22
echo "== embodied PPO GPU (phases exposed)"; timeout 200 python3 -m rose_cli execute workflows/embodied_ppo_gpu.yaml --plan /tmp/ppo_gpu_phases.yaml --backend ray -n 4 --out /tmp/runs/ppo_gpu_phases 2>&1 | grep -v "^it " | tail -22
echo "== LLM GRPO GPU"; timeout 240 python3 -m rose_cli execute workflows/llm_grpo_gpu.yaml --backend ray -n 6 --out /tmp/runs/llm_gpu 2>&1 | tail -16
(cd /tmp/runs && tar czf "$OUT/gpu_runs.tgz" --exclude=tb --exclude=trace.jsonl --exclude=mps .)
ls -la "$OUT"
