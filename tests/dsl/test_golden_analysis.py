"""Golden tests of the analysis of the shipped workflows: loop kinds, edges with their reasons, and the
policy-version rule. Regenerate with ROSE_UPDATE_GOLDEN=1 after an intended change, and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rose_dsl import load_workflow
from rose_dsl.analysis import analyze, invocation_graph
from rose_dsl.semantics import Invocation

from .golden_text import analysis_text

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.parametrize("name", ["embodied_ppo", "llm_grpo", "until"])
def test_analysis_matches_golden(name: str) -> None:
    path = ROOT / "workflows" / f"{name}.yaml"
    wf = load_workflow(path if path.exists() else ROOT / "tests" / "dsl" / "fixtures" / f"{name}.yaml")
    text = analysis_text(analyze(wf, explain=True))
    golden = GOLDEN / f"{name}.analysis.txt"
    if os.environ.get("ROSE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def _ppo():
    return load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"steps": 3, "epochs": 3})


def test_loop_kinds_of_ppo() -> None:
    kinds = {".".join(p): k.kind for p, k in analyze(_ppo()).loops.items()}
    assert kinds == {
        "iteration": "dependent",
        "iteration.epoch": "free",  # reset refreshes the episode; rollout weights are only read
        "iteration.epoch.step": "dependent",  # obs is carried
        "iteration.epoch.step.act.denoise": "dependent",
        "iteration.update": "dependent",  # each update starts from the previous weights
    }


def test_training_on_epoch_j_depends_on_epoch_j_only() -> None:
    """A consumer of epoch[update.i] depends on that iteration of epoch, not on the whole loop."""
    g = invocation_graph(_ppo(), iterations=1)
    for j in range(3):
        sgd = Invocation(("iteration", "update", "sgd"), (0, j))
        epochs_read = {p.indices[1] for p in g.producers(sgd) if p.path[1] == "epoch"}
        assert epochs_read == {j}, (j, epochs_read)


def test_policy_version_rule() -> None:
    """Rollout in RL iteration k reads the weights refreshed by the sync of iteration k-1; the sync of
    iteration k waits for every rollout read of iteration k (it replaces the weights in place)."""
    g = invocation_graph(_ppo(), iterations=3)
    acts = [i for i in g.order if i.path[-1] == "act"]
    syncs = {i.indices[0]: i for i in g.order if i.path[-1] == "sync"}
    for act in acts:
        k = act.indices[0]
        state_producers = {p for p, deps in g.deps[act].items() if any(d.kind == "state" for d in deps)}
        if k == 0:
            assert state_producers == set()
        else:
            assert state_producers == {syncs[k - 1]}
        assert act in g.producers(syncs[k])


def test_refresh_breaks_the_chain() -> None:
    """reset (refresh) of epoch e+1 observes nothing of epoch e: only an ordering edge protects the
    in-place object, and no data flows."""
    g = invocation_graph(_ppo(), iterations=1)
    reset1 = Invocation(("iteration", "epoch", "reset"), (0, 1))
    deps = [d for ds in g.deps[reset1].values() for d in ds]
    assert deps and all(d.kind == "state" and not d.flow for d in deps)


def test_the_generated_schema_validator_is_current() -> None:
    """rose_dsl/_schema_v1_fast.py is the schema compiled by fastjsonschema (the fast path of validation);
    regenerate it with `python -m rose_dsl.schema` after changing the schema."""
    from rose_dsl.schema import fast_validator_source

    assert (ROOT / "rose_dsl" / "_schema_v1_fast.py").read_text() == fast_validator_source(1)
