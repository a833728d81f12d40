"""How long moving a component's declared state between processes takes: through the driver (what
`RayBackend.replace_actor` did until 2026-12-03: `get_states` fetched by the driver, sent back with
`set_states`) against by reference (`export_states`: the driver fetches only the size, the state goes
through Ray's object store), and a whole `replace_actor` (stop, start, state moved, graph recompiled).

Stage 2 moves the trainer to a new process for each quota it tries and for each block of its validation:
on Meta-World that state is ~4 GB (fp32 weights + Adam).

    python benchmarks/state_transfer.py --gb 4 --rounds 3 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from benchmarks.lib.common import machine, versions


class BigState:
    """A component holding `gb` GB of fp32 state on its device (half 'weights', half 'optimizer')."""

    def __init__(self, gb: float = 1.0, device: str = "cpu") -> None:
        import torch

        n = int(gb * (1 << 30) / 4 / 2)
        self.device = torch.device(device)
        self.state = {"weights": torch.randn(n, device=self.device), "optimizer": torch.randn(n, device=self.device)}

    def step(self) -> dict[str, Any]:
        self.state["weights"].mul_(0.999)
        return {"y": float(self.state["weights"][0])}

    def get_state(self, name: str) -> Any:
        return self.state

    def set_state(self, name: str, value: Any) -> None:
        self.state = {k: v.to(self.device) for k, v in value.items()}


WORKFLOW = """
rose: 1
name: state-transfer
components:
  big: {{impl: "benchmarks.state_transfer:BigState", args: {{gb: {gb}}}, device: {device}, state: [s]}}
iteration:
  count: 10
  body:
    - {{node: step, call: big.step, out: [y], state: {{s: update}}}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--out", default=None)
    ns = parser.parse_args()
    import ray

    from interpreter.ray_backend import RayBackend
    from interpreter.schedule import Schedule
    from rose_dsl import load_workflow_text

    wf = load_workflow_text(WORKFLOW.format(gb=ns.gb, device=ns.device), "state_transfer.yaml")
    sch = Schedule(wf)
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    be = RayBackend(wf, ("benchmarks.",), sch.program.loops_of)
    rows: dict[str, list[float]] = {"driver": [], "by_reference": [], "replace_actor": []}
    try:
        be.compile(sch)
        be.execute_iteration(0, 600)
        for _ in range(ns.rounds):  # interleaved: driver, by reference, a whole replace_actor
            t = time.perf_counter()
            states = be.control("big", "get_states")
            be.control("big", "set_states", states)
            rows["driver"].append(time.perf_counter() - t)
            del states
            t = time.perf_counter()
            size, ref = be.actors["big"].export_states.options(num_returns=2).remote()
            ray.get(size)
            be.control("big", "set_states", ref)
            rows["by_reference"].append(time.perf_counter() - t)
            del ref
            t = time.perf_counter()
            be.replace_actor("big", None)
            rows["replace_actor"].append(time.perf_counter() - t)
        be.execute_iteration(1, 600)
    finally:
        be.shutdown()
        ray.shutdown()
    out = {"benchmark": "state_transfer", "gb": ns.gb, "device": ns.device, "rounds": ns.rounds,
           "seconds": rows, "median_s": {k: statistics.median(v) for k, v in rows.items()},
           "machine": machine(), "versions": versions()}
    print(json.dumps(out["median_s"]))
    if ns.out:
        with open(ns.out, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
