#!/usr/bin/env bash
# Extra probes, second batch: SIGINT/SIGTERM sent to rose optimize itself (timeout(1) reports 124, hiding rose's
# exit status), compare with a --set that changes what the plan computes, validate with a non-number float param.
# Run from the repository root, after extracting the archived sweep's folder: `git archive results-archive benchmarks/results/optimize_cpu_unseen_2026-12-05d | tar -x` (repository root) first.
D=benchmarks/results/optimize_cpu_unseen_2026-12-05d
UE=${UE:-/tmp/sw4/ue3}; rm -rf $UE; mkdir -p $UE
export PYTHONPATH=$PWD
for sig in INT TERM; do
  echo "### sig$sig after 8 s"
  echo "\$ rose optimize $D/y6_unbalanced.yaml --set iterations=300 -o $UE/$sig.yaml --budget-s 75 -q & sleep 8; kill -$sig \$!"
  t0=$(date +%s.%N)
  python3 -m rose_cli optimize $D/y6_unbalanced.yaml --set iterations=300 -o $UE/$sig.yaml --budget-s 75 -q > $UE/$sig.log 2>&1 &
  pid=$!; sleep 8; kill -$sig $pid; wait $pid; rc=$?
  grep -v '^\s*$' $UE/$sig.log | tail -n 12
  printf '[exit %s, %.1f s]\n' "$rc" "$(echo "$(date +%s.%N) - $t0" | bc)"
  echo "written: $(ls $UE/$sig* 2>&1 | tr '\n' ' ')"; echo
done
run() { echo "### $1"; shift; echo "\$ rose $*"; local t0=$(date +%s.%N); timeout 300 python3 -m rose_cli "$@" 2>&1 | grep -v '^\s*$' | tail -n 30; local rc=${PIPESTATUS[0]}; printf '[exit %s, %.1f s]\n\n' "$rc" "$(echo "$(date +%s.%N) - $t0" | bc)"; }
run compare_set_changes_rows compare $D/y6_unbalanced.yaml --set n=40 --set iterations=300 --plan $D/plans/y6_unbalanced.plan.yaml --rounds 1
run compare_set_matches compare $D/y6_unbalanced.yaml --set iterations=300 --plan $D/plans/y6_unbalanced.plan.yaml --rounds 1
run validate_set_float_text validate $D/y6_unbalanced.yaml --set pi_fixed=fast
run execute_set_float_text execute $D/y6_unbalanced.yaml --set pi_fixed=fast -n 2 --out $UE/r_float -q
