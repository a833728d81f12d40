"""`benchmarks/agent_shape.py`'s figures (issue 62's shape check) on a hand-made iteration of the declared
agent workflow: the shares of generation and tool wait, and the lower bound with unlimited overlap -- the
larger of the critical path and the busiest process's busy time. (The script's run itself is checked by
hand: `DEVICE=cpu bash benchmarks/agent_shape_gpu.sh`, about a minute on the 2-core machine.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.agent_shape import shape
from rose_dsl import load_workflow
from rose_dsl.measurement import Call, IterationRun, call_identity

WF = load_workflow(Path(__file__).resolve().parents[2] / "workflows" / "llm_agent_tools.yaml", {"max_turns": 2})
MS = 1_000_000


def _run(k: int) -> IterationRun:
    """sample 1, start 1, two turns of act 20 + tool 15, finish 1, ref 4 beside score 2, learn 2 x 5, publish 1,
    sync 1 (ms): 89 ms; score runs beside ref."""
    identity = call_identity(WF)
    plan = [("sample", "prompts", (), 1), ("start", "agent", (), 1), ("turn.act", "agent", (0,), 20),
            ("turn.tool", "tools", (0,), 15), ("turn.act", "agent", (1,), 20), ("turn.tool", "tools", (1,), 15),
            ("finish", "agent", (), 1), ("ref", "reference", (), 4), ("score", "reward", (), 2),
            ("learn.step", "learner", (0,), 5), ("learn.step", "learner", (1,), 5), ("publish", "learner", (), 1),
            ("sync", "agent", (), 1)]
    calls, t = [], 0
    for node, comp, idx, ms in plan:
        start = t - 4 * MS if node == "score" else t  # score runs beside ref
        end = start + ms * MS
        path = f"iteration.{node}"
        calls.append(Call(path, comp, k, (k, *idx), start, end, None, None, *identity[path]))
        t = max(t, end)
    return IterationRun(t / 1e9, tuple(calls), 0, t, k)


def test_the_shares_and_the_lower_bound() -> None:
    doc = shape(WF, [_run(1), _run(2)], "turn.act", "turn.tool")
    assert doc["iteration_s"] == pytest.approx(0.089)
    assert doc["generation_share"] == pytest.approx(40 / 89) and doc["tool_share"] == pytest.approx(30 / 89)
    assert doc["shape_ok"]  # 45% >= 40%, 34% >= 30%
    # the critical path is the whole chain but for score (beside ref); the agent is busy 43 ms
    assert doc["critical_path_s"] == pytest.approx(0.089)
    assert doc["busiest_process_s"] == pytest.approx(0.043) and doc["iterations"][0]["busiest_process"] == "agent"
    assert doc["lower_bound_s"] == pytest.approx(0.089) and doc["speedup_bound"] == pytest.approx(1.0)
    assert doc["critical_path"][:4] == ["sample", "start", "turn.act[0]", "turn.tool[0]"]


def test_nothing_timed_is_an_error() -> None:
    assert "error" in shape(WF, [], "turn.act", "turn.tool")
