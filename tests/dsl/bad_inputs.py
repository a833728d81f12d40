"""The table of bad inputs: (name, workflow text or mutation of the PPO workflow, expected first line)."""

from __future__ import annotations

from pathlib import Path

# A frozen copy of workflows/embodied_ppo.yaml: the line numbers below are pinned to it.
PPO = (Path(__file__).resolve().parent / "fixtures" / "ppo.yaml").read_text()


def sub(old: str, new: str) -> str:
    assert old in PPO, old
    return PPO.replace(old, new, 1)


MINI = """rose: 1
name: mini
params: {n: 2}
components:
  a: {impl: "examples.x:A", state: [s]}
iteration:
  count: 1
  body:
    - {node: p, call: a.f, out: [y]}
"""


def mini(body_line: str) -> str:
    return MINI.replace("    - {node: p, call: a.f, out: [y]}\n", body_line)


CASES: list[tuple[str, str, str]] = [
    ("not_yaml", "rose: 1\nname: [x\n  y: 2\n", "wf.yaml:3:4: <document>: not valid YAML"),
    ("empty", "", "wf.yaml:1:1: <document>: the file is empty"),
    # a bad field inside a mapping a oneOf branch takes: at the field (user-error sweep, 2026-12-05: it was
    # "expected a mapping; found a mapping" at the parent)
    ("batch_size_zero", mini("    - {node: p, call: a.f, out: [y], batch: {dim: 0, size: 0}}\n"),
     "wf.yaml:9:60: iteration.body[0].batch.size: must be at least 1; found 0"),
    # an `anyOf` (an integer or a ${params} expression): the branch the value's type takes says what is wrong
    # (it was jsonschema's "-1 is not valid under any of the given schemas")
    ("budget_negative", MINI.replace("state: [s]", "state: {s: {max_staleness: -1}}"),
     "wf.yaml:5:56: components.a.state.s.max_staleness: must be at least 0; found -1"),
    ("budget_empty", MINI.replace("state: [s]", 'state: {s: {max_staleness: ""}}'),
     "wf.yaml:5:57: components.a.state.s.max_staleness: '' should be non-empty"),
    # a literal and the same value through a param: the same limit and message (the literal passed, issue 59)
    ("budget_huge", MINI.replace("state: [s]", "state: {s: {max_staleness: 1000000000}}"),
     "wf.yaml:5:56: components.a.state.s.max_staleness: count 1000000000 is larger than 10000000"),
    ("budget_huge_param", MINI.replace("state: [s]", 'state: {s: {max_staleness: "${big}"}}').replace(
        "params: {n: 2}", "params: {n: 2, big: 1000000000}"),
     "wf.yaml:5:57: components.a.state.s.max_staleness: count 1000000000 is larger than 10000000"),
    # a bad key of a mapping of names: at the key, saying what a name is (it was at the mapping's first key)
    ("component_name_space", MINI.replace("  a: {impl", '  "a b": {impl'),
     "wf.yaml:5:3: components.a b: 'a b' is not a valid name (letters, digits and '_', not starting with a digit)"),
    # the rewrites' spelling of split groups and copies is kept for plans: `p@1` would collide with a split's
    # groups (and a split of it would need `p@1@0`)
    ("reserved_node_name", mini("    - {node: p@1, call: a.f, out: [y]}\n"),
     "wf.yaml:9:14: iteration.body[0].node: 'p@1': a name ending in '@N' is kept for the copies the rewrites make"),
    ("reserved_component_name", MINI.replace("  a: {impl", "  a@2: {impl").replace("call: a.f", "call: a@2.f"),
     "wf.yaml:5:3: components.a@2: 'a@2': a name ending in '@N' is kept"),
    # a YAML tag: at the tag (it was 1:1, with the position only inside the message)
    ("yaml_tag", MINI.replace("params: {n: 2}", "params: {n: !!python/object:os.system 2}"),
     "wf.yaml:3:13: <document>: not valid YAML: YAML tags are not supported"),
    ("batch_key_typo", mini("    - {node: p, call: a.f, out: [y], batch: {dim: 0, sise: 4}}\n"),
     "iteration.body[0].batch.sise: unknown key 'sise'"),
    ("not_mapping", "- 1\n- 2\n", "wf.yaml:1:1: <document>: a workflow is a mapping; found a list of 2"),
    ("wrong_version", sub("rose: 1", "rose: 2"), "wf.yaml:7:7: rose: unsupported format version 2"),
    ("no_version", sub("rose: 1\n", ""), "wf.yaml:7:1: rose: missing the format version 'rose: 1'"),
    ("misspelled_key", sub("call: sim.step", "cal: sim.step"),
     "wf.yaml:85:15: iteration.body[0].body[1].body[1].cal: unknown key 'cal' in node 'env'"),
    ("unknown_top_key", sub("params:", "parms:"), "wf.yaml:9:1: parms: unknown key 'parms' in the workflow"),
    ("unknown_component", sub("call: sim.step", "call: simm.step"),
     "wf.yaml:85:21: iteration.body[0].body[1].body[1].call: unknown component 'simm'"),
    ("unknown_port", sub("in: {action: act.action}", "in: {action: act.actoin}"),
     "wf.yaml:86:28: iteration.body[0].body[1].body[1].in.action: in 'act.actoin': node 'act' has no output 'actoin'"),
    ("unknown_node", sub("in: {action: act.action}", "in: {action: actor.action}"),
     "wf.yaml:86:28: iteration.body[0].body[1].body[1].in.action: in 'actor.action': unknown name 'actor' in 'actor.action'"),
    ("runs_later", sub("in: {w: publish.w}", "in: {w: publish.w, x: later.y}").replace(
        "      state: {rollout_weights: refresh}\n", "      state: {rollout_weights: refresh}\n    - {node: later, call: trainer.get_weights, out: [y]}\n"),
     "wf.yaml:105:29: iteration.body[3].in.x: in 'later.y': 'later' runs later in the same iteration"),
    ("cycle", sub("in: {obs: step.obs, it: iteration.i, ep: epoch.i, t: step.i}",
                  "in: {obs: env.obs, it: iteration.i, ep: epoch.i, t: step.i}"),
     "wf.yaml:56:25: iteration.body[0].body[1].body[0].in.obs: cyclic data dependency: act -> env -> act"),
    ("carry_without_next", sub("obs: {init: reset.obs, next: env.obs}", "obs: {init: reset.obs}"),
     "wf.yaml:52:18: iteration.body[0].body[1].carry.obs: loop-carried value 'obs' has no 'next'"),
    ("state_not_owned", sub("state: {episode: update}", "state: {weights: update}"),
     "wf.yaml:87:23: iteration.body[0].body[1].body[1].state.weights: component 'sim' does not own a state object 'weights'"),
    ("state_of_other_component", sub("state: {episode: update}", "state: {trainer.weights: update}"),
     "wf.yaml:87:23: iteration.body[0].body[1].body[1].state.trainer.weights: node 'env' calls component 'sim' but accesses state 'trainer.weights' of component 'trainer'"),
    ("duplicate_name", sub("node: env\n", "node: act\n"),
     "wf.yaml:84:21: iteration.body[0].body[1].body[1]: duplicate name 'act' in this body"),
    ("negative_count", mini("    - {loop: l, count: -1, body: [{node: p, call: a.f}]}\n"),
     "wf.yaml:9:24: iteration.body[0].count: a count must not be negative; found -1"),
    ("non_integer_count", mini("    - {loop: l, count: 2.5, body: [{node: p, call: a.f}]}\n"),
     "wf.yaml:9:24: iteration.body[0].count: expected an integer or a string; found a number (2.5)"),
    ("count_from_a_node", mini("    - {node: p, call: a.f, out: [y]}\n    - {loop: l, count: p.y, body: [{node: q, call: a.f}]}\n"),
     "wf.yaml:10:24: iteration.body[1].count: a count must be static: integer arithmetic over ${params}"),
    ("undefined_param", sub('count: "${steps}"', 'count: "${stepz}"'),
     "wf.yaml:50:21: iteration.body[0].body[1].count: undefined param 'stepz'"),
    # a param in a body expression was not checked: it validated and raised KeyError building the graph
    # (issue 59's fuzzing pass, tests/cli/test_fuzz.py)
    ("undefined_param_in_an_input", mini('    - {node: p, call: a.f, in: {x: "iteration.i * ${m}"}, out: [y]}\n'),
     "wf.yaml:9:53: iteration.body[0].in.x: undefined param 'm'"),
    ("param_not_int", mini('    - {loop: l, count: "${n} * ${f}", body: [{node: p, call: a.f}]}\n').replace("{n: 2}", "{n: 2, f: 0.5}"),
     "wf.yaml:9:34: iteration.body[0].count: param 'f' is 0.5, not an integer"),
    ("bad_expression", sub("in: {action: act.action}", 'in: {action: "act.action[0:"}'),
     "wf.yaml:86:42: iteration.body[0].body[1].body[1].in.action: in expression 'act.action[0:': expression ends early"),
    ("unknown_function", sub("in: {action: act.action}", 'in: {action: "mean(act.action)"}'),
     "wf.yaml:86:29: iteration.body[0].body[1].body[1].in.action: in expression 'mean(act.action)': unknown function 'mean'"),
    ("until_without_bound", mini("    - loop: l\n      until: p.y\n      body:\n        - {node: p, call: a.f, out: [y]}\n"),
     "wf.yaml:10:14: iteration.body[0].until: loop 'l' ends on a condition (until) but has no bound: a loop that ends "
     "on a condition needs `count:` beside `until:`, the most iterations it may run"),
    ("all_iterations_unwrapped", sub('in: {traj: "epoch[update.i].step.traj"}', 'in: {traj: "epoch[*].step.traj"}'),
     "wf.yaml:97:23: iteration.body[1].body[0].in.traj: in 'epoch[*].step.traj': '[*]' gives every iteration: wrap it in stack(...) or cat(...)"),
    ("iteration_out_of_range", sub('in: {traj: "epoch[update.i].step.traj"}', 'in: {traj: "epoch[7].step.traj"}'),
     "wf.yaml:97:29: iteration.body[1].body[0].in.traj: in 'epoch[7].step.traj': iteration 7 of loop 'epoch' does not exist (count 2)"),
    ("phase_effects_differ", PPO.replace("                      state: {rollout_weights: read}\n", "").replace(
        "                  state: {rollout_weights: read}\n", ""),
     "wf.yaml:61:17: iteration.body[0].body[1].body[0].phases: node 'act' declares 'policy.rollout_weights: read' but its phases never access it"),
    ("bad_call_syntax", mini("    - {node: p, call: a-f}\n"),
     "wf.yaml:9:23: iteration.body[0].call: a string ('a-f') is not a valid call (component.method)"),
    ("item_without_kind", mini("    - {call: a.f}\n"),
     "wf.yaml:9:7: iteration.body[0]: an item needs exactly one of 'node:', 'loop:' or 'merge:'"),
    ("duplicate_key", "rose: 1\nname: a\nname: b\n", "wf.yaml:3:1: name: duplicate key 'name'"),
    ("billion_laughs", "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
     "the document expands to more than 200000 YAML nodes"),
    ("quota_out_of_range", sub("    device: cpu\n    state: [episode]", "    device: cpu\n    mps_quota: 150\n    state: [episode]"),
     "wf.yaml:25:16: components.sim.mps_quota: must be between 1 and 100; found 150"),
    ("priority_out_of_range", sub("    device: cpu\n    state: [episode]", "    device: cpu\n    mps_priority: 2\n    state: [episode]"),
     "wf.yaml:25:19: components.sim.mps_priority: must be between 0 and 1; found 2"),
    ("priority_param_out_of_range",
     sub("    device: cpu\n    state: [episode]", "    device: cpu\n    mps_priority: \"${num_envs}\"\n    state: [episode]"),
     "wf.yaml:25:20: components.sim.mps_priority: must be between 0 and 1; found 8 (from '${num_envs}')"),
    ("zero_iterations_collected", sub("  steps: 25 ", "  steps: 0  "),
     "wf.yaml:50:19: iteration.body[0].body[1].count: loop 'step' runs 0 times (from '${steps}'), so what it collects "
     "('traj') would be empty: a consumer of it would train on nothing"),
    ("zero_iterations_around_a_collect", sub("  epochs: 2 ", "  epochs: 0 "),
     "wf.yaml:41:15: iteration.body[0].count: loop 'epoch' runs 0 times (from '${epochs}'), so what its loop 'step' "
     "collects ('traj') would be empty: a consumer of it would train on nothing"),
    ("too_deep", "x: " + "[" * 100 + "]" * 100 + "\n", "nesting deeper than 64 levels"),
    ("huge_file", "rose: 1\n" + "#" * (10 * 1024 * 1024) + "\n", "wf.yaml:1:1: <document>: file is larger than 4 MiB"),
    # issue 42: a name with a terminal escape or an RTL override is shown escaped, never obeyed by the terminal
    ("name_with_terminal_escape", MINI.replace("  a: {impl", '  "a\\e[2J": {impl'),
     "wf.yaml:5:3: components.a\\x1b[2J: 'a\\x1b[2J' is not a valid name"),
    ("call_with_rtl_override", MINI.replace("call: a.f", 'call: "a.f\\u202e"'),
     "wf.yaml:9:24: iteration.body[0].call: a string ('a.f\\u202e') is not a valid call (component.method)"),
    # issue 42: numbers no param can hold (they were Python's int-from-text ValueError, exit 1; NaN validated)
    ("param_nan", MINI.replace("params: {n: 2}", "params: {n: 2, ms: .nan}"),
     "wf.yaml:3:20: params.ms: nan is not a finite number"),
    ("param_huge_int", MINI.replace("params: {n: 2}", "params: {n: " + "9" * 5000 + "}"),
     "wf.yaml:3:13: <document>: an integer of 5000 digits is too large"),
    ("expression_huge_int", mini('    - {loop: l, count: "${' + "9" * 5000 + '}", body: [{node: p, call: a.f}]}\n'),
     "integer literal of 5000 digits is too large"),
    # issue 42: a plan whose split-time part lost the output read through the loop (a hand edit): at the reader
    ("split_time_part_without_output", MINI.replace("    - {node: p, call: a.f, out: [y]}\n", (
        "    - {loop: l@0, count: 2, iterations: [0], split_of: l, group: 0, body: [{node: p, call: a.f, out: [y]}]}\n"
        "    - {loop: l@1, count: 2, iterations: [1], split_of: l, group: 1, body: [{node: p, call: a.f, out: [z]}]}\n"
        "    - {node: q, call: a.f, in: {x: 'stack(l[*].p.y)'}}\n")),
     "wf.yaml:11:48: iteration.body[2].in.x: in 'stack(l[*].p.y)': node 'p' has no output 'y', in 'l@1' (a part of "
     "the loop 'l' split in time: each part must give what is read through it)"),
]
