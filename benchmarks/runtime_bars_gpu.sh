#!/usr/bin/env bash
# One device call on the H200 for the runtime's performance bars (issue 13) and the quota self-check at
# every level (issue 16), each part under its own time limit so that one slow part cannot take the others'
# results with it. Writes into $OUT:
#   dispatch.json            benchmarks/dispatch.py: no-op dependent calls, rose's backends vs bare Ray
#   quota_safety_levels.json benchmarks/quota_safety_levels.py: the MPS quota self-check, 10%..100%
#   call_overhead.json       benchmarks/call_overhead.py: a real act/step direct vs through rose
#   quota_nan_20/            (PARTS=... nan20) benchmarks/quota_nan_root_cause.py at 100/20/10%: which op is
#                            non-finite at 20%, where the GEMM check passes
#   *.log                    each part's output
# Usage (repository root, carrying .raybundle -- built with gymnasium: `bash ../shared/tools/ray-bundle.sh
# 2.60.0 gymnasium==1.4.0 farama-notifications cloudpickle` -- and .mjxbundle):
#   bash benchmarks/runtime_bars_gpu.sh            # PARTS="dispatch quota overhead" by default
# call_overhead.py steps embodied_ppo_gpu's Reacher (gymnasium + MuJoCo) in its own process; the GPU image
# has neither, so that part takes MuJoCo from the MJX import dir (benchmarks/mjx_env.sh: mujoco 3.17, not
# the project's 3.3.0 -- a timing benchmark, not a bit-for-bit run).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. benchmarks/device_env.sh need || exit 1
code=0
for part in ${PARTS:-dispatch quota overhead}; do
  start=$(date +%s)
  case "$part" in
    dispatch) timeout "${DISPATCH_S:-90}" python3 benchmarks/dispatch.py --calls 200 --cg-calls 100 --rounds 5 \
                --out "$OUT/dispatch.json" > "$OUT/dispatch.log" 2>&1 ;;
    quota) timeout "${QUOTA_S:-120}" python3 benchmarks/quota_safety_levels.py \
             --out "$OUT/quota_safety_levels.json" > "$OUT/quota_safety_levels.log" 2>&1 ;;
    overhead) bash benchmarks/mjx_env.sh > "$OUT/call_overhead.log" 2>&1 &&
              PYTHONPATH=/tmp/mjxenv:$PYTHONPATH timeout "${OVERHEAD_S:-240}" python3 benchmarks/call_overhead.py \
                --rounds 3 --out "$OUT/call_overhead.json" >> "$OUT/call_overhead.log" 2>&1 ;;
    nan20) bash benchmarks/mjx_env.sh > "$OUT/quota_nan_20.log" 2>&1 &&   # the replay's capture steps Reacher
           PYTHONPATH=/tmp/mjxenv:$PYTHONPATH timeout "${NAN_S:-240}" python3 benchmarks/quota_nan_root_cause.py \
             "$OUT/quota_nan_20" --quick --quotas 100,20,10 >> "$OUT/quota_nan_20.log" 2>&1 ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
  rc=$?
  echo "$part: exit $rc in $(( $(date +%s) - start )) s"
  case "$part" in quota) log=quota_safety_levels ;; overhead) log=call_overhead ;; nan20) log=quota_nan_20 ;; *) log=dispatch ;; esac
  tail -n 25 "$OUT/$log.log"
  [ $rc -ne 0 ] && code=$rc
done
exit $code
