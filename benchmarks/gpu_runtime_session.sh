#!/usr/bin/env bash
# One device call that exercises the runtime on the H200 (see DEVELOPERS.md): MPS + SM quotas +
# activity sampling (gpu_runtime_check.py), a two-component workflow under MPS with two quotas through
# `rose execute --backend ray`, and the dispatch benchmark. Results land in $OUT (fetched into
# benchmarks/results/ by the caller).
set -u
. benchmarks/device_env.sh need || exit 1
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import ray, lark, jsonschema, typer, rich, yaml, torch; print('ray', ray.__version__, 'torch', torch.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
echo "== gpu_runtime_check"; timeout 200 python3 benchmarks/gpu_runtime_check.py "$OUT/gpu_runtime_check.json" --quotas 10,25,50,75,91,100 --activity-quotas 100,25 --seconds 2 2>&1 | tail -25
echo "== two components under MPS"; timeout 240 python3 -m rose_cli execute workflows/gpu_two_component.yaml --backend ray --out /tmp/mps_run -n 4 2>&1 | tail -20
cp /tmp/mps_run/trace.json "$OUT/mps_two_component.trace.json" 2>/dev/null; cp /tmp/mps_run/metrics.jsonl "$OUT/mps_two_component.metrics.jsonl" 2>/dev/null
python3 - <<'PY'
import json, os
out = os.environ.get("OUT", "/tmp/out")
try:
    recs = [json.loads(l) for l in open("/tmp/mps_run/trace.jsonl")][1:]
    print("records", len(recs), "pids", sorted({r.get("pid") for r in recs if isinstance(r, dict)}))
except Exception as exc:
    print("trace read failed", exc)
PY
echo "== dispatch"; timeout 200 python3 benchmarks/dispatch.py --calls 200 --rounds 7 --out "$OUT/dispatch.json" 2>&1 | tail -8
ls -la "$OUT"
