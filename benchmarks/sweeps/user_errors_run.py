"""Run every command of commands.txt (one at a time) and keep exit code and output in raw.json."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "benchmarks" / "results" / "user_errors_2026-12-05e"  # user_errors_gen.py writes it
only = set(sys.argv[1:])
out = json.loads((HERE / "raw.json").read_text()) if (HERE / "raw.json").exists() else {}
os.makedirs("/tmp/ue_e", exist_ok=True)
seen = {}
for line in (HERE / "commands.txt").read_text().splitlines():
    name, args = line.split("\t")
    seen[name] = seen.get(name, 0) + 1
    if seen[name] > 1:
        name = f"{name}#{seen[name]}"
    if only and name not in only:
        continue
    cmd = f"PYTHONPATH=$PWD timeout 120 python3 -m rose_cli {args}"
    t = time.time()
    p = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, errors="replace")
    out[name] = {"cmd": cmd, "rc": p.returncode, "stdout": p.stdout[-6000:], "stderr": p.stderr[-6000:], "s": round(time.time() - t, 1)}
    print(name, p.returncode, out[name]["s"], flush=True)
    (HERE / "raw.json").write_text(json.dumps(out, indent=1))
