"""GPU faults on purpose, for the fault runs on the GPU machine (`benchmarks/gpu_faults.sh`).

`FaultyLoad` is `MatmulLoad` with a state (a running sum of its outputs, so a restore from a checkpoint
is visible) and one fault at call `at_call`, once per `marker` file:

* `kernel`: an out-of-bounds index in a CUDA kernel -- a device-side assert, CUDA's sticky error: the
  process lives on, its context is lost, and under MPS every client on the GPU gets the fault;
* `kill`: SIGKILL of its own process in the middle of a call;
* `hang`: a call that never returns (the watchdog's case).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch

from .load import MatmulLoad


class FaultyLoad(MatmulLoad):
    def __init__(self, marker: str, kind: str = "kernel", at_call: int = 3, n: int = 4096, iters: int = 20,
                 device: str = "cpu", seed: int = 0) -> None:
        if kind not in ("kernel", "kill", "hang", "none"):
            raise ValueError(f"kind must be kernel, kill, hang or none; got {kind!r}")
        super().__init__(n, iters, device, seed)
        self.marker, self.kind, self.at_call = marker, kind, int(at_call)
        self.total = torch.zeros(())
        self.count = 0

    def work(self, x: Any = 0) -> dict[str, Any]:
        self.count += 1
        if self.count == self.at_call and self.kind != "none" and not Path(self.marker).exists():
            Path(self.marker).write_text(f"{self.kind} in pid {os.getpid()}")
            if self.kind == "kernel":
                table = torch.zeros(4, device=self.device)
                bad = torch.tensor([1 << 20], device=self.device)
                table[bad] += 1  # out of bounds on the GPU: "CUDA error: device-side assert triggered"
                torch.cuda.synchronize()
            elif self.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                while True:
                    time.sleep(1)
        y = super().work(x)["y"]
        self.total = self.total + y
        return {"y": y}

    def get_state(self, name: str) -> Any:
        return {"total": self.total.clone(), "count": self.count}

    def set_state(self, name: str, value: Any) -> None:
        self.total, self.count = value["total"].clone(), int(value["count"])
