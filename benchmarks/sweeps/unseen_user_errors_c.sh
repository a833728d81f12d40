#!/bin/bash
# Runs each user-error case from the repository root; prints the command, its output (stdout+stderr) and exit code.
cd "$(dirname "$0")/../.." || exit 1
# The cases are in the archived sweep's folder: `git archive results-archive benchmarks/results/optimize_cpu_unseen_2026-12-05c | tar -x` (repository root) first.
export PYTHONPATH=$PWD
D=benchmarks/results/optimize_cpu_unseen_2026-12-05c
E=$D/user_errors
T=/tmp/sw3/ue; rm -rf $T; mkdir -p $T
r() { echo "\$ rose $*"; timeout 300 python3 -m rose_cli "$@" 2>&1 | grep -v '^\s*$' | head -40; echo "[exit ${PIPESTATUS[0]}]"; echo; }
r validate $E/e1_collect_typo.yaml
r execute $E/e1_collect_typo.yaml -n 2 --out $T/r1 -q
r rewrite $D/x2_two_consumers.yaml --do "split stpe 2" -o $T/p2.yaml
r rewrite $D/x2_two_consumers.yaml --do "split-chain step.act step.nosuch 2" -o $T/p2b.yaml
r rewrite $D/x4_param_count.yaml --do "split-time episode 5" -o $T/p2c.yaml
r rewrite $D/x4_param_count.yaml --do "split episode.step 7" -o $T/p2d.yaml
r rewrite $D/x4_param_count.yaml --do "split episode.step 0" -o $T/p2e.yaml
r execute $D/x2_two_consumers.yaml --set stepz=3 -n 2 --out $T/r3 -q
r optimize $D/x2_two_consumers.yaml --set stepz=3 -o $T/p3.yaml -q
r execute $D/x2_two_consumers.yaml --set n=abc -n 2 --out $T/r3b -q
r execute $D/x2_two_consumers.yaml --plan $D/plans/x5_eval_after_update.plan.yaml -n 2 --out $T/r4 -q
r execute $D/x4_param_count.yaml --plan $D/plans/x4_param_count__episodes1.plan.yaml -n 2 --out $T/r4b -q
r validate $E/e5_negative_count.yaml
r execute $E/e5_negative_count.yaml -n 2 --out $T/r5 -q
r execute $D/x4_param_count.yaml --set steps=-2 -n 2 --out $T/r5b -q
r optimize $D/x4_param_count.yaml --set episodes=-1 --set iterations=300 -o $T/p5c.yaml -q
r execute $D/x4_param_count.yaml --set episodes=0 -n 2 --out $T/r6 -q
r validate $E/e7_wrong_batch_size.yaml
r execute $E/e7_wrong_batch_size.yaml -n 2 --out $T/r7 -q
r validate $E/e8_collect_bad_port.yaml
r rewrite $D/x5_eval_after_update.yaml --do "interleave step evalloop" -o $T/p9.yaml
