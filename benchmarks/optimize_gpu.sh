#!/usr/bin/env bash
# `rose optimize` on the GPU machine, in ONE device call: stage 1 (graph) and stage 2 (MPS quota of the
# process with slack) on a paper-shaped workload, within a time budget. Writes into $OUT:
#   optimize.tgz   plan.yaml (stage 1 + quotas), report/stage1.yaml (stage 1 alone), report/report.{json,md},
#                  report/timeline.svg, report/quota_curve.svg, optimize.log
# and prints the report's summary last. The training done while optimizing is checkpointed under
# /tmp/rose-optimize-run (not brought back: a 360M-parameter model and its optimizer are gigabytes).
#
# Usage (repository root; Ray from the bundle, see DEVELOPERS.md "The GPU machine"):
#   WORKFLOW=workflows/paper_mjx_vla.yaml SETS="--set iterations=100" BUDGET=300 bash benchmarks/optimize_gpu.sh
# BUDGET is --budget-s for both stages (stage 1 gets about two thirds); ROUNDS (default 1) stage-1 rounds;
# EXTRA more options (e.g. "--no-compiled", "--no-quota", "--train": training goes on with the plan in the same
# processes after the report is written -- give SETS an iteration count that leaves some, e.g. iterations=50); LIMIT a timeout for the whole command (SIGTERM, then
# SIGKILL GRACE s later: keep LIMIT + GRACE under the device call's own limit);
# TRUST the --allow-* options the workflow's processes need (default for MJX workflows: their import path
# and JAX cache variable).
#   SMOKE=1 bash benchmarks/optimize_gpu.sh          # CPU check of this script: local backend, latency workflow
# Then feed the plans to the paper table (`benchmarks/paper_table.py --row mjx:stage1=.../stage1.yaml
# --row mjx:stage1_mps=.../stage1.yaml --row mjx:rose=.../plan.yaml`) in a second call.
set -uo pipefail
OUT=${OUT:-/tmp/rose-optimize-out}
# everything is written under $WORK_ROOT/optimize and only the archive lands in $OUT: the device tool brings
# back at most 8 files from $OUT (a report alone has 5), so a second script in the same call still fits
WORK_ROOT=${WORK_ROOT:-/tmp/rose-optimize-work}
WORK=$WORK_ROOT/optimize
rm -rf "$WORK"  # this script's own output (rose optimize refuses to write over an earlier one)
mkdir -p "$WORK" "$OUT"
if [ "${SMOKE:-0}" != "1" ]; then . benchmarks/device_env.sh || exit 1; else . benchmarks/device_env.sh none; fi
if [ "${SMOKE:-0}" = "1" ]; then
  WORKFLOW=${WORKFLOW:-workflows/latency_interaction.yaml}
  SETS=${SETS:---set iterations=200}
  BACKEND=local; BUDGET=${BUDGET:-60}; LIMIT=${LIMIT:-240}
else
  WORKFLOW=${WORKFLOW:-workflows/paper_mjx_vla.yaml}
  SETS=${SETS:---set iterations=100}
  BACKEND=${BACKEND:-ray}; BUDGET=${BUDGET:-300}; LIMIT=${LIMIT:-540}
  # the MJX simulator's own import path (wheels carried in .whl), when the workload needs it
  if grep -q "mjx" "$WORKFLOW" && [ -f benchmarks/mjx_env.sh ]; then
    bash benchmarks/mjx_env.sh > "$WORK/mjx_env.log" 2>&1
    # what the MJX simulator's process needs allowed (its import path, JAX's cache): paper_workloads.py's trust
    TRUST=${TRUST:---allow-env JAX_COMPILATION_CACHE_DIR --allow-path /tmp/mjxenv --allow-path .mjxenv}
  fi
  # Meta-World: its packages (carried as .mwbundle, benchmarks/mw_bundle.sh; or installed by an earlier
  # set-up call, paper_table_gpu.sh SETUP_ONLY=1) and EGL's vendor file
  if grep -q "sim_metaworld" "$WORKFLOW" && [ -f .mwbundle/mw-site.tar.xz ]; then
    bash benchmarks/mw_env.sh > "$WORK/mw_env.log" 2>&1 || { cat "$WORK/mw_env.log"; exit 1; }
  fi
  if grep -q "sim_metaworld" "$WORKFLOW" && [ -d /tmp/mwsite ]; then
    export PYTHONPATH=/tmp/mwsite:$PYTHONPATH
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$WORK/gpu.csv" 2>&1 || true
fi
rm -rf /tmp/rose-optimize-run
# shellcheck disable=SC2086 # SETS holds several --set options
# SIGTERM at LIMIT: rose optimize stops at its next decision point and writes the plan and the report of
# what it measured (exit 130); SIGKILL GRACE seconds later if winding down takes longer. --foreground: the
# signal goes to rose alone -- without it `timeout` signals its whole process group, where Ray's GCS and
# raylet (started by rose) die of SIGTERM under the run (tested on the CPU: exit 137, no report)
timeout --foreground -k "${GRACE:-60}" "$LIMIT" python3 -m rose_cli optimize "$WORKFLOW" $SETS -o "$WORK/plan.yaml" --report "$WORK/report" \
  --out /tmp/rose-optimize-run --backend "$BACKEND" --budget-s "$BUDGET" --rounds "${ROUNDS:-1}" ${TRUST:-} ${EXTRA:-} \
  > "$WORK/optimize.log" 2>&1
CODE=$?
echo "rose optimize exit $CODE" >> "$WORK/optimize.log"
tar -czf "$OUT/optimize.tgz" -C "$WORK_ROOT" optimize
tail -n 25 "$WORK/optimize.log"
if [ -f "$WORK/report/report.md" ]; then sed -n '1,12p' "$WORK/report/report.md"; fi
exit $CODE
