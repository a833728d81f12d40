"""Is NVML GPM SM_UTIL right on this GPU? A bf16 matmul loop in this process (no MPS), sampled by
`interpreter.gpu_activity.ActivitySampler` with GPM and with the utilization fallback side by side.

    python3 benchmarks/gpm_check.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from interpreter.gpu_activity import ActivitySampler  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    samplers = {name: ActivitySampler(0, prefer=name) for name in ("gpm", "utilization")}
    for s in samplers.values():
        s.open()
        s.start()
    time.sleep(0.5)
    idle = (time.perf_counter_ns() - 400_000_000, time.perf_counter_ns())
    t0 = time.perf_counter_ns()
    n = 0
    while time.perf_counter_ns() - t0 < 2e9:
        c = a @ b
        n += 1
        if n % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    busy = (t0 + 200_000_000, time.perf_counter_ns())
    tflops = 2 * 8192**3 * n / ((busy[1] - t0) / 1e9) / 1e12
    time.sleep(0.3)
    result = {"matmuls": n, "tflops": tflops, "sources": {}}
    for name, s in samplers.items():
        s.stop()
        result["sources"][name] = {"source": s.source, "idle": s.mean_activity([idle]), "busy": s.mean_activity([busy]),
                                   "samples": len(s.samples())}
        s.close()
    del c
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
