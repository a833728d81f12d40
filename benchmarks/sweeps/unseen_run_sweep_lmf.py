"""Wrapper around the third sweep's driver (run in place, not copied): the same sweep with `--local-max-fraction F`
added to every `rose optimize` (the driver has no such option), so that comparison graphs are measured by local
trials on captured inputs and state snapshots instead of complete iterations.

    LMF=1 WORK=/tmp/sw4/work_lmf1 python3 benchmarks/sweeps/unseen_run_sweep_lmf.py --workflows y1_three_nested.yaml,... --out results_lmf1.json
"""
import importlib.util
import os
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "run_sweep", Path(__file__).resolve().parent / "unseen_run_sweep.py")
run_sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_sweep)
_rose = run_sweep.rose


def rose(*args, timeout=300):
    if args and args[0] == "optimize":
        args = (*args, "--local-max-fraction", os.environ.get("LMF", "1"))
    return _rose(*args, timeout=timeout)


run_sweep.rose = rose
if __name__ == "__main__":
    sys.exit(run_sweep.main())
