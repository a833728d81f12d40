"""Generate the broken workflow files (cases/) and the command list (commands.txt) of the user-error sweep, in
benchmarks/results/user_errors_2026-12-05e/ (not tracked: the sweep's recorded run is in the `results-archive` tag)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "benchmarks" / "results" / "user_errors_2026-12-05e"
HERE.mkdir(parents=True, exist_ok=True)
CASES = HERE / "cases"
L = (ROOT / "workflows/latency_interaction.yaml").read_text()
P = (ROOT / "workflows/embodied_ppo.yaml").read_text()

def sub(old, new, base=None, count=1):
    base = L if base is None else base
    assert old in base, old
    return base.replace(old, new, count)

V = "validate"
files = {}   # name -> bytes/str
cmds = []    # (case name, args string) ; FILE is replaced by the case path

def case(name, text, *argsets):
    ext = ".yaml"
    files[name + ext] = text
    for a in (argsets or (V + " FILE",)):
        cmds.append((name, a.replace("FILE", f"benchmarks/results/user_errors_2026-12-05e/cases/{name}{ext}")))

# --- YAML syntax
case("yaml_tab_indent", sub('      count: "${epochs}"', '\tcount: "${epochs}"'))
case("yaml_bad_indent", sub("          state: {episode: refresh}", "         state: {episode: refresh}"))
case("yaml_unclosed_bracket", sub("out: [obs, reward, done]", "out: [obs, reward, done"))
case("yaml_unclosed_flow_map", sub("in: {action: act.action}", "in: {action: act.action"))
case("yaml_duplicate_key_node", sub("          call: sim.reset\n", "          call: sim.reset\n          call: sim.step\n"))
case("yaml_duplicate_key_flow", sub("state: {weights: read}", "state: {weights: read, weights: update}"))
case("yaml_duplicate_param", sub("  steps: 10\n", "  steps: 10\n  steps: 12\n"))
case("yaml_unclosed_quote", sub('count: "${steps}"', 'count: "${steps}'))
case("yaml_merge_key", sub("  sim:\n    impl:", "  sim:\n    <<: {device: cpu}\n    impl:"))
case("yaml_tag", sub("  steps: 10", "  steps: !!python/object:os.system 10"))
case("yaml_multi_doc", L + "---\nrose: 1\n")
case("yaml_scalar_doc", "hello world\n")
case("yaml_comments_only", "# nothing here\n\n")
case("yaml_null_doc", "~\n")
case("yaml_list_doc", "- rose: 1\n- name: x\n")
files["binary.yaml"] = bytes(range(256)) * 4
cmds.append(("binary_file", V + " benchmarks/results/user_errors_2026-12-05e/cases/binary.yaml"))
files["latin1.yaml"] = L.replace("name: latency-interaction", "name: lat\xe9ncy").encode("latin-1")
cmds.append(("latin1_file", V + " benchmarks/results/user_errors_2026-12-05e/cases/latin1.yaml"))
cmds.append(("directory_as_file", V + " benchmarks/results/user_errors_2026-12-05e/cases"))
cmds.append(("missing_file", V + " benchmarks/results/user_errors_2026-12-05e/cases/nope.yaml"))

# --- wrong types
case("count_string_word", sub('count: "${steps}"', 'count: "ten"'))
case("count_float_string", sub('count: "${steps}"', 'count: "2.5"'))
case("count_float_whole", sub('count: "${steps}"', "count: 2.0"))
case("count_bool", sub('count: "${steps}"', "count: true"))
case("count_null", sub('count: "${steps}"', "count:"))
case("count_list", sub('count: "${steps}"', "count: [1, 2]"))
case("count_negative_param", sub("  steps: 10\n", "  steps: -3\n"))
case("count_huge", sub('count: "${steps}"', "count: 100000000000000000000000000000"))
case("count_huge_iterations", sub("  iterations: 20\n", "  iterations: 99999999999999999999999\n"), V + " FILE")
case("count_huge_product", sub('count: "${steps}"', 'count: "${steps} * 1000000000 * 1000000000"'))
case("batch_size_zero", sub('batch: {dim: 0, size: "${num_envs}"}', "batch: {dim: 0, size: 0}"))
case("batch_size_negative", sub('batch: {dim: 0, size: "${num_envs}"}', "batch: {dim: 0, size: -4}"))
case("batch_size_string", sub('batch: {dim: 0, size: "${num_envs}"}', 'batch: {dim: 0, size: "lots"}'))
case("num_envs_zero", sub("  num_envs: 64\n", "  num_envs: 0\n"))
case("batch_dim_negative", sub('batch: {dim: 0, size: "${num_envs}"}', 'batch: {dim: -1, size: "${num_envs}"}'))
case("batch_dim_string", sub('batch: {dim: 0, size: "${num_envs}"}', 'batch: {dim: x, size: "${num_envs}"}'))
case("batch_bad_scalar", sub('batch: {dim: 0, size: "${num_envs}"}', "batch: yes"))
case("batch_unknown_key", sub('batch: {dim: 0, size: "${num_envs}"}', 'batch: {dim: 0, sise: "${num_envs}"}'))
case("mps_quota_150_param", sub("  fixed_ms: 1.0\n", "  fixed_ms: 1.0\n  q: 150\n").replace("    device: cpu\n    state: [episode]", '    device: cpu\n    mps_quota: "${q}"\n    state: [episode]'))
case("mps_quota_zero", sub("    device: cpu\n    state: [episode]", "    device: cpu\n    mps_quota: 0\n    state: [episode]"))
case("mps_quota_float", sub("    device: cpu\n    state: [episode]", "    device: cpu\n    mps_quota: 50.5\n    state: [episode]"))
case("replicas_zero", sub("    device: cpu\n    state: [episode]", "    device: cpu\n    replicas: 0\n    state: [episode]"))
case("replicas_string", sub("    device: cpu\n    state: [episode]", "    device: cpu\n    replicas: two\n    state: [episode]"))
case("replicas_mismatch", sub("    device: cpu\n    state: [episode]", "    device: cpu\n    replicas: 3\n    state: [episode]").replace("    state: [weights]\n", "    replicas: 2\n    state: [weights]\n", 1))
case("device_tpu", sub("    device: cpu\n    state: [episode]", "    device: tpu\n    state: [episode]"))
case("gpu_negative", sub("    device: cpu\n    state: [episode]", "    device: gpu\n    gpu: -1\n    state: [episode]"))
case("timeout_negative", sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      timeout_s: -5\n"))
case("idempotent_string", sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      idempotent: maybe\n"))
case("out_scalar", sub("      out: [w]", "      out: w"))
case("in_list", sub("in: {w: publish.w}", "in: [publish.w]"))
case("params_list", sub("params:\n  seed: 0\n", "params:\n  - seed: 0\n").replace("  num_envs: 64\n", "  - num_envs: 64\n"))
case("param_dict_value", sub("  steps: 10\n", "  steps: {a: 1}\n"))
case("name_int", sub("name: latency-interaction", "name: 42"))
case("name_missing", sub("name: latency-interaction\n", ""))
case("version_string", sub("rose: 1", 'rose: "1"'))
case("components_empty", L.split("components:")[0] + "components: {}\niteration:\n  count: 1\n  body: []\n")
case("iteration_missing", L.split("iteration:")[0])
case("args_list", sub("    args: {fixed_ms: 20.0, per_row_ms: 0.0}", "    args: [20.0, 0.0]"))
case("state_component_dup", sub("    state: [weights, optimizer]", "    state: [weights, weights]"))

# --- unknown fields / misspelled keys
case("unknown_component_key", sub("    args: {fixed_ms: 20.0, per_row_ms: 0.0}", "    arg: {fixed_ms: 20.0, per_row_ms: 0.0}"))
case("unknown_loop_key", sub('      count: "${epochs}"\n      body:\n        - node: reset', '      cout: "${epochs}"\n      body:\n        - node: reset'))
case("unknown_carry_key", sub("obs: {init: reset.obs, next: env.obs}", "obs: {init: reset.obs, nxt: env.obs}"))
case("unknown_iteration_key", sub('  count: "${iterations}"\n', '  count: "${iterations}"\n  repeat: 2\n'))
case("unknown_state_mode", sub("state: {episode: update}", "state: {episode: write}"))
case("state_mode_case", sub("state: {episode: update}", "state: {episode: Update}"))

# --- references
case("undefined_loop_index", sub("in: {it: iteration.i, ep: epoch.i}", "in: {it: iteration.i, ep: epochh.i}"))
case("loop_index_out_of_scope", sub("in: {batch: \"epoch[update.i].step.traj\"}", "in: {batch: \"epoch[update.i].step.traj\", t: step.i}"))
case("loop_attr_unknown", sub("in: {it: iteration.i, ep: epoch.i}", "in: {it: iteration.i, ep: epoch.j}"))
case("undefined_param_args", sub('args: {num_envs: "${num_envs}", fixed_ms', 'args: {num_envs: "${num_env}", fixed_ms'))
case("undefined_param_batch", sub('batch: {dim: 0, size: "${num_envs}"}', 'batch: {dim: 0, size: "${num_env}"}'))
case("expr_syntax_count", sub('count: "${steps}"', 'count: "${steps +}"'))
case("expr_unclosed_dollar", sub('count: "${steps}"', 'count: "${steps"'))
case("expr_empty_dollar", sub('count: "${steps}"', 'count: "${}"'))
case("expr_div_zero", sub('count: "${steps}"', 'count: "${steps} // 0"'))
case("expr_mod_zero", sub('count: "${steps}"', 'count: "${steps} % 0"'))
case("expr_div_zero_param", sub("  steps: 10\n", "  zero: 0\n  steps: 10\n").replace('count: "${steps}"', 'count: "${steps} // ${zero}"'))
case("param_div_zero", sub("  iterations: 20\n", '  iterations: "${steps} // 0"\n'))
case("param_cycle", sub("  epochs: 2\n", '  epochs: "${iterations}"\n').replace("  iterations: 20\n", '  iterations: "${epochs}"\n'))
case("param_self", sub("  epochs: 2\n", '  epochs: "${epochs} + 1"\n'))
case("param_forward_ref", sub("  epochs: 2\n", '  epochs: "${iterations} // 10"\n'))
case("carry_init_later_node", sub("obs: {init: reset.obs, next: env.obs}", "obs: {init: publish.w, next: env.obs}"))
case("carry_next_unknown_port", sub("obs: {init: reset.obs, next: env.obs}", "obs: {init: reset.obs, next: env.obz}"))
case("carry_init_missing", sub("obs: {init: reset.obs, next: env.obs}", "obs: {next: env.obs}"))
case("carry_scalar", sub("obs: {init: reset.obs, next: env.obs}", "obs: reset.obs"))
case("carry_next_outside", sub("obs: {init: reset.obs, next: env.obs}", "obs: {init: reset.obs, next: reset.obs}"))
case("collect_unclosed", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "stack(step[*].{obs: step.obs, act.action"'))
case("collect_cat_wrong_arity", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "cat()"'))
case("collect_out_of_range", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "step[10].act.action"'))
case("collect_unknown_port", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "stack(step[*].{act.actoin})"'))
case("collect_out_of_scope", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "stack(step[*].{publish.w})"'))
case("collect_slice_reversed", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "stack(step[*].act.action)[5:2]"'))
case("collect_dup_record_key", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "stack(step[*].{a: step.obs, a: act.action})"'))
case("collect_unknown_name_used", sub('in: {batch: "epoch[update.i].step.traj"}', 'in: {batch: "epoch[update.i].step.trajj"}'))
case("slice_huge", sub("in: {action: act.action}", 'in: {action: "act.action[0:1000]"}'))
case("slice_param_neg", sub("in: {action: act.action}", 'in: {action: "act.action[4:2]"}'))
case("cycle_later_node", sub("in: {batch: \"epoch[update.i].step.traj\"}", "in: {batch: \"epoch[update.i].step.traj\", w: publish.w}"))
case("loop_count_and_until", sub('          count: "${steps}"\n', '          count: "${steps}"\n          until: env.done\n'))
case("loop_neither_count_nor_until", sub('          count: "${steps}"\n', ""))
case("loop_empty_body", sub('      count: "${epochs}"\n      body:\n        - node: sgd\n          call: trainer.update\n          in: {batch: "epoch[update.i].step.traj"}\n          state: {weights: update, optimizer: update}\n', '      count: "${epochs}"\n      body: []\n'))
case("iteration_empty_body", L.split("  body:\n")[0] + "  body: []\n")
case("node_and_loop_keys", sub("        - node: sgd\n", "        - node: sgd\n          loop: sgdl\n"))
case("call_no_method", sub("call: trainer.get_weights", "call: trainer."))
case("call_three_parts", sub("call: trainer.get_weights", "call: trainer.get.weights"))
case("loop_shadows_outer", sub("    - loop: epoch\n", "    - loop: iteration\n"))
case("loop_named_like_component", sub("    - loop: update\n", "    - loop: trainer\n"))
case("after_unknown", sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      after: [nope]\n"))
case("after_later", sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      after: [sync]\n"))
case("after_self", sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      after: [publish]\n"))
case("unicode_names", sub("node: act\n", "node: 行动\n").replace("act.action", "行动.action").replace("act.value", "行动.value"))
case("unicode_bad_name", sub("node: act\n", "node: \"a b\"\n"))
case("emoji_typo", sub("call: sim.step", "call: sím.step"))
case("state_unknown_obj", sub("state: {episode: update}", "state: {episod: update}"))
case("state_list", sub("state: {episode: update}", "state: [episode]"))
case("phase_bad_parent_port", sub("state: {weights: read}\n              out: [action, value]", "state: {weights: read}\n              out: [action, value]\n              phases:\n                - node: p1\n                  call: policy.act\n                  in: {obs: act.obz}\n                  state: {weights: read}\n                  out: [action, value]"))
case("shard_on_non_replica", sub("          state: {weights: update, optimizer: update}\n", "          state: {weights: update, optimizer: update}\n          shard: x\n"))

# --- --import
case("import_missing_method", sub("call: policy.act", "call: policy.actt"), V + " --import FILE")
case("import_missing_module", sub('impl: "examples.bench.latency:Sim"', 'impl: "examples.bench.latencyy:Sim"'), V + " --import FILE")
case("import_missing_class", sub('impl: "examples.bench.latency:Sim"', 'impl: "examples.bench.latency:Simm"'), V + " --import FILE")
case("import_bad_impl_syntax", sub('impl: "examples.bench.latency:Sim"', 'impl: "examples/bench/latency.py"'), V + " --import FILE")
case("import_disallowed_module", sub('impl: "examples.bench.latency:Sim"', 'impl: "os:system"'), V + " --import FILE")
case("import_bad_arg", sub("    args: {fixed_ms: 20.0, per_row_ms: 0.0}", "    args: {fixed_ms: 20.0, per_row_ms: 0.0, bogus: 1}"), V + " --import FILE")

# --- CLI-level options on the good file
G = "workflows/latency_interaction.yaml"
for nm, a in [
    ("set_unknown_param", f"validate {G} --set nope=3"),
    ("set_no_equals", f"validate {G} --set iterations"),
    ("set_bad_value", f"validate {G} --set iterations=abc"),
    ("set_negative", f"validate {G} --set steps=-2"),
    ("set_zero_iters_execute", f"execute {G} --set iterations=0 -n 2 --backend local --out /tmp/ue_e/zero --overwrite"),
    ("execute_n_zero", f"execute {G} -n 0 --backend local --out /tmp/ue_e/n0 --overwrite"),
    ("execute_n_negative", f"execute {G} -n -1 --backend local --out /tmp/ue_e/nneg --overwrite"),
    ("execute_plan_missing", f"execute {G} --plan /tmp/ue_e/noplan.yaml -n 2 --backend local --out /tmp/ue_e/p --overwrite"),
    ("execute_plan_is_other_wf", f"execute {G} --plan workflows/latency_chain.yaml -n 2 --backend local --out /tmp/ue_e/p2 --overwrite"),
    ("execute_backend_bad", f"execute {G} --backend gpu -n 2 --out /tmp/ue_e/b --overwrite"),
    ("execute_out_is_file", f"execute {G} -n 2 --backend local --out README.md"),
    ("graph_format_bad", f"graph {G} --format png"),
    ("graph_dir", "graph workflows --format dot"),
    ("explain_empty", "validate --explain benchmarks/results/user_errors_2026-12-05e/cases/yaml_comments_only.yaml"),
    ("rw_unknown_verb", f'rewrite {G} --do "splitt step 2" -o /tmp/ue_e/p.yaml'),
    ("rw_empty_request", f'rewrite {G} --do "" -o /tmp/ue_e/p.yaml'),
    ("rw_unknown_node", f'rewrite {G} --do "split stepp 2" -o /tmp/ue_e/p.yaml'),
    ("rw_split_0", f'rewrite {G} --do "split step 0" -o /tmp/ue_e/p.yaml'),
    ("rw_split_1", f'rewrite {G} --do "split step 1" -o /tmp/ue_e/p.yaml'),
    ("rw_split_too_many", f'rewrite {G} --do "split step 1000" -o /tmp/ue_e/p.yaml'),
    ("rw_split_negative", f'rewrite {G} --do "split step -2" -o /tmp/ue_e/p.yaml'),
    ("rw_split_word", f'rewrite {G} --do "split step two" -o /tmp/ue_e/p.yaml'),
    ("rw_split_extra_args", f'rewrite {G} --do "split step 2 3 4" -o /tmp/ue_e/p.yaml'),
    ("rw_split_no_batch", f'rewrite {G} --do "split sgd 2" -o /tmp/ue_e/p.yaml'),
    ("rw_split_dependent_loop_time", f'rewrite {G} --do "split-time step 2" -o /tmp/ue_e/p.yaml'),
    ("rw_split_time_too_many", f'rewrite {G} --do "split-time epoch 5" -o /tmp/ue_e/p.yaml'),
    ("rw_interleave_unsplit", f'rewrite {G} --do "interleave step" -o /tmp/ue_e/p.yaml'),
    ("rw_fuse_unknown", f'rewrite {G} --do "fuse nope" -o /tmp/ue_e/p.yaml'),
    ("rw_rewire_break", f'rewrite {G} --do "rewire sync before publish" -o /tmp/ue_e/p.yaml'),
    ("rw_rewire_garbage", f'rewrite {G} --do "rewire" -o /tmp/ue_e/p.yaml'),
    ("rw_expand_nophases", f'rewrite {G} --do "expand act" -o /tmp/ue_e/p.yaml'),
    ("rw_split_twice", f'rewrite {G} --do "split step 2" --do "split step 2" -o /tmp/ue_e/p.yaml'),
    ("rw_out_dir", f'rewrite {G} --do "split step 2" -o /tmp'),
    ("rw_out_missing_dir", f'rewrite {G} --do "split step 2" -o /tmp/ue_e/no/such/dir/p.yaml'),
    ("rw_layout_unknown", f'rewrite {G} --layout nope=4 -o /tmp/ue_e/p.yaml'),
    ("rw_layout_bad_value", 'rewrite workflows/latency_sim_processes.yaml --layout sim_replicas=0 -o /tmp/ue_e/p.yaml'),
    ("rw_split_chain_bad", 'rewrite workflows/latency_chain.yaml --do "split-chain nope 2" -o /tmp/ue_e/p.yaml'),
]:
    cmds.append((nm, a))

# --- round 2
G = "workflows/latency_interaction.yaml"
OUTP = "-o /tmp/ue_e/p.yaml"
case("until_only_execute", sub('          count: "${steps}"\n', '          until: env.done\n'),
     V + " FILE", "execute FILE -n 1 --backend local --out /tmp/ue_e/until --overwrite")
case("batch_int_negative", sub('batch: {dim: 0, size: "${num_envs}"}', "batch: -1"))
case("component_state_bad_name", sub("    state: [weights, optimizer]", '    state: [weights, "opt imizer"]'))
case("component_state_attr_int", sub("    state: [weights, optimizer]", "    state: {weights: {attr: 5}, optimizer: }"))
case("out_duplicate", sub("      out: [w]", "      out: [w, w]"))
case("in_int_literal", sub("in: {w: publish.w}", "in: {w: publish.w, k: 3}"))
case("in_string_literal", sub("in: {w: publish.w}", 'in: {w: publish.w, k: "hello world"}'))
case("expand_in_source", sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      expand: true\n"))
case("rows_in_source", sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      rows: [0, 4]\n"))
case("args_bad_expr", sub("    args: {fixed_ms: 20.0, per_row_ms: 0.0}", '    args: {fixed_ms: "${fixed_ms} *", per_row_ms: 0.0}'))
case("args_float_expr", sub("    args: {fixed_ms: 20.0, per_row_ms: 0.0}", '    args: {fixed_ms: "${fixed_ms} * 2", per_row_ms: 0.0}'))
case("env_int_value", sub("    args: {fixed_ms: 20.0, per_row_ms: 0.0}", "    args: {fixed_ms: 20.0, per_row_ms: 0.0}\n    env: {OMP_NUM_THREADS: 1}"))
case("python_path_missing", sub("    args: {fixed_ms: 20.0, per_row_ms: 0.0}", "    args: {fixed_ms: 20.0, per_row_ms: 0.0}\n    python_path: /no/such/dir"),
     V + " FILE", "execute FILE -n 1 --backend local --out /tmp/ue_e/pp --overwrite --allow-path /no/such/dir")
case("param_string_count", sub("  steps: 10\n", "  steps: ten\n"))
case("param_bool_count", sub("  steps: 10\n", "  steps: true\n"))
case("param_float_count", sub("  steps: 10\n", "  steps: 10.0\n"))
case("name_empty", sub("name: latency-interaction", 'name: ""'))
case("component_name_bad", sub("  trainer:\n    impl", '  "trai ner":\n    impl'))
case("component_unused", sub("components:\n", 'components:\n  extra:\n    impl: "examples.bench.latency:Sim"\n    args: {num_envs: 4}\n    state: [episode]\n'))
case("node_no_call", sub("      call: trainer.get_weights\n", ""))
case("item_both_node_loop", sub("    - node: publish\n", "    - node: publish\n      loop: x\n      count: 2\n"))
case("merge_in_source", sub("    - node: publish\n", "    - merge: m\n      from: [a, b]\n    - node: publish\n"))
case("plan_block_garbage", sub("name: latency-interaction\n", "name: latency-interaction\nplan: 5\n"))
case("plan_source_missing_file", sub("name: latency-interaction\n", "name: latency-interaction\nplan: {source: /no/such/source.yaml, rewrites: []}\n"))
case("carry_on_iteration_bad", sub('  count: "${iterations}"\n', '  count: "${iterations}"\n  carry: {x: {init: publish.w, next: publish.w}}\n'))
case("stack_non_star", sub('traj: "stack(step[*].{obs: step.obs, act.action, act.value, env.reward})"', 'traj: "stack(act.action)"'))
case("index_negative_two", sub('in: {batch: "epoch[update.i].step.traj"}', 'in: {batch: "epoch[-2].step.traj"}'))
case("index_expr_loop", sub('in: {batch: "epoch[update.i].step.traj"}', 'in: {batch: "epoch[update.i + 1].step.traj"}'))
case("slice_with_param", sub("in: {action: act.action}", 'in: {action: "act.action[0:${num_envs} // 0]"}'))
case("dollar_in_ref", sub("in: {action: act.action}", 'in: {action: "${act.action}"}'))
case("long_name", sub("node: act\n", "node: " + "a" * 5000 + "\n"))
case("deep_expr", sub("in: {action: act.action}", 'in: {action: "' + "(" * 3000 + "act.action" + ")" * 3000 + '"}'))
case("long_arith", sub('count: "${steps}"', 'count: "' + " + ".join(["${steps}"] * 20000) + '"'))
case("pow_like", sub('count: "${steps}"', 'count: "${steps} ** 2"'))
case("shard_negative", sub("          state: {weights: update, optimizer: update}\n", "          state: {weights: update, optimizer: update}\n          shard: -1\n"))
files["slice_rev.yaml"] = sub("in: {action: act.action}", 'in: {action: "act.action[4:2]"}')
cmds.append(("slice_reversed_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/slice_rev.yaml -n 1 --set iterations=1 --set steps=2 --backend local --out /tmp/ue_e/srev --overwrite"))
files["slice_big.yaml"] = sub("in: {action: act.action}", 'in: {action: "act.action[0:1000]"}')
cmds.append(("slice_huge_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/slice_big.yaml -n 1 --set iterations=1 --set steps=2 --backend local --out /tmp/ue_e/sbig --overwrite"))
cmds.append(("import_bad_arg_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/import_bad_arg.yaml -n 1 --set iterations=1 --set steps=2 --backend local --out /tmp/ue_e/badarg --overwrite"))
cmds.append(("replicas_mismatch_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/replicas_mismatch.yaml -n 1 --set iterations=1 --set steps=2 --backend local --out /tmp/ue_e/repl --overwrite"))
cmds.append(("import_missing_method_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/import_missing_method.yaml -n 1 --set iterations=1 --set steps=2 --backend local --out /tmp/ue_e/mm --overwrite"))
cmds.append(("import_missing_module_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/import_missing_module.yaml -n 1 --set iterations=1 --set steps=2 --backend local --out /tmp/ue_e/mmod --overwrite"))
for nm, a in [
    ("set_float_for_int", f"validate {G} --set steps=2.5"),
    ("set_twice", f"validate {G} --set steps=2 --set steps=3"),
    ("set_empty_value", f"validate {G} --set steps="),
    ("rw_rewire_self", f'rewrite {G} --do "rewire sync before sync" {OUTP}'),
    ("rw_rewire_bad_word", f'rewrite {G} --do "rewire sync beside publish" {OUTP}'),
    ("rw_rewire_cross_body", f'rewrite {G} --do "rewire publish before act" {OUTP}'),
    ("rw_interleave_stagger_bad", f'rewrite {G} --do "split step 2" --do "interleave step 0" {OUTP}'),
    ("rw_interleave_stagger_word", f'rewrite {G} --do "split step 2" --do "interleave step x" {OUTP}'),
    ("rw_fuse_dependent", f'rewrite {G} --do "fuse epoch update" {OUTP}'),
    ("rw_fuse_same", f'rewrite {G} --do "fuse epoch epoch" {OUTP}'),
    ("rw_split_time_1", f'rewrite {G} --do "split-time epoch 1" {OUTP}'),
    ("rw_split_chain_unknown_two", f'rewrite workflows/latency_chain.yaml --do "split-chain nope other 2" {OUTP}'),
    ("rw_split_state_node", f'rewrite {G} --do "split reset 2" {OUTP}'),
    ("rw_dotted_bad", f'rewrite {G} --do "split iteration.epoch.stepp 2" {OUTP}'),
    ("rw_no_do", f"rewrite {G} {OUTP}"),
    ("rw_broken_file", f'rewrite benchmarks/results/user_errors_2026-12-05e/cases/batch_size_zero.yaml --do "split step 2" {OUTP}'),
    ("graph_broken_file", "graph benchmarks/results/user_errors_2026-12-05e/cases/yaml_tag.yaml --format dot"),
    ("graph_mermaid_ok", f"graph {G} --format mermaid"),
    ("explain_broken", "validate --explain benchmarks/results/user_errors_2026-12-05e/cases/param_cycle.yaml"),
    ("opt_budget_negative", f"optimize {G} -o /tmp/ue_e/o.yaml --budget-s -1 --backend local --report /tmp/ue_e/rep --overwrite"),
    ("opt_rounds_zero", f"optimize {G} -o /tmp/ue_e/o.yaml --rounds 0 --backend local --report /tmp/ue_e/rep --overwrite"),
    ("opt_fraction_bad", f"optimize {G} -o /tmp/ue_e/o.yaml --local-max-fraction 2 --backend local --report /tmp/ue_e/rep --overwrite"),
    ("opt_stage2_bad", f"optimize {G} -o /tmp/ue_e/o.yaml --stage2 foo --backend local --report /tmp/ue_e/rep --overwrite"),
    ("opt_layout_bad", f"optimize {G} -o /tmp/ue_e/o.yaml --layout steps=a,b --backend local --report /tmp/ue_e/rep --overwrite"),
    ("opt_stage1_missing", f"optimize {G} -o /tmp/ue_e/o.yaml --stage1 /tmp/ue_e/nostage.yaml --backend local --report /tmp/ue_e/rep --overwrite"),
    ("opt_until", "optimize benchmarks/results/user_errors_2026-12-05e/cases/until_only_execute.yaml -o /tmp/ue_e/o.yaml --backend local --report /tmp/ue_e/rep --overwrite"),
    ("cmp_plan_missing", f"compare {G} --plan /tmp/ue_e/none.yaml --rounds 1"),
    ("cmp_rounds_zero", f"compare {G} --plan {G} --rounds 0"),
    ("cmp_label_empty", f"compare {G} --plan ={G} --rounds 1 --set iterations=2"),
    ("exec_resume_missing", f"execute {G} -n 1 --backend local --out /tmp/ue_e/never_made --resume"),
    ("exec_resume_and_overwrite", f"execute {G} -n 1 --backend local --out /tmp/ue_e/x --resume --overwrite"),
    ("exec_ckpt_zero", f"execute {G} -n 1 --backend local --out /tmp/ue_e/ck --overwrite --checkpoint-every 0 --set steps=2"),
    ("exec_call_timeout_neg", f"execute {G} -n 1 --backend local --out /tmp/ue_e/ct --overwrite --call-timeout -1"),
]:
    cmds.append((nm, a))

if __name__ == "__main__":
    CASES.mkdir(exist_ok=True)
    for n, t in files.items():
        (CASES / n).write_bytes(t if isinstance(t, bytes) else t.encode())
    with open(HERE / "commands.txt", "w") as f:
        for n, a in cmds:
            f.write(f"{n}\t{a}\n")
    print(len(files), "files,", len(cmds), "commands")

# --- round 3 (appended; run by hand after the first two)
def _r3():
    out = {}
    out["interleave_in_source"] = sub("    - loop: update\n", "    - loop: update\n      interleave: true\n").replace("    - loop: epoch\n", "    - loop: epoch\n      interleave: true\n", 1)
    out["iterations_in_source"] = sub('      count: "${epochs}"\n      body:\n        - node: reset', '      iterations: [0, 1]\n      body:\n        - node: reset')
    out["group_in_source"] = sub("      call: trainer.get_weights\n", "      call: trainer.get_weights\n      group: 3\n")
    for n in (200, 1000, 3000):
        out[f"long_arith_{n}"] = sub('count: "${steps}"', 'count: "' + " + ".join(["1"] * n) + '"')
    out["long_ref_chain"] = sub("in: {action: act.action}", 'in: {action: "' + "act.action" + "[0:64]" * 3000 + '"}')
    return out
R3_CMDS = [(n, f"validate benchmarks/results/user_errors_2026-12-05e/cases/{n}.yaml") for n in (
    "interleave_in_source", "iterations_in_source", "group_in_source", "long_arith_200", "long_arith_1000",
    "long_arith_3000", "long_ref_chain", "param_name_bad", "node_state_key_bad", "replicas_float_whole",
    "batch_dim_float_whole", "shard_float_whole", "plan_rows_overlap", "plan_rows_beyond", "plan_rows_reversed",
    "plan_wrong_source", "plan_truncated")] + [
    ("rows_in_source_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/rows_in_source.yaml -n 1 --set steps=2 --backend local --out /tmp/ue_e/ris --overwrite"),
    ("expand_in_source_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/expand_in_source.yaml -n 1 --set steps=2 --backend local --out /tmp/ue_e/eis --overwrite"),
    ("count_and_until_execute", "execute benchmarks/results/user_errors_2026-12-05e/cases/loop_count_and_until.yaml -n 1 --set steps=2 --backend local --out /tmp/ue_e/cu --overwrite"),
    ("plan_rows_overlap_execute", "execute workflows/latency_interaction.yaml --plan benchmarks/results/user_errors_2026-12-05e/cases/plan_rows_overlap.yaml -n 1 --backend local --out /tmp/ue_e/po --overwrite"),
]
if __name__ == "__main__":
    with open(HERE / "commands.txt", "a") as f:
        for n, a in R3_CMDS:
            f.write(f"{n}\t{a}\n")
    for n, t in _r3().items():
        (CASES / (n + ".yaml")).write_text(t)
