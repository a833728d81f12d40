#!/usr/bin/env bash
# MJX (GPU physics) on the H200: install the carried wheels (.whl, see mjx_env.sh), measure env-steps/s,
# and run workflows/embodied_ppo_mjx.yaml through `rose execute` (local backend: the sim's JAX and the
# policy's torch in one process; the Ray backend would need the Ray bundle too, over the transfer limit).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BENCH_ENVS="256 2048 8192" bash benchmarks/mjx_env.sh --bench 2>&1 | tail -12
export PYTHONPATH=/tmp/mjxenv:$PWD:${PYTHONPATH:-} XLA_PYTHON_CLIENT_PREALLOCATE=false MUJOCO_GL=disable PYTHONUNBUFFERED=1
python3 -c "import lark, jsonschema" 2>/dev/null || echo "lark/jsonschema missing"
timeout 300 python3 -m rose_cli execute workflows/embodied_ppo_mjx.yaml --backend local -n 4 --out /tmp/runs/ppo_mjx --allow-path /tmp/mjxenv --allow-path .mjxenv --allow-env JAX_COMPILATION_CACHE_DIR 2>&1 | tail -24
(cd /tmp/runs && tar czf "$OUT/gpu_runs_mjx.tgz" --exclude=tb --exclude=trace.jsonl .)
ls -la "$OUT"
