#!/usr/bin/env bash
# One device call on the H200: the paper table (benchmarks/paper_table.py) for one workload, with every
# package it needs set up first. Results come back in $OUT: paper_table_<workload>/ (the JSON and the
# timeline PNGs), log_<workload>.txt, runs_<workload>.tgz (metrics, nodes, Perfetto traces of every run).
# Merge the JSONs of several calls into benchmarks/results/paper_table.json with
#   python3 benchmarks/paper_table.py --merge A/paper_table.json B/paper_table.json
#   then: python3 benchmarks/paper_table_rows.py (a merge replaces whole workloads: it refills the optimizer's rows)
#
#   WORKLOAD=mjx bash benchmarks/paper_table_gpu.sh [paper_table.py options, e.g. --configs declared,pipe2]
# carries: mjx: .raybundle + .mjxbundle (benchmarks/mjx_bundle.sh) -- one call, ~45 MB.
#          llm, llm_longtail: .raybundle. llm_longtail (issue 45; ~34 s an iteration on an H100, docs/results.md):
#            LIMIT=540 WORKLOAD=llm_longtail bash benchmarks/paper_table_gpu.sh --session --session-timeout 480 \
#              --rounds 4 --warmup 0 --iterations 1 --configs declared,chain4
#          metaworld: .raybundle + .mwbundle (benchmarks/mw_bundle.sh packs the wheels and debs below, ~15 MB)
#            -- one call, ~44 MB. Without .mwbundle: first a call carrying .whlmw .whlcpu .gl that runs
#            `WORKLOAD=metaworld SETUP_ONLY=1 bash benchmarks/paper_table_gpu.sh` (installs into /tmp/mwsite,
#            unpacks the EGL debs), then, within the 30 s the machine stays warm, this script carrying .raybundle.
#            The wheels (~46 MB with the debs; with Ray's bundle they pass the 64 MiB a call carries):
#              pip download --no-deps -d .whlmw metaworld==3.1.1 PyOpenGL==3.1.10 imageio glfw==2.11.0 \
#                --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64
#              pip download --no-deps -d .whlcpu mujoco==3.3.0 gymnasium==1.4.0 farama-notifications cloudpickle \
#                --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64
#              the .gl debs: the device README (libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 libvulkan1)
#            (gymnasium's MuJoCo renderer imports glfw, and Meta-World's EGL context PyOpenGL, at import time:
#            without them the simulator's process fails to start.) The same set-up serves `rose optimize`
#            on Meta-World (benchmarks/optimize_gpu.sh with PYTHONPATH=/tmp/mwsite).
set -u
WORKLOAD=${WORKLOAD:-mjx}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0
if [ "$WORKLOAD" = metaworld ] && [ -d .whlmw ]; then   # the set-up call (its wheels do not fit with Ray's)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/mwsite .whlmw/*.whl .whlcpu/*.whl || exit 1
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  [ "${SETUP_ONLY:-0}" = 1 ] && { echo "Meta-World installed in /tmp/mwsite"; exit 0; }
fi
. benchmarks/device_env.sh need || exit 1
case "$WORKLOAD" in
  mjx) bash benchmarks/mjx_env.sh || exit 1 ;;
  metaworld)
    if [ -f .mwbundle/mw-site.tar.xz ]; then bash benchmarks/mw_env.sh || exit 1; fi
    [ -d /tmp/mwsite ] || { echo "run the Meta-World set-up call first (see the header)" >&2; exit 1; }
    export PYTHONPATH=/tmp/mwsite:$PYTHONPATH
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ;;
esac
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
set -o pipefail
# LIMIT: seconds for the table (default 540, inside the device's 600-s call) so that the archive below is
# still written; with --session the session itself stops a minute earlier, keeping its finished rounds
LIMIT=${LIMIT:-540}
extra=()
case " $* " in *" --session "*) case " $* " in *" --session-timeout "*) ;; *) extra=(--session-timeout $((LIMIT - 60)));; esac;; esac
timeout "$LIMIT" python3 benchmarks/paper_table.py --workloads "$WORKLOAD" --results "$OUT/paper_table_$WORKLOAD" \
  --runs /tmp/paper_runs "${extra[@]}" "$@" 2>&1 | tee "$OUT/log_$WORKLOAD.txt"
code=$?
(cd /tmp/paper_runs 2>/dev/null && tar czf "$OUT/runs_$WORKLOAD.tgz" --exclude=tb --exclude=trace.jsonl \
  --exclude=mps --exclude=checkpoints .)
exit $code
