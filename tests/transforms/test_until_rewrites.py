"""Rewrites of loops that end on a condition (`until:`): a loop that ends per row, copied per row group with
its consumer (`split-chain decode score K`), lets each group end on its own -- group 0's consumer runs
while group 1 still generates -- and computes what the declared workflow computes; where a group could not
end on its own rows, the rewrite is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from interpreter.local_backend import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text
from rose_dsl.ir import Workflow
from rose_dsl.transforms import Refused, apply_request

FIXTURES = Path(__file__).resolve().parents[1] / "dsl" / "fixtures"
SPLIT = (FIXTURES / "until_decode_split.yaml").read_text()
EPISODES = (FIXTURES / "until_episodes.yaml").read_text()
EPOCHS = (FIXTURES / "until_epochs.yaml").read_text()


def _metrics(wf: Workflow, backend: str = "local", order: list[str] | None = None,
             prefixes: tuple[str, ...] = ("lm/", "judge/")) -> list[dict[str, float]]:
    sch = Schedule(wf)
    if backend == "local":
        be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
    else:
        from interpreter.backends import make_backend

        be = make_backend("ray", wf, sch, allowed=("examples.",), log=lambda _: None)
    if order is not None:
        submit = be.submit

        def recording(step, replica=0):
            order.append(step.label)
            return submit(step, replica)

        be.submit = recording  # type: ignore[method-assign]
    try:
        runner = Runner(wf, be, RunConfig(iterations=3, tensorboard=False), sch)
        runner.run()
    finally:
        be.shutdown()
    return [{k: v for k, v in r.metrics.items() if k.startswith(prefixes)} for r in runner.results]


def _plan(text: str, *requests: str) -> Workflow:
    wf = load_workflow_text(text, "until.yaml")
    for request in requests:
        wf = apply_request(wf, request).workflow
    return wf


@pytest.mark.parametrize("k", [2, 3])
def test_a_per_row_decode_loop_split_with_its_scorer_computes_the_declared_values(k) -> None:
    declared = load_workflow_text(SPLIT, "until.yaml")
    plan = _plan(SPLIT, f"split-chain decode score {k}")
    order: list[str] = []
    want, got = _metrics(declared), _metrics(plan, order=order)
    assert want and got == want  # bit for bit: every row computes the same values in its group
    # the long-tail overlap: group 0's scorer is sent before group 1's loop runs (the driver decides a loop's
    # trips as it runs them, so in item order it would wait for every group's loop to end)
    first = [label for label in order if label.startswith("iteration.")]
    score0 = next(i for i, label in enumerate(first) if label.startswith("iteration.score@0"))
    gen1 = next(i for i, label in enumerate(first) if label.startswith("iteration.decode@1.gen"))
    assert score0 < gen1, first[:12]


def test_the_split_plan_on_ray_equals_the_declared_workflow(ray_session) -> None:
    declared = load_workflow_text(SPLIT, "until.yaml")
    want = _metrics(declared)
    assert _metrics(_plan(SPLIT, "split-chain decode score 2"), "ray") == want


def _first_iteration(order: list[str]) -> list[str]:
    calls = [label for label in order if label.startswith("iteration.")]
    return calls[:calls.index(next(c for c in calls if ".learn" in c))]


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_temporal_groups_holding_an_until_loop_take_turns_and_compute_the_declared_values(backend, request) -> None:
    """`split-time epoch 2; interleave epoch` where each epoch's episode loop ends per row: the groups take
    turns, one call each (group 1's episode runs while group 0's is still stepping; a group whose episodes
    all ended drops out), and the metrics are the declared workflow's bit for bit. The groups used to run
    one after the other: the interleave was accepted and silently dropped."""
    if backend == "ray":
        request.getfixturevalue("ray_session")
    want = _metrics(load_workflow_text(EPOCHS, "until.yaml"), prefixes=("pi/",))
    order: list[str] = []
    plan = _plan(EPOCHS, "split-time epoch 2", "interleave epoch")
    got = _metrics(plan, backend, order=order, prefixes=("pi/",))
    assert want and got == want
    calls = _first_iteration(order)
    last0 = max(i for i, c in enumerate(calls) if c.startswith("iteration.epoch@0.ep."))
    first1 = min(i for i, c in enumerate(calls) if c.startswith("iteration.epoch@1.ep."))
    assert first1 < last0, calls[:16]
    steps = [c.split(".")[1] for c in calls if ".ep." in c]
    assert steps[:4] == ["epoch@0", "epoch@1", "epoch@0", "epoch@1"], steps[:8]


def test_sibling_until_loops_take_turns_and_compute_the_declared_values() -> None:
    """Two row groups of a decode loop (`split-chain`), made neighbours and interleaved: their steps alternate
    until each group's rows are done, and every value is the declared workflow's."""
    want = _metrics(load_workflow_text(SPLIT, "until.yaml"))
    order: list[str] = []
    plan = _plan(SPLIT, "split-chain decode score 2", "rewire score@0 after decode@1", "interleave decode@0 decode@1")
    assert _metrics(plan, order=order) == want
    gens = [c.split(".")[1] for c in _first_iteration(order) if ".gen" in c]
    assert gens[:4] == ["decode@0", "decode@1", "decode@0", "decode@1"], gens[:8]


def test_a_loop_that_writes_state_is_not_split_into_groups_that_end_on_their_own() -> None:
    with pytest.raises(Refused, match=r"'envstep' in loop 'ep' writes state \(env.episode\) inside a loop that ends on a "
                                      r"condition: split into row groups, each group runs its own number of iterations"):
        _plan(EPISODES, "split-chain ep learn 2")


def test_a_condition_that_may_read_all_rows_is_refused() -> None:
    text = SPLIT.replace("until: gen.eos", "until: decode.len").replace(
        "len: {init: prompt.len0, next: gen.len}", "len: {init: prompt.len0, next: gen.eos}")
    with pytest.raises(Refused, match=r"the condition of loop 'decode' \('decode.len'\) is not one output of a call in "
                                      r"its body: it may read all rows"):
        _plan(text, "split-chain decode score 2")


def test_a_loop_that_ends_as_a_whole_is_not_split_and_says_why() -> None:
    text = SPLIT.replace('out: [tok, logp, eos, len], batch: {dim: 0, size: "${rows}"}}', "out: [tok, logp, eos, len]}")
    with pytest.raises(Refused, match=r"loop 'decode' ends on a condition as a whole \('gen' declares no batch:\)"):
        _plan(text, "split-chain decode score 2")


def test_splitting_inside_the_body_of_an_until_loop_is_refused_with_the_alternative() -> None:
    with pytest.raises(Refused, match=r"the condition would read the merge of every group's rows.*split-chain decode"):
        _plan(SPLIT, "split decode 2")


def test_a_split_inside_a_per_row_loop_is_refused_and_forced_through_changes_the_result() -> None:
    """The pinned failure (found.py, UNTIL_PER_ROW): merges in the body would make the loop end as a whole."""
    from rose_dsl.transforms import passes

    from .found import UNTIL_PER_ROW
    from .harness import differences, execute

    wf = load_workflow_text(UNTIL_PER_ROW.text, "wf.yaml")
    (request,) = UNTIL_PER_ROW.requests
    with pytest.raises(Refused, match=r"loop 'l1' ends on a condition per row, and would end as a whole \(its body "
                                      r"holds merge 'n2' of row groups split inside it\)"):
        apply_request(wf, request)
    forced = passes.run(passes.Pass("split-chain", passes.build_split_chain, (passes.well_formed, passes.writable)), wf,
                        [("iteration", "l1", "n2"), ("iteration", "l1", "n3")], 2)
    a, comps_a = execute(wf, "program")
    b, comps_b = execute(forced.workflow, "program")
    assert differences(wf, a, comps_a, forced.workflow, b, comps_b, forced.locate)


SIBLINGS = (FIXTURES / "until_siblings.yaml").read_text()


@pytest.mark.parametrize("requests", [("interleave decode ep",),
                                      ("split-chain decode score 2", "rewire ep before decode@0",
                                       "rewire score@0 after decode@1", "interleave ep decode@0 decode@1")])
def test_sibling_until_loops_on_different_components_take_turns_and_compute_the_declared_values(requests) -> None:
    """Independent sibling loops that end per row (a decode, an episode rollout; no shared component), taking
    turns -- also with the decode split into row groups that end on their own: every value is the declared
    workflow's, and the episodes start before the decode ended."""
    prefixes = ("lm/", "pi/")
    want = _metrics(load_workflow_text(SIBLINGS, "until.yaml"), prefixes=prefixes)
    order: list[str] = []
    assert want and _metrics(_plan(SIBLINGS, *requests), order=order, prefixes=prefixes) == want
    calls = _first_iteration(order)
    assert min(i for i, c in enumerate(calls) if ".ep." in c) < max(i for i, c in enumerate(calls) if ".gen" in c)


@pytest.mark.parametrize("request_, what", [("split-chain ep upd 2", "the nodes of a chain"),
                                            ("interleave ep upd", "the loops to interleave")])
def test_a_chain_or_interleave_across_bodies_is_refused_at_the_item_naming_both_bodies(request_, what) -> None:
    """An episode loop inside rollout epochs and a learner outside them: the refusal had no position and named
    neither item (acceptance sweep of issue 45)."""
    with pytest.raises(Refused) as err:
        _plan(EPOCHS, request_)
    line = next(n for n, row in enumerate(EPOCHS.splitlines(), 1) if "- loop: upd" in row)
    assert f"until.yaml:{line}:" in str(err.value), err.value
    assert f"{what} must be siblings (in one body): 'upd' is in 'iteration', 'ep' in 'iteration.epoch'" in str(err.value)


NESTED = (FIXTURES / "until_nested.yaml").read_text()


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_per_row_loop_inside_a_loop_that_ends_as_a_whole_splits_into_groups(backend, request) -> None:
    """`split-chain decode score 2` on a decode inside a count loop inside rounds that end on a scalar gate:
    each run of the decode is copied per row group, the rounds still end on the declared gate, and every
    value is the declared workflow's, on both backends."""
    prefixes = ("lm/", "gate/")
    want = _metrics(load_workflow_text(NESTED, "until.yaml"), prefixes=prefixes)
    assert len({m["gate/rounds"] for m in want}) > 1  # the gate ends the rounds before their bound in some iteration
    if backend == "ray":
        request.getfixturevalue("ray_session")
    got = _metrics(_plan(NESTED, "split-chain decode score 2"), backend, prefixes=prefixes)
    assert got == want


TURNS = (FIXTURES / "until_turns.yaml").read_text()


@pytest.mark.parametrize("backend, requests", [
    ("local", ("split-chain turn score 2",)),
    ("local", ("split-chain turn score 3", "rewire score@0 after turn@2", "rewire score@1 after turn@2",
               "interleave turn@0 turn@1 turn@2")),
])  # on Ray: tests/interpreter/test_until_runtime.py (in its module's Ray session)
def test_an_agents_turn_loop_split_into_groups_computes_the_declared_values(backend, requests) -> None:
    """A per-row turn loop around a per-row decode loop, each turn a decode then a tool call on the rows still
    in a turn: copied per row group with its scorer, and the groups' turns interleaved (one group's tool
    call runs while another group decodes), every value is the declared workflow's, bit for bit."""
    if backend == "ray":
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    try:
        want = _metrics(load_workflow_text(TURNS, "until.yaml"))
        order: list[str] = []
        got = _metrics(_plan(TURNS, *requests), backend, order=order)
    finally:
        if backend == "ray":
            ray.shutdown()
    assert want and got == want
    if "interleave" in requests[-1]:  # another group decodes right after group 0's first tool call is sent
        calls = _first_iteration(order)
        at = next(i for i, c in enumerate(calls) if c.startswith("iteration.turn@0.call"))
        assert calls[at + 1].startswith(("iteration.turn@1.decode.gen", "iteration.turn@2.decode.gen")), calls[:24]
