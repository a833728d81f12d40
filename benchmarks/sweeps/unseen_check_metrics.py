"""Compares the metrics of every declared and plan run the sweep kept (WORK/<workflow>/{declared,plan}-k/
metrics.jsonl): every key but timings (iteration_s, time/*, *_per_s) must be equal, iteration by iteration."""
import json
import sys
from pathlib import Path

work = Path(sys.argv[1])
def load(run):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.append({k: v for k, v in d.items() if k != "iteration_s" and not k.startswith("time/") and not k.endswith("_per_s")})
    return out
for wf in sorted(p for p in work.iterdir() if p.is_dir()):
    runs = sorted(wf.glob("*-*"))
    ref = load(runs[0])
    exact, close, diffs = 0, 0, []
    for run in runs[1:]:
        m = load(run)
        if m == ref:
            exact += 1
            continue
        bad = [(i, k, a.get(k), b.get(k)) for i, (a, b) in enumerate(zip(ref, m, strict=False)) for k in set(a) | set(b) if a.get(k) != b.get(k)]
        rel = max((abs(x - y) / max(abs(x), 1e-300) for _, _, x, y in bad if isinstance(x, float) and isinstance(y, float)), default=float("inf"))
        if len(ref) == len(m) and rel < 1e-12:
            close += 1
        diffs.append((run.name, len(bad), rel, bad[:3]))
    print(f"{wf.name}: {len(runs)} runs ({len(ref)} iterations, keys {sorted(ref[0])}); identical to {runs[0].name}: {exact}, within 1e-12: {close}")
    for d in diffs:
        print("   differs:", d)
