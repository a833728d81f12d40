"""The GPU calibration script in its CPU smoke mode: every section runs (or says why it is skipped) and
the JSON holds what the sizing needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_measures_policy_phases_and_trainer_variants(tmp_path: Path) -> None:
    out = tmp_path / "shapes.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "workload_shapes.py"), "--smoke", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["smoke"] and doc["device"] == "cpu" and doc["versions"]["torch"]
    tiny = doc["policy"]["tiny"]
    assert tiny["params"] > 0 and set(tiny["batches"]) == {"8", "4"}
    row = tiny["batches"]["8"]
    for phase in ("backbone", "flow_step_eager", "denoise_loop_eager", "head", "act_eager"):
        assert row[f"{phase}_ms"]["n"] == 2 and row[f"{phase}_ms"]["median"] > 0
    assert "4/8" in tiny["halving_ratio"]
    variants = doc["trainer"]["variants"]
    assert len(variants) == 5 and all(v["update_s"] > 0 for v in variants.values())
    frozen = [v for v in variants.values() if v["trainable_blocks"] == 0]
    assert frozen and frozen[0]["trainable_params"] < variants["all_recompute_mb128_e1"]["trainable_params"]
    for section in ("mjx", "metaworld"):  # measured, or skipped with the reason (never a traceback)
        assert "rows" in doc[section] or "skipped" in doc[section], doc[section]
    assert "policy" in proc.stdout  # the table printed last
