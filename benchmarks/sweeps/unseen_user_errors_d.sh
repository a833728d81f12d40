#!/usr/bin/env bash
# User-facing error probes of rose optimize / execute --plan / compare (fourth sweep). Run from /work/main:
#   bash benchmarks/sweeps/unseen_user_errors_d.sh > .../user_errors.txt 2>&1
# The cases are in the archived sweep's folder: `git archive results-archive benchmarks/results/optimize_cpu_unseen_2026-12-05d | tar -x` (repository root) first.
# Each case prints the command, its stdout+stderr and its exit status. Scratch outputs go under $UE.
D=benchmarks/results/optimize_cpu_unseen_2026-12-05d
E=$D/user_errors
UE=${UE:-/tmp/sw4/ue}
PLAN=${PLAN:-$D/plans/y1_three_nested.plan.yaml}
rm -rf "$UE"; mkdir -p "$UE/existing_dir"
export PYTHONPATH=$PWD
case_() {  # case_ NAME CMD...
  local name=$1; shift
  echo "### $name"
  echo "\$ rose $*"
  local t0=$(date +%s.%N)
  timeout 300 python3 -m rose_cli "$@" 2>&1 | grep -v '^\s*$' | tail -n 40
  local rc=${PIPESTATUS[0]}
  printf '[exit %s, %.1f s]\n\n' "$rc" "$(echo "$(date +%s.%N) - $t0" | bc)"
}
Y6=$D/y6_unbalanced.yaml
Y1=$D/y1_three_nested.yaml
# --- rose optimize options
case_ budget0        optimize $Y6 -o $UE/o1.yaml --budget-s 0 -q
case_ budget_neg     optimize $Y6 -o $UE/o2.yaml --budget-s -5 -q
case_ budget_nan     optimize $Y6 -o $UE/o3.yaml --budget-s nan -q
case_ budget_text    optimize $Y6 -o $UE/o4.yaml --budget-s abc -q
case_ budget_inf     optimize $Y6 -o $UE/o4b.yaml --budget-s inf --set iterations=3 -q
case_ budget_tiny    optimize $Y6 -o $UE/o5.yaml --budget-s 0.5 -q
case_ rounds0        optimize $Y6 -o $UE/o6.yaml --rounds 0 -q
case_ rounds_text    optimize $Y6 -o $UE/o6b.yaml --rounds two -q
case_ lmf_2          optimize $Y6 -o $UE/o7.yaml --local-max-fraction 2 -q
case_ lmf_neg        optimize $Y6 -o $UE/o8.yaml --local-max-fraction -0.1 -q
case_ lmf_nan        optimize $Y6 -o $UE/o8b.yaml --local-max-fraction nan -q
case_ set_undefined  optimize $Y6 -o $UE/o9.yaml --set pi_fixd=2.0 -q
case_ set_wrong_type_int   optimize $Y6 -o $UE/o10.yaml --set n=many -q
case_ set_wrong_type_float optimize $Y6 -o $UE/o11.yaml --set pi_fixed=fast --budget-s 20 -q
case_ set_no_equals  optimize $Y6 -o $UE/o11b.yaml --set n -q
case_ out_missing_dir optimize $Y6 -o $UE/no/such/dir/plan.yaml --budget-s 20 -q
case_ out_is_dir     optimize $Y6 -o $UE/existing_dir --budget-s 20 -q
case_ report_is_file optimize $Y6 -o $UE/o12.yaml --report $Y6 --budget-s 20 -q
case_ layout_undefined optimize $Y6 -o $UE/o13.yaml --layout sim_replicas=1,2 -q
case_ call_timeout0  optimize $Y6 -o $UE/o14.yaml --call-timeout 0 -q
# an existing report dir: a first short run, then the same command again (no --overwrite)
case_ first_run_ok   optimize $Y1 -o $UE/twice.yaml --set iterations=40 --budget-s 15 -q
case_ existing_report optimize $Y1 -o $UE/twice.yaml --set iterations=40 --budget-s 15 -q
case_ existing_report_other_plan optimize $Y1 -o $UE/twice2.yaml --report $UE/twice_report --set iterations=40 --budget-s 15 -q
# --- components that cannot be imported or built
case_ missing_module_validate_import validate $E/e1_missing_module.yaml --import
case_ missing_module_optimize optimize $E/e1_missing_module.yaml -o $UE/o20.yaml --budget-s 20 -q
case_ missing_module_execute  execute $E/e1_missing_module.yaml -n 2 --out $UE/r20 -q
case_ missing_class_optimize  optimize $E/e2_missing_class.yaml -o $UE/o21.yaml --budget-s 20 -q
case_ ctor_kwarg_optimize     optimize $E/e3_ctor_unknown_kwarg.yaml -o $UE/o22.yaml --budget-s 20 -q
case_ ctor_raises_optimize    optimize $E/e4_ctor_raises.yaml -o $UE/o23.yaml --budget-s 20 -q
case_ ctor_raises_execute     execute $E/e4_ctor_raises.yaml -n 2 --out $UE/r23 -q
case_ runtime_fault_optimize  optimize $E/e5_runtime_fault.yaml -o $UE/o24.yaml --budget-s 20 -q
# --- hand-edited plans (the sweep's y1 plan)
for p in p1_unknown_node_ref p2_unknown_component p3_yaml_syntax p4_truncated p4b_truncated_lines p5_empty p6_renamed_node p7_overlapping_groups; do
  case_ "execute_plan_$p" execute $Y1 --plan $E/$p.yaml -n 2 --out $UE/rp_$p -q
done
case_ optimize_plan_as_file_p1 optimize $E/p1_unknown_node_ref.yaml -o $UE/o30.yaml --budget-s 20 -q
case_ stage1_truncated optimize $Y1 --stage1 $E/p4b_truncated_lines.yaml -o $UE/o31.yaml --budget-s 20 -q
case_ execute_plan_missing execute $Y1 --plan $UE/nosuch.yaml -n 2 --out $UE/rp_missing -q
case_ execute_plan_dir execute $Y1 --plan $UE/existing_dir -n 2 --out $UE/rp_dir -q
case_ execute_plan_other_workflow execute $Y6 --plan $PLAN -n 2 --out $UE/rp_other -q
case_ execute_n0 execute $Y1 --plan $PLAN -n 0 --out $UE/rp_n0 -q
# --- rose compare
case_ compare_rounds0  compare $Y1 --plan $PLAN --rounds 0 --set iterations=300
case_ compare_warmup_neg compare $Y1 --plan $PLAN --warmup -1 --set iterations=300
case_ compare_plan_missing compare $Y1 --plan $UE/nosuch.yaml --set iterations=300
case_ compare_plan_label_empty compare $Y1 --plan fast= --set iterations=300
case_ compare_plan_truncated compare $Y1 --plan $E/p4b_truncated_lines.yaml --set iterations=300
case_ compare_plan_syntax compare $Y1 --plan $E/p3_yaml_syntax.yaml --set iterations=300
case_ compare_plan_unknown_ref compare $Y1 --plan $E/p1_unknown_node_ref.yaml --set iterations=300
case_ compare_plan_other_workflow compare $Y6 --plan $PLAN
case_ compare_duplicate_label compare $Y1 --plan a=$PLAN --plan a=$PLAN --set iterations=300 --rounds 1
case_ compare_json_missing_dir compare $Y1 --plan $PLAN --set iterations=300 --rounds 1 --json $UE/no/such/c.json
case_ compare_no_plan compare $Y1 --set iterations=300 --rounds 1
case_ compare_set_mismatch compare $Y1 --plan $PLAN --rounds 1
case_ compare_ctor_raises compare $E/e4_ctor_raises.yaml --plan $E/e4_ctor_raises.yaml --rounds 1
