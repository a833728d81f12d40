"""(First unseen-workflow sweep.) Runs benchmarks/optimize_cpu.py unchanged, but keeps its work directory (plans, reports, every
`rose execute` run directory) under WORK instead of deleting it, so the plans and metrics can be checked."""
import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

WORK = Path(os.environ.get("WORK", "/tmp/sw/work"))
WORK.mkdir(parents=True, exist_ok=True)
tempfile.mkdtemp = lambda *a, **k: str(WORK)
shutil.rmtree = lambda *a, **k: None
sys.argv = ["optimize_cpu.py", *sys.argv[1:]]
runpy.run_path(str(Path(__file__).resolve().parents[1] / "optimize_cpu.py"), run_name="__main__")
