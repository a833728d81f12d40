"""The benchmarks' library: code that the benchmark scripts and the tests import, not run on its own.

- `common`: what every result file records (the machine, the package versions, `summary` of repeats, a
  time budget for a benchmark's rounds, timing a batch of calls);
- `paper_workloads`: the paper table's workloads and the hand-written configurations by name (what a user
  would do by hand: `pipeG`, `simS`, `splittimeK`, `fuse`, `llmpipe`);
- `paper_profile`: the figures read off a run's nodes and activity (critical path, lower bound, SM
  activity over a window).

Tested in `tests/benchmarks/` (test_paper_profile.py, test_paper_table.py, test_lib_common.py).
"""
