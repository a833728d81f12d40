#!/usr/bin/env bash
# Extra probes (fourth sweep): the workflow's own iteration count (60, no --set), and SIGINT / SIGTERM during
# rose optimize. Run from the repository root, after extracting
# the archived sweep's folder: `git archive results-archive benchmarks/results/optimize_cpu_unseen_2026-12-05d | tar -x` (repository root) first.
D=benchmarks/results/optimize_cpu_unseen_2026-12-05d
UE=${UE:-/tmp/sw4/ue2}; rm -rf $UE; mkdir -p $UE
export PYTHONPATH=$PWD
run() { echo "### $1"; shift; echo "\$ $*"; local t0=$(date +%s.%N); "$@" 2>&1 | grep -v '^\s*$' | tail -n 30; local rc=${PIPESTATUS[0]}; printf '[exit %s, %.1f s]\n\n' "$rc" "$(echo "$(date +%s.%N) - $t0" | bc)"; }
run default_iterations timeout 300 python3 -m rose_cli optimize $D/y2_once_and_five.yaml -o $UE/default.yaml --budget-s 75 -q
run sigint_after_8s timeout -s INT 8 python3 -m rose_cli optimize $D/y6_unbalanced.yaml --set iterations=300 -o $UE/int.yaml --budget-s 75 -q
echo "after SIGINT: $(ls $UE/int* 2>&1 | tr '\n' ' ')"; echo
run sigterm_after_8s timeout -s TERM 8 python3 -m rose_cli optimize $D/y6_unbalanced.yaml --set iterations=300 -o $UE/term.yaml --budget-s 75 -q
echo "after SIGTERM: $(ls $UE/term* 2>&1 | tr '\n' ' ')"; echo
