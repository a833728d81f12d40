#!/usr/bin/env bash
# Fault runs on the GPU machine (issue 7), each a real `rose execute --backend ray` under MPS:
#   kernel      a device-side assert in one of two colocated MPS clients -> both restarted, run continues
#   kernel-nomps the same without MPS -> only the faulting process restarted
#   kill        SIGKILL of a GPU process mid-call under MPS -> restarted from the last checkpoint
#   hang        a call that never returns -> watchdog, exit 4, stacks
#   driver-kill the driver SIGKILLed mid-run -> no Ray/MPS/GPU process left behind
# Writes $OUT/gpu_faults.tgz: <case>/ with stdout+stderr, exit code, wall time, recoveries.jsonl, metrics.jsonl.
set -u
. benchmarks/device_env.sh need || exit 1
OUT=${OUT:-/tmp/out}; R=/tmp/gpu_faults; mkdir -p "$R" "$OUT"
run_case() {  # name, extra args...
  local name=$1; shift
  local dir="$R/$name"; mkdir -p "$dir"; rm -f /tmp/rose-fault-$name
  local t0=$(date +%s%N)
  timeout 120 python3 -m rose_cli execute workflows/gpu_fault.yaml --backend ray --checkpoint-every 1 \
      --out /tmp/runs/fault_$name --set marker=/tmp/rose-fault-$name "$@" > "$dir/log.txt" 2>&1
  local rc=$?
  echo "{\"case\": \"$name\", \"exit_code\": $rc, \"wall_ms\": $(( ($(date +%s%N) - t0) / 1000000 ))}" > "$dir/result.json"
  cp /tmp/runs/fault_$name/recoveries.jsonl /tmp/runs/fault_$name/metrics.jsonl "$dir/" 2>/dev/null
  echo "== $name: exit $rc"; tail -8 "$dir/log.txt"
}
run_case kernel --set kind=kernel
run_case kernel-nomps --set kind=kernel --no-mps
run_case kill --set kind=kill
run_case hang --set kind=hang --call-timeout 20
# driver killed mid-run: nothing may be left behind
dir="$R/driver-kill"; mkdir -p "$dir"
python3 -m rose_cli execute workflows/gpu_fault.yaml --backend ray --set kind=none --set iterations=100000 \
    --out /tmp/runs/fault_driver > "$dir/log.txt" 2>&1 &
DRV=$!
for i in $(seq 1 60); do grep -q "^it " "$dir/log.txt" 2>/dev/null && break; sleep 1; done
nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader > "$dir/gpu_procs_before.txt"
ps -eo pid,args | grep -E "ray::|raylet|gcs_server|nvidia-cuda-mps" | grep -v grep > "$dir/procs_before.txt"
kill -9 $DRV; sleep 20
nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader > "$dir/gpu_procs_after.txt"
ps -eo pid,args | grep -E "ray::|raylet|gcs_server|nvidia-cuda-mps" | grep -v grep > "$dir/procs_after.txt"
echo "== driver-kill: before $(wc -l < "$dir/procs_before.txt") procs / $(wc -l < "$dir/gpu_procs_before.txt") GPU procs; after $(wc -l < "$dir/procs_after.txt") / $(wc -l < "$dir/gpu_procs_after.txt")"
cat "$dir/procs_after.txt" "$dir/gpu_procs_after.txt"
(cd /tmp && tar czf "$OUT/gpu_faults.tgz" gpu_faults)
