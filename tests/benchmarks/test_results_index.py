"""benchmarks/results/ is a set of current results, not a lab notebook (issue 43): no script and no per-run
folder there, every file in its index and every indexed file there; the paper table's optimizer rows come
from measured runs by `benchmarks/paper_table_rows.py`, and docs/results.md's summary table is that script's
rendering of the canonical file, so no figure in it is typed by hand."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import paper_table_rows as rows

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _tracked() -> list[Path]:
    """The files under benchmarks/results/ that the repository holds (a run folder extracted from the
    results-archive tag, as docs/results.md shows, is ignored by git and is not part of the tree)."""
    out = subprocess.run(["git", "ls-files", "-z", "benchmarks/results"], cwd=ROOT, capture_output=True)
    if out.returncode != 0:  # not a git checkout: what is on disk is the tree
        return [p for p in RESULTS.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def _indexed() -> set[str]:
    """Every backquoted file name in the first column of the index's table."""
    names: set[str] = set()
    for line in (RESULTS / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    return names


def test_results_hold_no_script_and_no_folder():
    files = _tracked()
    assert not [str(p.relative_to(RESULTS)) for p in files if p.parent != RESULTS], \
        "per-run folders belong in the results-archive tag (benchmarks/results/README.md)"
    assert not [p.name for p in files if p.suffix in (".py", ".sh")], "scripts live in benchmarks/"


def test_index_lists_exactly_the_files():
    files = {p.name for p in _tracked() if p.name != "README.md"}
    indexed = _indexed()
    assert files - indexed == set(), "files missing from benchmarks/results/README.md"
    assert indexed - files == set(), "indexed files that are not there"


def test_results_table_is_the_canonical_files_rendering():
    table = rows.markdown(json.loads((RESULTS / "paper_table.json").read_text()))
    assert table in (ROOT / "docs" / "results.md").read_text(), \
        "docs/results.md's summary table differs from `python3 benchmarks/paper_table_rows.py --markdown`"


def test_canonical_table_holds_the_optimizer_rows_with_their_sources():
    doc = json.loads((RESULTS / "paper_table.json").read_text())
    for workload, key in (("mjx", "stage1"), ("mjx", "rose"), ("metaworld", "rose"), ("llm", "rose")):
        row = doc["workloads"][workload][key]
        assert row["iteration_s"] > 0 and row["card"] and row["sources"], (workload, key)
        assert all(s.startswith(f"{rows.ARCHIVE}:benchmarks/results/") for s in row["sources"])


def _session(card: str, seconds: dict[str, list[float]], kinds: dict[str, str]) -> dict:
    return {"machine": {"gpus": [{"name": card}]},
            "workloads": {"w": {"configs": {name: {"kind": kinds[name], "sm_activity": 0.5,
                                                   "rounds_seconds": [[s] for s in secs]}
                                            for name, secs in seconds.items()}}}}


def test_session_rows_pool_every_round_and_divide_the_same_sessions():
    kinds = {"declared": "declared", "handA": "hand", "handB": "hand", "rose": "rose"}
    files = {"a": _session("GPU X", {"declared": [10.0, 12.0], "handA": [9.0, 9.0], "handB": [11.0, 11.0],
                                     "rose": [8.0, 6.0]}, kinds),
             "b": _session("GPU X", {"declared": [11.0], "handA": [10.0], "handB": [8.5], "rose": [7.0]}, kinds)}
    spec = rows.Sessions("w", "rose", "rose", "label", ("a", "b"))
    row = rows.session_row(spec, files.__getitem__)
    assert row["rounds"] == 3 and row["iteration_s"] == 7.0 and row["rounds_seconds"] == [8.0, 6.0, 7.0]
    assert row["declared"]["iteration_s"] == 11.0
    assert row["best_hand"]["name"] == "handA" and row["best_hand"]["iteration_s"] == 9.0  # pooled, not per session
    assert row["ratio_to_declared"] == pytest.approx(11.0 / 7.0)
    assert row["ratio_to_best_hand"] == pytest.approx(9.0 / 7.0)
    assert row["sources"] == [f"{rows.ARCHIVE}:a", f"{rows.ARCHIVE}:b"] and row["card"] == "GPU X"


def test_a_row_is_never_pooled_across_kinds_of_card():
    kinds = {"declared": "declared", "rose": "rose"}
    files = {"a": _session("GPU X", {"declared": [10.0], "rose": [8.0]}, kinds),
             "b": _session("GPU Y", {"declared": [10.0], "rose": [8.0]}, kinds)}
    with pytest.raises(ValueError, match="one kind of card"):
        rows.session_row(rows.Sessions("w", "rose", "rose", "label", ("a", "b")), files.__getitem__)


def test_every_benchmark_entry_is_listed_with_files_that_exist():
    """benchmarks/README.md lists every script at the top of benchmarks/ (an entry with its result file, or a
    device helper or tool), and every `results/...` file it names is there (issue 60: a bench you can find
    your way in)."""
    bench = ROOT / "benchmarks"
    readme = (bench / "README.md").read_text()
    scripts = sorted(p.name for p in bench.iterdir()
                     if p.suffix in (".py", ".sh") and p.name != "__init__.py")
    assert [name for name in scripts if f"`{name}`" not in readme] == [], "scripts missing from benchmarks/README.md"
    named = set(re.findall(r"`results/([A-Za-z0-9_]+\.(?:json|png|svg))`", readme))
    assert named and not [n for n in named if not (RESULTS / n).is_file()], "named results that are not there"
    assert not (bench / "sweeps").exists(), "one-run sweeps live in git history (benchmarks/README.md)"
