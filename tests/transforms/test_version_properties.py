"""Issue 58's property: on random chains of syncs, relays and fan-outs (the actor's rollout a single call or a
loop that ends on a condition, reading the weights every trip) with random budgets and random
`defer`/`ahead` requests, every plan rose accepts, executed on the local backend with version-logging
components (`tests.async_fakes`: every weight carries the learner update it comes from), reads values at
most as old as proved, and the proof within the budget: measured lag <= proved lag <= budget, read by read
and iteration by iteration. Every refused plan names the read (and, for a lag through the data flow, the
chain of versions).

The measured lag of a read is the declared run's stamp minus the plan's, both executed. The default
profile draws a few examples (each runs two short executions); `--hypothesis-profile=long` many more.
Failures found are pinned in `found.py` (`VERSION_CASES`) and re-checked on every run. Not vacuous: with
the version check switched off (`legality.check_version_lags`) it finds the issue's budget-1 relay feeding
a budget-0 actor within the default profile's examples.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text
from rose_dsl.ir import Workflow
from rose_dsl.transforms import Refused, apply, plan_differences
from rose_dsl.versions import version_proof

from .found import VERSION_CASES

COUNT = 5


@dataclass(frozen=True)
class Chain:
    relays: int  # relays between the learner and the actor
    budgets: tuple[int, ...]  # max_staleness of relay1..relayN, then of the actor, then of actor2
    fan: bool  # a second actor synced from the first relay
    requests: tuple[str, ...]
    until: bool = False  # the actor's rollout is a loop that ends on a condition, reading the weights every trip
    split: bool = False  # the actor's rollout is a loop of 2 trips, which `split-time roll 2` may split in time

    def text(self) -> str:
        n = self.relays
        comps = ['  learner: {impl: "tests.async_fakes:Learner", state: [weights]}']
        comps += [f'  relay{i}: {{impl: "tests.async_fakes:Relay", state: {{weights: {{max_staleness: {self.budgets[i - 1]}}}}}}}'
                  for i in range(1, n + 1)]
        comps.append(f'  actor: {{impl: "tests.async_fakes:Generator", state: {{weights: {{max_staleness: {self.budgets[n]}}}}}}}')
        body = ["    - {node: act, call: actor.generate, in: {it: iteration.i}, state: {weights: read}, out: [rollouts]}"]
        rollouts = "act.rollouts"
        if self.until:
            body = ["    - loop: roll", "      count: 3", "      until: act.done", "      body:",
                    "        - {node: act, call: actor.act, in: {it: iteration.i, t: roll.i}, state: {weights: read}, "
                    "out: [rollouts, done]}", '      collect: {rollouts: "stack(roll[*].act.rollouts)"}']
            rollouts = "roll.rollouts"
        elif self.split:
            body = ["    - loop: roll", "      count: 2", "      body:",
                    "        - {node: act, call: actor.act, in: {it: iteration.i, t: roll.i}, state: {weights: read}, "
                    "out: [rollouts, done]}"]
            rollouts = '"stack(roll[*].act.rollouts)"'
        if self.fan:
            comps.append(f'  actor2: {{impl: "tests.async_fakes:Generator", state: {{weights: {{max_staleness: {self.budgets[n + 1]}}}}}}}')
            body.append("    - {node: act2, call: actor2.generate, in: {it: iteration.i}, state: {weights: read}, out: [rollouts]}")
        body += [f"    - {{node: learn, call: learner.update, in: {{rollouts: {rollouts}, it: iteration.i}}, state: {{weights: update}}}}",
                 "    - {node: publish, call: learner.get, state: {weights: read}, out: [w]}"]
        source = "publish.w"
        for i in range(1, n + 1):
            body += [f"    - {{node: sync{i}, call: relay{i}.load, in: {{w: {source}, it: iteration.i}}, state: {{weights: refresh}}}}",
                     f"    - {{node: fwd{i}, call: relay{i}.get, in: {{it: iteration.i}}, state: {{weights: read}}, out: [w]}}"]
            source = f"fwd{i}.w"
        body.append(f"    - {{node: sync{n + 1}, call: actor.load, in: {{w: {source}, it: iteration.i}}, state: {{weights: refresh}}}}")
        if self.fan:
            body.append("    - {node: syncB, call: actor2.load, in: {w: fwd1.w, it: iteration.i}, state: {weights: refresh}}")
        return ("rose: 1\nname: version-chain\ncomponents:\n" + "\n".join(comps) + f"\niteration:\n  count: {COUNT}\n"
                "  body:\n" + "\n".join(body) + "\n")


@st.composite
def chains(draw) -> Chain:
    n = draw(st.integers(1, 3))
    fan = draw(st.booleans())
    budgets = tuple(draw(st.sampled_from([0, 1, 1, 2, 2])) for _ in range(n + 2))  # mostly some budget: plans to run
    until = draw(st.booleans())
    split = not until and draw(st.booleans())
    pool = [f"defer sync{i} {k}" for i in range(1, n + 2) for k in (1, 2)] + ([] if until or split else ["ahead act"]) + \
           [f"ahead fwd{i}" for i in range(1, n + 1)] + (["defer syncB 1", "ahead act2"] if fan else []) + \
           (["split-time roll 2"] if split else [])
    requests = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
    if split and "split-time roll 2" not in requests:  # (drawn like any request, it came in ~1 example of 100)
        requests.insert(draw(st.integers(0, len(requests))), "split-time roll 2")
    return Chain(n, budgets, fan, tuple(requests), until, split)


READERS = {"act": "actor", "act2": "actor2"}  # node -> component that logs its reads; fwdI -> relayI


def _stamps(wf: Workflow, backend: str = "local") -> dict[tuple[str, int], int]:
    """(reading node, RL iteration) -> the learner update the weights it read come from (-1: initial), from
    each iteration's metrics line (`COMPONENT/stamp`: which also checks that a line holds its own iteration's
    reads, whatever runs deferred or ahead) -- on Ray as on the local backend."""
    sch = Schedule(wf)
    if backend == "local":
        be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    else:
        from interpreter.backends import make_backend

        be = make_backend("ray", wf, sch, compiled=False, allowed=("tests.",), log=lambda _: None)
    try:
        results = Runner(wf, be, RunConfig(iterations=COUNT, tensorboard=False), sch).run()
    finally:
        be.shutdown()
    out: dict[tuple[str, int], int] = {}
    for r in results:
        for key, value in r.metrics.items():
            comp, _, name = key.partition("/")
            if name != "stamp":
                continue
            node = next((n for n, c in READERS.items() if c == comp), "fwd" + comp[len("relay"):] if comp.startswith("relay") else None)
            if node is not None:
                out[(node, r.iteration)] = int(value)
    return out


def _plan(wf: Workflow, requests: tuple[str, ...]) -> Workflow | Refused:
    for r in requests:
        got = apply(wf, r)
        if isinstance(got, Refused):
            return got
        wf = got.workflow
    return wf


def check(chain: Chain, backend: str = "local") -> list[str]:
    """Check one chain; returns what happened (for hypothesis' statistics and the fixed cases)."""
    wf = load_workflow_text(chain.text(), "chain.yaml")
    plan = _plan(wf, chain.requests)
    if isinstance(plan, Refused):
        seen = ["refused"]
        assert not plan.internal, plan.reason
        # the read it names: a node of the workflow, and for a lag through the data flow, its chain
        assert plan.at is not None, plan.reason
        if "max_staleness" in plan.reason and " <- " in plan.reason:
            seen.append("refused: a chain of versions")
            assert "would make " in plan.reason and " read '" in plan.reason and ": lag " in plan.reason, plan.reason
        return seen
    assert plan_differences(wf, plan) == []  # `rose validate` of the plan agrees with the rewrite
    budgets = {k: s.max_staleness for k, s in plan.state_objects().items()}
    proof: dict[tuple[str, int], tuple[int, str]] = {}  # (a read split in time: the largest lag of its groups)
    for (inv, state), p in version_proof(plan, COUNT).items():
        key = (inv.path[-1], inv.indices[0])
        proof[key] = max(proof.get(key, (p.lag, state)), (p.lag, state))
    declared, measured = _stamps(wf, backend), _stamps(plan, backend)
    assert declared.keys() == measured.keys() and len(declared) >= COUNT
    worst = 0
    for key, stamp in measured.items():
        lag = declared[key] - stamp
        if key not in proof:  # a synchronous plan (a split in time alone): nothing to prove, nothing older
            assert lag == 0, (key, lag, chain)
            continue
        proved, state = proof[key]
        assert 0 <= lag <= proved <= budgets[state], (key, lag, proved, budgets[state], chain)
        worst = max(worst, lag)
    return ["accepted", f"largest measured lag {worst}"]


@pytest.mark.slow
def test_on_ray_too(request: pytest.FixtureRequest) -> None:
    """The same property on the Ray backend (dispatching call by call, several iterations in flight): long
    profile only (`--hypothesis-profile=long`: 60 examples), since every example starts Ray actors."""
    if settings.default.max_examples <= 200:
        pytest.skip("the Ray variant runs in the long profile only (--hypothesis-profile=long)")
    request.getfixturevalue("ray_session")  # (not started for the skip)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(chains())
    def on_ray(chain: Chain) -> None:
        for what in check(chain, "ray"):
            event(what)

    on_ray()


def _pin(test):
    """Every failure the property found, as an explicit example (`found.py`)."""
    for case in VERSION_CASES:
        test = example(Chain(case.relays, case.budgets, case.fan, case.requests, case.until, case.split))(test)
    return test


# 20 by default (each runs two short executions), 1000 in the long profile
@settings(max_examples=20 if settings.default.max_examples <= 200 else settings.default.max_examples // 3,
          deadline=None, suppress_health_check=[HealthCheck.too_slow])
@_pin
@given(chains())
def test_accepted_plans_read_no_older_than_proved_and_proved_within_budget(chain: Chain) -> None:
    for what in check(chain):
        event(what)
        if "split-time roll 2" in chain.requests:
            event(f"{what}, the rollout split in time")


@pytest.mark.parametrize(("chain", "outcome"), [
    (Chain(1, (1, 1, 0), False, ("defer sync1 1", "defer sync2 1")), "refused: a chain of versions"),  # the issue's
    (Chain(1, (1, 0, 0), False, ("defer sync1 1",)), "refused: a chain of versions"),  # the issue's second
    (Chain(1, (1, 2, 0), False, ("ahead act", "defer sync1 1")), "largest measured lag 2"),  # a budget that allows it
    (Chain(2, (1, 1, 2, 1), True, ("defer sync1 1", "defer sync3 1")), "largest measured lag 2"),  # and a fan-out
    (Chain(1, (1, 1, 0), False, ("defer sync1 1", "defer sync2 1"), until=True), "refused: a chain of versions"),
    (Chain(1, (1, 2, 0), False, ("defer sync1 1", "defer sync2 1"), until=True), "largest measured lag 2"),
    (Chain(1, (1, 2, 0), False, ("split-time roll 2", "defer sync1 1", "defer sync2 1"), split=True),
     "largest measured lag 2"),  # the groups of a rollout split in time read the chain's stale copies
])
def test_the_issue_shapes_and_a_longer_chain(chain: Chain, outcome: str) -> None:
    assert outcome in check(chain)
