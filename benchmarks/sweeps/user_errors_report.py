"""cases.txt from raw.json: command, exit code, first lines of output, verdict."""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "results" / "user_errors_2026-12-05e"  # user_errors_run.py writes raw.json
D = json.loads((HERE / "raw.json").read_text())
BUGS = {
    1: "batch_size_zero batch_size_negative batch_dim_negative batch_dim_string batch_unknown_key state_component_dup component_state_bad_name component_state_attr_int rw_broken_file",
    2: "yaml_tag graph_broken_file",
    3: "yaml_unclosed_bracket yaml_unclosed_flow_map yaml_unclosed_quote",
    4: "component_name_bad param_name_bad node_state_key_bad unicode_names",
    5: "param_div_zero param_cycle param_self param_forward_ref set_bad_value set_empty_value explain_broken",
    6: "unknown_loop_key",
    7: "item_both_node_loop",
    8: "rows_in_source rows_in_source_execute expand_in_source expand_in_source_execute group_in_source iterations_in_source interleave_in_source",
    9: "long_arith long_arith_1000 long_arith_3000 long_ref_chain",
    10: "slice_param_neg slice_reversed_execute slice_huge slice_huge_execute collect_slice_reversed slice_with_param",
    11: "import_bad_arg import_bad_arg_execute",
    12: "import_missing_method_execute import_missing_module_execute",
    13: "loop_count_and_until count_and_until_execute",
    14: "rw_fuse_same",
    15: "plan_rows_overlap plan_rows_beyond plan_rows_overlap_execute",
    16: "plan_wrong_source",
    17: "plan_source_missing_file",
    18: "count_float_whole replicas_float_whole",
    19: "opt_layout_bad",
    20: "stack_non_star",
    21: "replicas_mismatch replicas_mismatch_execute",
}
NOTES = {
    "loop_shadows_outer": "3 messages, but the cause comes first",
    "param_bool_count": "says 'True' (Python) for YAML 'true': cosmetic",
    "batch_dim_float_whole": "0.0 accepted as 0 (cf. BUG_18: replicas: 1.0 refused)",
    "shard_float_whole": "1.0 accepted as 1 (cf. BUG_18)",
    "carry_next_outside": "legal: next may read a value from outside the loop",
    "in_int_literal": "legal: integer literal input",
    "component_unused": "legal (no warning)",
    "env_int_value": "legal: env values may be numbers",
    "set_twice": "last --set wins (usual CLI convention)",
    "exec_ckpt_zero": "0 = no periodic checkpoints",
    "rw_fuse_dependent": "legal fusion (update j after epoch j)",
    "rw_split_state_node": "legal (refresh state)",
    "rw_fuse_unknown": "'fuse' takes two loops: usage printed; could say so more directly",
    "rw_split_chain_bad": "a chain needs two names: usage printed",
    "until_only_execute": "validate: valid with a note; execute refuses at the loop, positioned, exit 2",
    "until_only_execute#2": "refused at the loop, positioned, exit 2",
    "graph_mermaid_ok": "control (valid file)",
    "long_arith_200": "control: 200 terms are fine",
    "deep_expr": "3000 nested parentheses accepted",
    "long_name": "errors are the references I left unrenamed (correct)",
    "rw_interleave_stagger_word": "'x' read as a second loop name: acceptable",
    "set_zero_iters_execute": "explains why 0 iterations is refused; wording indirect but right",
    "rw_split_negative": "'-2 group(s) does nothing: k must be at least 2': fine",
    "components_empty": "two real problems (components and body both empty)",
}
case_bug = {c: b for b, cs in BUGS.items() for c in cs.split()}
lines = []
good = bad = 0
for name, v in D.items():
    out = (v["stderr"] + v["stdout"]).strip().splitlines()
    b = case_bug.get(name)
    verdict = f"DEFECT (BUG_{b})" if b else "good"
    if b:
        bad += 1
    else:
        good += 1
    note = NOTES.get(name)
    cmd = v["cmd"].replace("PYTHONPATH=$PWD timeout 120 python3 -m rose_cli", "rose")
    lines.append(f"### {name}\n$ {cmd}\nexit: {v['rc']}\n" + "\n".join("  " + line[:260] for line in out[:8]) +
                 f"\nverdict: {verdict}" + (f" -- {note}" if note else "") + "\n")
(HERE / "cases.txt").write_text(f"# {len(D)} cases: {good} good, {bad} defective (see README.md)\n"
                                "# `rose` = PYTHONPATH=$PWD timeout 120 python3 -m rose_cli, run from the repo root\n\n" + "\n".join(lines))
print(len(D), good, bad)
missing = [c for c in case_bug if c not in D]
print("missing", missing)
