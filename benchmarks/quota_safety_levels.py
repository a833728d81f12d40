"""The MPS quota self-check (`interpreter/quota_safety.py`) at every level from 10% to 100% in 10% steps,
on the GPU machine, with a fresh verdict cache: which quotas rose lets a GPU component run under.

Issue 16 asks that quotas be proven safe at every level before the optimizer tunes them. On the H200
(torch 2.11.0+cu130, driver 580.159.04) some levels cannot be: cuBLAS's bf16 GEMMs are wrong there
(`benchmarks/results/quota_gemm_probe.json`). This records, per level, the SM count a client sees and the check's
verdict, next to the earlier replay of the real first PPO update at the same levels
(`quota_nan/before_fix.json`): a level the check passes must be one where that update was finite.

    # GPU machine, repository root:
    python3 benchmarks/quota_safety_levels.py --out $OUT/quota_safety_levels.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.lib.common import machine, versions  # noqa: E402
from interpreter.mps import MpsDaemon  # noqa: E402
from interpreter.quota_safety import check_quotas, machine_fingerprint  # noqa: E402


def _update_finite_before_fix() -> dict[int, bool]:
    """Level -> was the replayed first PPO update finite (the root-cause run, before the guard)."""
    path = ROOT / "benchmarks" / "results" / "quota_nan" / "before_fix.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    out: dict[int, bool] = {}
    for row in data.get("steps", []):  # the default variant per quota (others varied the SDPA backend etc.)
        if row.get("variant") == "default" and isinstance(row.get("finite"), bool):
            out[int(row["quota"])] = row["finite"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("quota_safety_levels.json"))
    ap.add_argument("--levels", default="10,20,30,40,50,60,70,80,90,100")
    ap.add_argument("--parallel", type=int, default=5,
                    help="fresh MPS clients checked side by side (each sees only its own quota's SMs)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="verdict cache to write (default: a fresh temporary one). Must not exist yet, so that "
                         "every level is measured here; pointing it at rose's own cache lets a later "
                         "`rose optimize` in the same device call reuse these verdicts")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.cache is not None and args.cache.exists():
        print(f"{args.cache} exists: this benchmark measures every level afresh", file=sys.stderr)
        return 2
    cache = args.cache or Path(tempfile.mkdtemp(prefix="rose-quota-")) / "checks.json"
    before = _update_finite_before_fix()
    rows = []
    with MpsDaemon(tempfile.mkdtemp(prefix="rose-mps-")) as mps:
        if not mps.active:
            print(f"MPS is not available: {mps.warning}", file=sys.stderr)
            return 3
        fingerprint = machine_fingerprint()
        t = time.perf_counter()
        verdicts = check_quotas(levels, mps.client_env, fingerprint=fingerprint, cache=cache, parallel=args.parallel,
                                on_verdict=lambda v: print(f"{time.perf_counter() - t:6.1f} s  {v.quota}% "
                                                           f"({v.sm_count} SMs): {'safe' if v.ok else 'UNSAFE'}, "
                                                           f"{v.detail}", flush=True))
        wall = time.perf_counter() - t
        for q in levels:
            v = verdicts[q]
            row = {"quota": q, "sm_count": v.sm_count, "safe": v.ok, "products": v.products,
                   "wrong_products": v.bad_products, "detail": v.detail,
                   "first_update_finite_before_fix": before.get(q)}
            rows.append(row)
    consistent = all(r["first_update_finite_before_fix"] is not False for r in rows if r["safe"])
    result = {"script": "benchmarks/quota_safety_levels.py", "machine": machine(), "versions": versions(),
              "fingerprint": fingerprint, "parallel": args.parallel,
              "wall_s": round(wall, 1), "levels": rows, "safe_levels": [r["quota"] for r in rows if r["safe"]],
              "every_safe_level_had_a_finite_update": consistent}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"safe: {result['safe_levels']}; every safe level had a finite first update before the fix: {consistent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
