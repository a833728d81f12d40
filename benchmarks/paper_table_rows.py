"""The optimizer's rows of the paper table (issue 14), assembled from the runs that measured them.

    python3 benchmarks/paper_table_rows.py                # fill stage1/rose in benchmarks/results/paper_table.json
    python3 benchmarks/paper_table_rows.py --markdown     # print docs/results.md's summary table from that file

Why a script: the canonical `benchmarks/results/paper_table.json` holds the declared and hand-written rows of
one `paper_table.py` session per workload, but `rose optimize`'s plans were measured later, in sessions of
their own (on other cards), so its `stage1`/`rose` keys stayed null while the figures the README quotes lived
in six run folders. This reads those runs' JSONs (from the `results-archive` tag by default, where the raw
runs are kept: docs/results.md) and writes each row with its source files and card, so no figure is typed by
hand; docs/results.md's summary table is printed from the result (`--markdown`, checked by
tests/benchmarks/test_results_index.py).

Pooling: a row measured in several sessions on one machine pools the per-round seconds of every session
(each session interleaves the rows, so round r of every row shares the machine's state); its figure is the
median over all rounds, and its ratios divide the same session set's declared and best hand-written medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "benchmarks" / "results" / "paper_table.json"
ARCHIVE = "results-archive"
PT = "benchmarks/results/paper_table"


@dataclass(frozen=True)
class Sessions:
    """A row measured as `config` in `paper_table.py --session` runs, pooled (one machine)."""

    workload: str
    row: str  # the key it fills: stage1, rose
    config: str  # its configuration name in the session JSONs
    label: str  # what the README calls it
    files: tuple[str, ...]


SESSIONS = (
    Sessions("mjx", "stage1", "stage1", "rose: stage-1 graph (`split-time epoch 2; interleave epoch`)",
             (f"{PT}/mjx_stage1_h100_2026-12-05e/s1/paper_table.json", f"{PT}/mjx_stage1_h100_2026-12-05e/s2/paper_table.json")),
    Sessions("mjx", "rose", "rose", "rose: final plan (stage 1 + the policy at 94% from stage 2)",
             (f"{PT}/mjx_stage1_h100_2026-12-05e/s1/paper_table.json", f"{PT}/mjx_stage1_h100_2026-12-05e/s2/paper_table.json")),
    Sessions("llm", "rose", "rose", "rose: `split-chain generate ref score 4`",
             tuple(f"{PT}/llm_rose_h100_2026-12-05c/{r}/paper_table.json" for r in ("r3", "r8", "r16"))),
)
# Meta-World: `rose optimize --layout sim_replicas=8,4` chose sim8 by itself (its layout trial against the
# declared graph), and a `rose compare` session put its plan beside sim8.
METAWORLD_RUN = "benchmarks/results/optimize_gpu_metaworld/run_2026-12-03"

Reader = Callable[[str], Any]


def archive_reader(ref: str, root: Path = ROOT) -> Reader:
    """Read a JSON file as committed at `ref` (`git show REF:PATH`)."""
    def read(path: str) -> Any:
        out = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=root, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"cannot read {ref}:{path}: {out.stderr.strip()} (fetch the tag: git fetch --tags)")
        return json.loads(out.stdout)
    return read


def dir_reader(root: Path) -> Reader:
    """Read a JSON file from a checkout or `git archive` extraction of the archive."""
    return lambda path: json.loads((root / path).read_text())


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _rounds(doc: dict[str, Any], workload: str, config: str) -> list[float]:
    cfg = doc["workloads"][workload]["configs"][config]
    return [s for rnd in cfg["rounds_seconds"] for s in rnd]


def _card(docs: Sequence[dict[str, Any]]) -> str:
    cards = {g["name"] for d in docs for g in d["machine"].get("gpus", [])}
    if len(cards) != 1:
        raise ValueError(f"a pooled row must come from one kind of card, got {sorted(cards)}")
    return cards.pop()


def session_row(spec: Sessions, read: Reader) -> dict[str, Any]:
    """One pooled row with its sessions' declared and best hand-written medians and its sources."""
    docs = [read(f) for f in spec.files]
    configs = docs[0]["workloads"][spec.workload]["configs"]
    hand = [name for name, c in configs.items() if c["kind"] == "hand"]
    row = _rounds_summary([s for d in docs for s in _rounds(d, spec.workload, spec.config)])
    declared = _rounds_summary([s for d in docs for s in _rounds(d, spec.workload, "declared")])
    best = None
    if hand:
        pooled = {h: _rounds_summary([s for d in docs for s in _rounds(d, spec.workload, h)]) for h in hand}
        name = min(pooled, key=lambda h: pooled[h]["iteration_s"])
        best = {"name": name, **pooled[name]}
    sm = [d["workloads"][spec.workload]["configs"][spec.config].get("sm_activity") for d in docs]
    return {
        "label": spec.label, "config": spec.config, "card": _card(docs), "sessions": len(docs),
        "sources": [f"{ARCHIVE}:{f}" for f in spec.files], **row,
        "sm_activity": _median([s for s in sm if s is not None]) if any(s is not None for s in sm) else None,
        "declared": declared, "best_hand": best,
        "ratio_to_declared": declared["iteration_s"] / row["iteration_s"],
        "ratio_to_best_hand": best["iteration_s"] / row["iteration_s"] if best else None,
    }


def _rounds_summary(seconds: list[float]) -> dict[str, Any]:
    return {"rounds": len(seconds), "iteration_s": _median(seconds), "rounds_seconds": seconds}


def metaworld_row(read: Reader) -> dict[str, Any]:
    """`rose optimize`'s Meta-World plan: its layout trial against declared, and its session beside sim8."""
    report = read(f"{METAWORLD_RUN}/report/report.json")
    compare = read(f"{METAWORLD_RUN}/compare_rose_vs_sim8.json")
    chosen = next(c for c in report["layout"]["candidates"] if c.get("accepted"))
    by_label = {r["label"]: [it["seconds"] for it in r["iterations"]] for r in compare["rows"]}
    plan, sim8 = _rounds_summary(by_label["rose"]), _rounds_summary(by_label["declared"])
    return {
        "label": f"rose: `rose optimize --layout` chose sim_replicas={chosen['values']['sim_replicas']} by itself",
        "config": "rose", "card": report["machine"]["gpu"], "sessions": 1,
        "sources": [f"{ARCHIVE}:{METAWORLD_RUN}/report/report.json",
                    f"{ARCHIVE}:{METAWORLD_RUN}/compare_rose_vs_sim8.json"],
        **plan, "sm_activity": None,
        "declared": None, "best_hand": {"name": "sim8", **sim8},
        "ratio_to_declared": chosen["speedup"],
        "ratio_to_declared_note": "the optimizer's own layout trial: sim_replicas=8 against the declared graph, "
                                  "interleaved complete iterations",
        "ratio_to_best_hand": sim8["iteration_s"] / plan["iteration_s"],
    }


def assemble(doc: dict[str, Any], read: Reader) -> dict[str, Any]:
    """`doc` (the canonical table) with every workload's stage1/rose rows filled from their runs."""
    for spec in SESSIONS:
        doc["workloads"][spec.workload][spec.row] = session_row(spec, read)
    doc["workloads"]["metaworld"]["rose"] = metaworld_row(read)
    for run in doc.get("runs", []):  # the sessions the base rows came from are archived too
        if run.get("file", "").startswith("benchmarks/results/"):
            run["file"] = f"{ARCHIVE}:{run['file']}"
    for wl in doc["workloads"].values():
        # the timelines live beside the canonical table (benchmarks/results/), not in its old folder
        wl["timelines"] = {k: v and f"benchmarks/results/{Path(v).name}" for k, v in wl.get("timelines", {}).items()}
        wl["optimizer_note"] = ("stage1/rose: rose optimize's plans measured beside declared and the best "
                                "hand-written configuration in sessions of their own (sources, card), filled by "
                                "benchmarks/paper_table_rows.py; 'optimizer': the optimizer's own report of 2026-12-03")
    doc["assembled_by"] = "benchmarks/paper_table_rows.py"
    return doc


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _short(card: str) -> str:
    return "H100" if "H100" in card else "H200" if "H200" in card else card


def _base_card(doc: dict[str, Any], workload: str) -> str:
    """The card of the latest table session that measured `workload`'s declared and hand-written rows."""
    for run in reversed(doc.get("runs", [])):
        argv = run.get("argv", [])
        if "--workloads" in argv and workload in argv[argv.index("--workloads") + 1].split(","):
            return run["machine"]["gpus"][0]["name"]
    raise ValueError(f"no session of {workload} in the table's runs")


def markdown(doc: dict[str, Any]) -> str:
    """docs/results.md's summary table: per workload, the session the optimizer's rows were measured in."""
    lines = ["| workload (card, rounds pooled) | configuration | s / iteration | vs declared | vs best hand-written |",
             "| --- | --- | --- | --- | --- |"]
    wls = doc["workloads"]

    def add(where: str, what: str, secs: float, vs_d: float | None, vs_b: float | None) -> None:
        lines.append(f"| {where} | {what} | {_fmt(secs)} | {_fmt(vs_d)} | {_fmt(vs_b)} |")

    mjx = wls["mjx"]
    s = mjx["rose"]
    where = f"MJX ({_short(s['card'])}, {s['declared']['rounds']} rounds)"
    best = s["best_hand"]
    add(where, "declared", s["declared"]["iteration_s"], 1.0, best["iteration_s"] / s["declared"]["iteration_s"])
    add(where, f"{best['name']} (best hand-written)", best["iteration_s"],
        s["declared"]["iteration_s"] / best["iteration_s"], 1.0)
    for key in ("stage1", "rose"):
        r = mjx[key]
        add(where, r["label"], r["iteration_s"], r["ratio_to_declared"], r["ratio_to_best_hand"])
    mw = wls["metaworld"]
    d, b = mw["declared"], mw["best_hand"]
    where = f"Meta-World ({_short(_base_card(doc, 'metaworld'))}, {d['iteration_s']['n']} rounds)"
    add(where, "declared", d["iteration_s"]["median"], 1.0, d["ratio_to_best_hand"])
    add(where, f"{b['name']} (best hand-written)", b["iteration_s"]["median"], b["ratio_to_declared"], 1.0)
    r = mw["rose"]
    add(f"Meta-World ({_short(r['card'])}, {r['rounds']} rounds)", r["label"] + " (vs declared: its layout trial)",
        r["iteration_s"], r["ratio_to_declared"], r["ratio_to_best_hand"])
    r = wls["llm"]["rose"]
    where = f"LLM GRPO ({_short(r['card'])}, {r['rounds']} rounds)"
    add(where, "declared", r["declared"]["iteration_s"], 1.0, None)
    add(where, r["label"], r["iteration_s"], r["ratio_to_declared"], r["ratio_to_best_hand"])
    if "llm_longtail" in wls:  # declared and hand-written rows only: no optimizer run on it yet
        lt = wls["llm_longtail"]
        d = lt["declared"]
        where = f"LLM GRPO long tail ({_short(_base_card(doc, 'llm_longtail'))}, {d['iteration_s']['n']} rounds)"
        for name, c in lt["configs"].items():
            label = name if name == "declared" else f"{name}: `{'; '.join(c['requests'])}`"
            add(where, label, c["iteration_s"]["median"], c["ratio_to_declared"], c["ratio_to_best_hand"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, default=CANONICAL, help="the canonical table to fill (in place)")
    ap.add_argument("--ref", default=ARCHIVE, help="git ref holding the measured runs (default: %(default)s)")
    ap.add_argument("--from-dir", type=Path, default=None, help="read the runs from this directory instead of --ref")
    ap.add_argument("--markdown", action="store_true", help="print docs/results.md's summary table from --table and exit")
    args = ap.parse_args(argv)
    doc = json.loads(args.table.read_text())
    if args.markdown:
        print(markdown(doc))
        return 0
    read = dir_reader(args.from_dir) if args.from_dir else archive_reader(args.ref)
    args.table.write_text(json.dumps(assemble(doc, read), indent=1) + "\n")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
