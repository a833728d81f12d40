#!/usr/bin/env bash
# GPM probe (raw pynvml) and the dispatch benchmark again (compiled backend after the single-reader change).
set -u
. benchmarks/device_env.sh need || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 60 python3 benchmarks/gpm_probe.py "$OUT/gpm_probe.json" 2>&1 | tail -40
timeout 240 python3 benchmarks/dispatch.py --calls 200 --cg-calls 100 --rounds 7 --out "$OUT/dispatch.json" 2>&1 | tail -7
