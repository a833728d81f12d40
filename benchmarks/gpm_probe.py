"""Why does GPM SM_UTIL read low? A matmul runs in a child process for a few seconds while this process
reads several GPM metrics over windows of different lengths, with raw pynvml (no rose code), next to
nvmlDeviceGetUtilizationRates.

    python3 benchmarks/gpm_probe.py OUT.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pynvml as N

LOAD = ("import torch,time\na=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)\nb=a.clone()\n"
        "torch.cuda.synchronize()\nprint('start',flush=True)\nt=time.time()\n"
        "while time.time()-t<7:\n  c=a@b\n  torch.cuda.synchronize()\n")
METRICS = ["SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "HMMA_TENSOR_UTIL", "SM_CYCLES_ACTIVE", "SM_CYCLES_ELAPSED",
           "FP32_UTIL", "DRAM_BW_UTIL", "GRAPHICS_UTIL"]


def window(handle, seconds: float) -> dict[str, float | str]:
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(handle, s1)
    time.sleep(seconds)
    N.nvmlGpmSampleGet(handle, s2)
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(METRICS)
    mg.sample1, mg.sample2 = s1, s2
    for i, m in enumerate(METRICS):
        mg.metrics[i].metricId = getattr(N, f"NVML_GPM_METRIC_{m}")
    N.nvmlGpmMetricsGet(mg)
    out: dict[str, float | str] = {}
    for i, m in enumerate(METRICS):
        ret = int(mg.metrics[i].nvmlReturn)
        out[m] = float(mg.metrics[i].value) if ret == 0 else f"ret {ret}"
    N.nvmlGpmSampleFree(s1)
    N.nvmlGpmSampleFree(s2)
    out["utilization_gpu"] = float(N.nvmlDeviceGetUtilizationRates(handle).gpu)
    return out


def main() -> None:
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    result = {"idle": {f"{s}s": window(h, s) for s in (0.05, 0.5)}}
    proc = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    time.sleep(0.3)
    result["busy"] = {f"{s}s": window(h, s) for s in (0.02, 0.1, 0.5, 2.0)}
    proc.wait()
    json.dump(result, open(sys.argv[1], "w"), indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
