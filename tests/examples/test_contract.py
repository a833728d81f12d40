"""The example components against the component contract's types (`interpreter/contract.py`), checked by
a type checker: mypy must accept every component as the protocols it claims, and must reject one that
lacks a method (so the check bites). Plus the construction rule rose applies at run time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from interpreter.contract import Closable, ConstructionContext, ReportsMetrics, Stateful

ROOT = Path(__file__).resolve().parents[2]

# component class -> the protocols it implements (imports resolved by mypy from the repo root)
CLAIMS = {
    "examples.embodied.policy:FlowPolicy": ("Stateful", "ReportsMetrics"),
    "examples.embodied.ppo:PPOTrainer": ("Stateful", "ReportsMetrics"),
    "examples.embodied.grpo:GRPOTrainer": ("Stateful", "ReportsMetrics"),
    "examples.embodied.sim_reacher:ReacherVecSim": ("Stateful", "ReportsMetrics", "Closable"),
    "examples.embodied.sim_metaworld:MetaWorldVecSim": ("Stateful", "ReportsMetrics", "Closable"),
    "examples.embodied.sim_mjx:ReacherMjxSim": ("Stateful", "ReportsMetrics"),
    "examples.llm.generator:Generator": ("Stateful", "ReportsMetrics"),
    "examples.llm.learner:GRPOLearner": ("Stateful", "ReportsMetrics"),
    "examples.llm.reward:RewardPool": ("ReportsMetrics", "Closable"),
    "examples.bench.load:MatmulLoad": ("ReportsMetrics",),
}
CONFIG = """\
[mypy]
follow_imports = silent
ignore_missing_imports = True
[mypy-torch.*,numpy.*,gymnasium.*,mujoco.*,jax.*,metaworld.*,ray.*,OpenGL.*,scipy.*]
follow_imports = skip
"""


def _probe(claims: dict[str, tuple[str, ...]]) -> str:
    lines = ["from interpreter.contract import Closable, ReportsMetrics, Stateful"]
    body = []
    for i, (impl, protocols) in enumerate(claims.items()):
        module, cls = impl.split(":")
        lines.append(f"from {module} import {cls} as C{i}")
        body += [f"    p{i}_{p}: {p} = c{i}" for p in protocols]
    args = ", ".join(f"c{i}: C{i}" for i in range(len(claims)))
    return "\n".join(lines) + f"\n\n\ndef check({args}) -> None:\n" + "\n".join(body) + "\n"


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                      capture_output=True).returncode:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    (tmp_path / "probe.py").write_text(source)
    (tmp_path / "mypy.ini").write_text(CONFIG)
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"),
                           "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "probe.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_example_components_satisfy_the_contract_types(tmp_path: Path) -> None:
    res = _mypy(tmp_path, _probe(CLAIMS))
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_type_check_rejects_a_missing_method(tmp_path: Path) -> None:
    source = _probe({"examples.embodied.policy:FlowPolicy": ("Closable",)})  # the policy has no close()
    res = _mypy(tmp_path, source)
    assert res.returncode == 1 and "Closable" in res.stdout, res.stdout + res.stderr


def test_runtime_view_matches_and_construction_context() -> None:
    class Sim:
        def __init__(self, n: int, device: str = "cpu", seed: int = 0, replica: int = 0, replicas: int = 1):
            self.kw = dict(n=n, device=device, seed=seed, replica=replica, replicas=replicas)

        def get_state(self, name: str) -> dict:
            return {}

        def set_state(self, name: str, value: dict) -> None:
            pass

    class Plain:
        def __init__(self, n: int) -> None:
            self.n = n

    ctx = ConstructionContext(device="cuda", seed=7, replica=1, replicas=2)
    assert ctx.kwargs(Sim, {"n": 3}) == {"n": 3, "device": "cuda", "seed": 7, "replica": 1, "replicas": 2}
    assert ctx.kwargs(Sim, {"n": 3, "seed": 1})["seed"] == 1  # args win over device and seed
    assert ctx.kwargs(Plain, {"n": 3}) == {"n": 3}  # only what the constructor asks for
    assert isinstance(Sim(1), Stateful) and not isinstance(Plain(1), Stateful)
    assert not isinstance(Plain(1), ReportsMetrics | Closable)
    text = textwrap.dedent(_probe({"examples.embodied.policy:FlowPolicy": ("Stateful",)}))
    assert "p0_Stateful: Stateful = c0" in text
