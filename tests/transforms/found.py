"""Every failure the property suites ever found, kept as explicit hypothesis examples so that CI
re-checks each on every run (hypothesis would otherwise only replay them from a local database).

Each entry is the smallest workflow that showed the failure (in the generator's format: one mock
method per node) and the rewrite requests that triggered it. Where the original falsifying example is
lost (found before this file existed) the workflow is rebuilt from the commit that fixed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Found:
    title: str  # what went wrong, and where it was found
    text: str  # the workflow
    requests: tuple[str, ...]

    @property
    def doc(self) -> dict[str, Any]:
        return yaml.safe_load(self.text)


def _mock(name: str, states: list[str], behaviors: dict[str, str]) -> str:
    beh = ", ".join(f"{m}: {b}" for m, b in behaviors.items())
    return (f'  {name}: {{impl: "tests.mocks:Mock", state: {states}, args: {{name: {name}, batch: 6, '
            f"states: {states}, behaviors: {{{beh}}}}}}}\n")


def _wf(components: str, body: str, count: int = 2) -> str:
    return f"rose: 1\nname: found\ncomponents:\n{components}iteration:\n  count: {count}\n  body:\n{body}"


SEP = "{state: {}, out: [o0], separable: true}"

# Found by property 1 (accepted rewrites compute the same): test_accepted_rewrites_preserve_results...
ACCEPTED = [
    Found(
        "issue 12.1: a split loop body holding a nested loop whose collect selects its own iterations "
        "(`stack(l2[*].{l2.v})`): the inner collect kept the old loop name, so the plan did not validate "
        "(found on workflows/embodied_ppo.yaml by hand; the generator did not make such collects)",
        _wf(_mock("c0", [], {"n1": SEP, "n3": SEP}), """\
    - loop: l1
      count: 2
      body:
        - {node: n1, call: c0.n1, in: {t: l1.i}, out: [o0], batch: {dim: 0, size: 6}}
        - loop: l2
          count: 2
          carry: {v: {init: n1.o0, next: n3.o0}}
          body:
            - {node: n3, call: c0.n3, in: {x: l2.v}, out: [o0], batch: {dim: 0, size: 6}}
          collect: {c: "stack(l2[*].{l2.v, n3.o0})"}
"""),
        ("split iteration.l1 2",)),
    Found(
        "issue 12.2: a loop that ends on a condition inside a loop split into row groups: each group "
        "stopped on its own rows' flags (found by the long profile once the generator made until loops)",
        _wf(_mock("c0", ["s0", "s1"], {
            "n3": "{state: {}, out: [], separable: true}",
            "n4": "{state: {}, out: [o0], separable: true, flags: [o0]}",
            "n6": "{state: {s0: update}, out: [], separable: true}",
            "n7": "{state: {}, out: [o0], separable: true, flags: [o0]}"}), """\
    - loop: l1
      count: 1
      body:
        - loop: l2
          count: 2
          until: n4.o0
          body:
            - {node: n3, call: c0.n3, batch: {dim: 0, size: 6}}
            - {node: n4, call: c0.n4, in: {t: l2.i}, out: [o0], batch: {dim: 0, size: 6}}
        - loop: l5
          count: 2
          until: n7.o0
          body:
            - {node: n6, call: c0.n6, state: {s0: update}, batch: {dim: 0, size: 6}}
            - {node: n7, call: c0.n7, in: {t: l5.i}, out: [o0], batch: {dim: 0, size: 6}}
""", count=1),
        ("split iteration.l1 2",)),
    Found(
        "issue 12.3: nested temporal splits named a component copy 'c0@0@0', which is not a name "
        "(found by the default profile in CI, on a rare draw)",
        _wf(_mock("c0", ["s0"], {
            "a": "{state: {s0: refresh}, out: [o0], separable: true}",
            "b": "{state: {s0: refresh}, out: [o0], separable: true}",
            "d": "{state: {s0: update}, out: [o0], separable: true}"}), """\
    - loop: l1
      count: 2
      body:
        - {node: a, call: c0.a, in: {t: l1.i}, state: {s0: refresh}, out: [o0]}
        - loop: l2
          count: 2
          body:
            - {node: b, call: c0.b, in: {t: l2.i, x: a.o0}, state: {s0: refresh}, out: [o0]}
            - {node: d, call: c0.d, in: {x: b.o0}, state: {s0: update}, out: [o0]}
"""),
        ("split-time iteration.l1 2", "split-time iteration.l1@0.l2 2")),
    Found(
        "commit d12fdfd: a loop-body split of a loop holding temporal groups nested the group names "
        "('l3@0@0'); splits now refuse loops that hold groups (found by the long profile)",
        _wf(_mock("c0", ["s0"], {
            "n2": SEP,
            "n4": "{state: {s0: refresh}, out: [o0], separable: true}"}), """\
    - loop: l1
      count: 2
      body:
        - {node: n2, call: c0.n2, in: {t: l1.i}, out: [o0], batch: {dim: 0, size: 6}}
        - loop: l3
          count: 2
          body:
            - {node: n4, call: c0.n4, in: {x: n2.o0, t: l3.i}, state: {s0: refresh}, out: [o0], batch: {dim: 0, size: 6}}
"""),
        ("split-time iteration.l1.l3 2", "split iteration.l1 2")),
    Found(
        "commit 3f12747 (1): merging a carried value whose next is a stacked collect (its batch moves from "
        "dim 0 to dim 1) as if it kept dim 0 (found by the long profile)",
        _wf(_mock("c0", [], {"n1": SEP, "n3": SEP, "n4": SEP}), """\
    - {node: n1, call: c0.n1, in: {t: iteration.i}, out: [o0], batch: {dim: 0, size: 6}}
    - loop: l1
      count: 2
      carry: {v: {init: n1.o0, next: l2.c}}
      body:
        - loop: l2
          count: 2
          body:
            - {node: n3, call: c0.n3, in: {x: l1.v, t: l2.i}, out: [o0], batch: {dim: 0, size: 6}}
          collect: {c: "stack(l2[*].n3.o0)"}
    - {node: n4, call: c0.n4, in: {x: l1.v}, out: [o0], batch: {dim: 0, size: 6}}
"""),
        ("split iteration.l1 2",)),
    Found(
        "commit 3f12747 (2): slicing such a carried value's final value for a split node (its rows are on "
        "dim 1: the slice took time steps) (found by the long profile)",
        _wf(_mock("c0", [], {"n1": SEP, "n3": SEP, "n4": SEP}), """\
    - {node: n1, call: c0.n1, in: {t: iteration.i}, out: [o0], batch: {dim: 0, size: 6}}
    - loop: l1
      count: 2
      carry: {v: {init: n1.o0, next: l2.c}}
      body:
        - loop: l2
          count: 2
          body:
            - {node: n3, call: c0.n3, in: {x: l1.v, t: l2.i}, out: [o0], batch: {dim: 0, size: 6}}
          collect: {c: "stack(l2[*].n3.o0)"}
    - {node: n4, call: c0.n4, in: {x: l1.v}, out: [o0], batch: {dim: 0, size: 6}}
"""),
        ("split iteration.n4 2",)),
    Found(
        "a record with an integer field, split by rows: the values layer sliced the integer "
        "(found by the default profile once the generator made records)",
        _wf(_mock("c0", [], {"n1": SEP, "n2": "{state: {}, out: [], separable: true}"}), """\
    - {node: n1, call: c0.n1, out: [o0], batch: {dim: 0, size: 6}}
    - {node: n2, call: c0.n2, in: {x0: "{a: n1.o0, b: n1.o0}", x1: "{a: iteration.i, b: n1.o0}"}, batch: {dim: 0, size: 6}}
"""),
        ("split iteration.n2 2",)),
]

ACCEPTED += [
    Found(
        "a loop-body split merged a nested loop's carried value along its first value's batch dim, though "
        "its next value has another -- a sibling of 3f12747, there since the split was written (found by the "
        "default profile during the issue 13 refactoring)",
        _wf(_mock("c0", [], {"n3": SEP, "n5": SEP, "n7": SEP, "n10": "{state: {}, out: [o0], separable: false}"}), """\
    - loop: l1
      count: 1
      body:
        - loop: l2
          count: 1
          body:
            - {node: n3, call: c0.n3, batch: {dim: 0, size: 6}}
            - {node: n5, call: c0.n5, out: [o0], batch: {dim: 0, size: 6}}
          collect: {c: "stack(l2[*].n5.o0)"}
        - loop: l6
          count: 1
          carry: {v: {init: l2.c, next: n7.o0}}
          body:
            - {node: n7, call: c0.n7, out: [o0], batch: {dim: 0, size: 6}}
    - {node: n10, call: c0.n10, in: {x: "l1[-1].l6.v"}, out: [o0]}
""", count=1),
        ("split iteration.l1 2",)),
    Found(
        "a chain split of nodes inside a loop-body group, which already work on the group's rows: the "
        "check was lost in the issue 13 refactoring (found by the default profile drawing split-chain)",
        _wf(_mock("c0", ["s0"], {"n4": "{state: {s0: update}, out: [o0], separable: true}", "n5": SEP}), """\
    - loop: l1
      count: 2
      body:
        - loop: l2
          count: 2
          body:
            - {node: n4, call: c0.n4, in: {t: l2.i}, state: {s0: update}, out: [o0], batch: {dim: 0, size: 6}}
            - {node: n5, call: c0.n5, in: {x: n4.o0}, out: [o0], batch: {dim: 0, size: 6}}
"""),
        ("split iteration.l1 3", "split-chain iteration.l1.l2@0.n4 iteration.l1.l2@0.n5 2")),
    Found(
        "loop fusion inside a loop whose carried value reads an item after the fused loops: the outer "
        "loop's bindings were resolved on its rebuilt (shorter) body, an internal refusal (found by a "
        "sweep of the suite's steps during the issue 13 refactoring)",
        _wf(_mock("c0", [], {"n3": "{state: {}, out: [o0], separable: false}", "n6": SEP,
                             "n8": "{state: {}, out: [], separable: false}",
                             "n9": "{state: {}, out: [o0, o1], separable: false}"}), """\
    - {node: n3, call: c0.n3, in: {x0: iteration.i}, out: [o0]}
    - loop: l4
      count: 2
      carry: {v: {init: n3.o0, next: n9.o1}}
      body:
        - loop: l5
          count: 2
          body:
            - {node: n6, call: c0.n6, in: {x0: l4.v}, out: [o0], batch: {dim: 0, size: 6}}
          collect: {c: "stack(l5[*].n6.o0)"}
        - loop: l7
          count: 2
          body:
            - {node: n8, call: c0.n8}
        - {node: n9, call: c0.n9, out: [o0, o1]}
      collect: {c: "stack(l4[*].l4.v)"}
"""),
        ("fuse iteration.l4.l5 iteration.l4.l7",)),
]
ACCEPTED.append(Found(
    "loop fusion of two row groups of one loop (`l3@0`, `l3@1`): the items moved into group 0 kept group "
    "1, which the plan did not write, so it read back different (found by a sweep of the suite's steps "
    "without the pinned examples)",
    _wf(_mock("c0", [], {"n2": "{state: {}, out: [], separable: true}", "n4": "{state: {}, out: [], separable: true}",
                         "n5": SEP}), """\
    - loop: l1
      count: 2
      body:
        - {node: n2, call: c0.n2, in: {x0: iteration.i}, batch: {dim: 0, size: 6}}
        - loop: l3
          count: 2
          body:
            - {node: n4, call: c0.n4, in: {x0: l3.i}, batch: {dim: 0, size: 6}}
        - {node: n5, call: c0.n5, in: {x0: l1.i}, out: [o0], batch: {dim: 0, size: 6}}
      collect: {c: "stack(l1[*].n5.o0)"}
""", count=1),
    ("split iteration.l1 2", "fuse iteration.l1.l3@0 iteration.l1.l3@1")))

# issue 58's long profile (merged main): `defer n1 1` of a node that writes no state and whose output nothing
# reads, in a workflow with no staleness budget, was accepted by the rewrite's legality oracle (it changes
# nothing) and refused by the plan check's quick bound ("more than any state's budget allows"), which now
# applies only to nodes that write state
ACCEPTED.append(Found(
    "issue 58: a deferred node that writes no state, no budget anywhere: the plan check agrees with the rewrite",
    "rose: 1\nname: found\ncomponents:\n" + _mock("c0", [], {"n1": "{state: {}, out: [], separable: false}"})
    + "iteration:\n  count: 2\n  body:\n    - {node: n1, call: c0.n1}\n",
    ("defer iteration.n1 1",)))

# the long profile after the fix above: `defer n1 1` of the only node, which updates a state nothing reads, with no
# budget anywhere: accepted by the rewrite (no read is older), refused by the plan check (the value an RL
# iteration leaves would be 1 iteration old); the rewrite now refuses it with the plan check's own bound
ACCEPTED.append(Found(
    "issue 58: a deferred node that updates a state, no budget anywhere: the rewrite refuses it as the plan check does",
    "rose: 1\nname: found\ncomponents:\n"
    + _mock("c0", ["s0"], {"n1": "{state: {s0: update}, out: [], separable: true}"})
    + "iteration:\n  count: 2\n  body:\n    - {node: n1, call: c0.n1, state: {s0: update}, batch: {dim: 0, size: 6}}\n",
    ("defer iteration.n1 1",)))

# Found by property 2 (a refused reorder, forced through, changes something): test_refused_reorders...
FORCED = [
    Found(
        "commit ecb8334: a refresh that the next refresh overwrites unobserved was kept after the writes "
        "before it, so moving it was refused although, forced through, nothing changed",
        _wf(_mock("c0", ["s0"], {
            "n1": "{state: {s0: refresh}, out: [o0], separable: false}",
            "n2": "{state: {s0: refresh}, out: [o0], separable: false}",
            "n3": "{state: {s0: refresh}, out: [o0], separable: false}",
            "n4": "{state: {s0: read}, out: [o0], separable: false}"}), """\
    - {node: n1, call: c0.n1, in: {t: iteration.i}, state: {s0: refresh}, out: [o0]}
    - {node: n2, call: c0.n2, in: {t: iteration.i}, state: {s0: refresh}, out: [o0]}
    - {node: n3, call: c0.n3, in: {t: iteration.i}, state: {s0: refresh}, out: [o0]}
    - {node: n4, call: c0.n4, state: {s0: read}, out: [o0]}
"""),
        ("rewire iteration.n2 before n1",)),
]

ACCEPTED.append(Found(
    "the legality oracle took a row group's refresh of per-row state for an overwrite of all rows: a "
    "full refresh before it looked unobserved, so moving the group ahead of it was accepted and the full "
    "refresh then overwrote the group's rows (found by a sweep without the pinned examples: the plan check "
    "refused what the oracle accepted)",
    _wf(_mock("c1", ["s0", "s1"], {
        "n1": "{state: {s1: update}, out: [], separable: true}",
        "n2": "{state: {s0: refresh, s1: read}, out: [], separable: true}",
        "n3": "{state: {s0: refresh, s1: read}, out: [o0], separable: true}"}), """\
    - {node: n1, call: c1.n1, state: {s1: update}, batch: {dim: 0, size: 6}}
    - {node: n2, call: c1.n2, in: {x0: iteration.i}, state: {s0: refresh, s1: read}, batch: {dim: 0, size: 6}}
    - {node: n3, call: c1.n3, in: {x0: iteration.i}, state: {s0: refresh, s1: read}, out: [o0], batch: {dim: 0, size: 6}}
"""),
    ("split iteration.n3 2", "rewire iteration.n3@0 after n1")))

FORCED.append(Found(
    "a refused reorder inside a loop that ends on a condition, forced through, made a later such loop stop "
    "one iteration earlier: the comparison looked up a call the forced run never made and crashed instead "
    "of reporting the difference (a test-harness bug; found by the long profile)",
    _wf(_mock("c0", ["s0", "s1"], {
        "n2": "{state: {s0: read}, out: [o0], separable: true}",
        "n3": "{state: {s0: update, s1: read}, out: [o0], separable: true, flags: [o0]}",
        "n6": "{state: {}, out: [o0, o1], separable: true}",
        "n7": "{state: {s0: read}, out: [o0], separable: true, flags: [o0]}",
        "n8": "{state: {}, out: [o0], separable: true, flags: [o0]}"}), """\
    - loop: l1
      count: 2
      until: n3.o0
      body:
        - {node: n2, call: c0.n2, state: {s0: read}, out: [o0], batch: {dim: 0, size: 6}}
        - {node: n3, call: c0.n3, in: {t: l1.i}, state: {s0: update, s1: read}, out: [o0], batch: {dim: 0, size: 6}}
      collect: {c: "stack(l1[*].n2.o0)"}
    - loop: l4
      count: 2
      until: n8.o0
      carry: {v: {init: l1.c, next: l5.v}}
      body:
        - loop: l5
          count: 2
          until: n7.o0
          carry: {v: {init: l1.c, next: n6.o0}}
          body:
            - {node: n6, call: c0.n6, in: {x0: "{a: l1.c, b: l1.c}"}, out: [o0, o1], batch: {dim: 0, size: 6}}
            - {node: n7, call: c0.n7, in: {x0: "{a: l1.c, b: l1.c}", t: l5.i}, state: {s0: read}, out: [o0], batch: {dim: 0, size: 6}}
        - {node: n8, call: c0.n8, in: {x0: "{a: l1.c, b: l1.c}", t: l4.i}, out: [o0], batch: {dim: 0, size: 6}}
""", count=1),
    ("rewire iteration.l1.n2 after n3",)))

_OVERWRITTEN = Found(
    "a refresh overwritten before anyone sees it (n1, then n2's refresh) was kept before that later write, "
    "though moving it past the readers of n2's value, before the next refresh, changes nothing: the "
    "oracle kept an order between every two conflicting accesses; it now compares what every access sees "
    "(found by the long profile: a refused reorder that, forced through, changed nothing)",
    _wf(_mock("c0", ["s0", "s1"], {
        "n1": "{state: {s0: refresh}, out: [], separable: false}",
        "n2": "{state: {s0: refresh}, out: [o0], separable: false}",
        "n5": "{state: {s0: read}, out: [], separable: true}",
        "n6": "{state: {}, out: [o0], separable: true, flags: [o0]}",
        "n7": "{state: {}, out: [], separable: true}",
        "n9": "{state: {s0: refresh, s1: read}, out: [], separable: false}",
        "n10": "{state: {}, out: [o0], separable: false, flags: [o0]}"}), """\
    - {node: n1, call: c0.n1, state: {s0: refresh}}
    - {node: n2, call: c0.n2, state: {s0: refresh}, out: [o0]}
    - loop: l3
      count: 1
      body:
        - loop: l4
          count: 2
          until: n6.o0
          body:
            - {node: n5, call: c0.n5, state: {s0: read}, batch: {dim: 0, size: 6}}
            - {node: n6, call: c0.n6, in: {t: l4.i}, out: [o0], batch: {dim: 0, size: 6}}
        - {node: n7, call: c0.n7, batch: {dim: 0, size: 6}}
    - loop: l8
      count: 2
      until: n10.o0
      body:
        - {node: n9, call: c0.n9, state: {s0: refresh, s1: read}}
        - {node: n10, call: c0.n10, in: {t: l8.i}, out: [o0]}
""", count=1),
    ("rewire iteration.n1 after l3",))
FORCED.append(_OVERWRITTEN)
ACCEPTED.append(_OVERWRITTEN)

ACCEPTED.append(Found(
    "fusing a loop whose body reads what the first loop leaves after its last iteration (`l2.v`, the carried "
    "value's last `next`): moved into l2's body the same reference named the carried-in value, so the plan "
    "read n1's output instead of n4's; the legality oracle checked only that n4 still ran first, the plan "
    "check caught it. Fusion now refuses such a read (found by the long profile, 2026-12-03)",
    _wf(_mock("c0", [], {
        "n1": "{state: {}, out: [o0], separable: false}",
        "n3": "{state: {}, out: [], separable: true}",
        "n4": SEP,
        "n6": "{state: {}, out: [], separable: true}",
        "n7": "{state: {}, out: [o0], separable: true, flags: [o0]}",
        "n9": "{state: {}, out: [], separable: false}"}), """\
    - {node: n1, call: c0.n1, out: [o0]}
    - loop: l2
      count: 1
      carry: {v: {init: n1.o0, next: n4.o0}}
      body:
        - {node: n3, call: c0.n3, batch: {dim: 0, size: 6}}
        - {node: n4, call: c0.n4, out: [o0], batch: {dim: 0, size: 6}}
        - loop: l5
          count: 2
          until: n7.o0
          body:
            - {node: n6, call: c0.n6, batch: {dim: 0, size: 6}}
            - {node: n7, call: c0.n7, in: {t: l5.i}, out: [o0], batch: {dim: 0, size: 6}}
    - loop: l8
      count: 1
      body:
        - {node: n9, call: c0.n9, in: {x0: "{a: n1.o0, b: l2.v}"}}
""", count=1),
    ("fuse iteration.l2 iteration.l8",)))

# issue 42: an `after:` naming the item a rewrite replaces was left naming the old item, which the plan no longer
# has: the rewrite was refused as "would break a data dependency" ('after: l1' names no item of this body).
# The rewrite now retargets the `after:` by what it names (`refs.retarget_after`). Found by hand (a user's
# workflow, and the paper's fuse of Figure 9b with a node that runs `after:` the update loop).
ACCEPTED += [
    Found(
        "issue 42: `split-time` of a free loop that a later sibling runs `after:`",
        _wf(_mock("c0", [], {"n1": SEP}) + _mock("c1", ["s0"], {"n2": "{state: {s0: update}, out: [o0], "
                                                                 "separable: true}"}), """\
    - loop: l1
      count: 2
      body:
        - {node: n1, call: c0.n1, in: {t: l1.i}, out: [o0], batch: {dim: 0, size: 6}}
    - {node: n2, call: c1.n2, out: [o0], state: {s0: update}, batch: {dim: 0, size: 6}, after: [l1]}
"""),
        ("split-time iteration.l1 2",)),
    Found(
        "issue 42: `fuse` of two loops where a later sibling runs `after:` the second (Figure 9b: a node after "
        "the update loop)",
        _wf(_mock("c0", [], {"n1": SEP}) + _mock("c1", ["s0"], {
            "n2": "{state: {s0: update}, out: [o0], separable: false}"}), """\
    - loop: l1
      count: 2
      body:
        - {node: n1, call: c0.n1, in: {t: l1.i}, out: [o0], batch: {dim: 0, size: 6}}
    - loop: l2
      count: 2
      body:
        - {node: n2, call: c1.n2, in: {x: "l1[l2.i].n1.o0"}, out: [o0], state: {s0: update}}
    - {node: n3, call: c0.n1, in: {t: iteration.i}, out: [o0], batch: {dim: 0, size: 6}, after: [l2]}
"""),
        ("fuse iteration.l1 iteration.l2",)),
]

# Found while adding per-row completion to loops that end on a condition (issue 45)
UNTIL_PER_ROW = Found(
    "a chain split of the calls inside a loop that ends per row put merges in its body, so the loop ended as "
    "a whole: rows already done were computed again and their values changed (found by the default profile "
    "of test_accepted_rewrites once per-row completion ran; refused since by the pass runner's `until_kept`)",
    _wf(_mock("c0", [], {"p": "{state: {}, out: [o0], separable: false}", "n2": SEP,
                         "n3": "{state: {}, out: [o0], separable: true, flags: [o0]}", "n4": SEP}), """\
    - {node: p, call: c0.p, in: {t: iteration.i}, out: [o0], batch: {dim: 0, size: 6, separable: false}}
    - loop: l1
      count: 3
      until: n3.o0
      carry: {v: {init: p.o0, next: n2.o0}}
      body:
        - {node: n2, call: c0.n2, in: {x: l1.v}, out: [o0], batch: {dim: 0, size: 6}}
        - {node: n3, call: c0.n3, in: {x: n2.o0, t: l1.i}, out: [o0], batch: {dim: 0, size: 6}}
    - {node: n4, call: c0.n4, in: {x: l1.v}, out: [o0], batch: {dim: 0, size: 6}}
""", count=1),
    ("split-chain iteration.l1.n2 iteration.l1.n3 2",))
ACCEPTED += [UNTIL_PER_ROW]

# Found by the full suite once until loops (issue 45) and asynchronous plans (issue 46) met: `defer` of a call
# in a workflow with a loop that ends on a condition left a deferred call unrun (a drain the until path does not
# make) or failed to build after a split-chain of that loop. Refused then; accepted again since the reference
# interpreter's until path reads a deferred call's inputs from its own RL iteration and drains at the end.
# And a `split` inside the per-row until loop of a time-split copy (`l1@0.l2`) made that loop end as a whole:
# `until_kept` looked the loop up by its source path, which the plan it was applied to no longer had.
ACCEPTED += [
    Found(
        "issue 45/46: `defer` of a node after a loop that ends on a condition (its deferred call was never run)",
        _wf(_mock("c0", [], {"n2": "{state: {}, out: [], separable: false}",
                             "n3": "{state: {}, out: [o0], separable: false, flags: [o0]}", "n4": SEP}), """\
    - loop: l1
      count: 2
      until: n3.o0
      body:
        - {node: n2, call: c0.n2}
        - {node: n3, call: c0.n3, in: {t: l1.i}, out: [o0]}
    - {node: n4, call: c0.n4, out: [o0], batch: {dim: 0, size: 6}}
""", count=1),
        ("defer iteration.n4 1",)),
    Found(
        "issue 45: `split` of a call inside the per-row until loop of a time-split copy (refused by until_kept)",
        _wf(_mock("c0", [], {"n3": "{state: {}, out: [], separable: true}", "n4": "{state: {}, out: [], separable: true}",
                             "n5": "{state: {}, out: [o0], separable: true, flags: [o0]}"}), """\
    - loop: l1
      count: 2
      body:
        - loop: l2
          count: 2
          until: n5.o0
          body:
            - {node: n3, call: c0.n3, batch: {dim: 0, size: 6}}
            - {node: n4, call: c0.n4, batch: {dim: 0, size: 6}}
            - {node: n5, call: c0.n5, in: {t: l2.i}, out: [o0], batch: {dim: 0, size: 6}}
""", count=1),
        ("split-time iteration.l1 2", "split iteration.l1@0.l2.n3 2")),
]

# issue 42: a time-split copy of a component starts from the original's state (paper §4.3.1): the loop
# reads state written before it (`n1` updates s0, the loop only reads it), which was refused ("a copy
# would not see its value"); the split now seeds each copy from the original before the groups (seeds.py)
ACCEPTED += [
    Found(
        "split-time of a loop that reads state of a component it writes, set before the loop: the copy "
        "started from the constructor's value (refused until the split seeded copies; issue 42's last item)",
        _wf(_mock("c0", ["s0", "s1"], {
            "n1": "{state: {s0: update}, out: [o0], separable: true}",
            "n3": "{state: {s1: refresh}, out: [o0], separable: true}",
            "n4": "{state: {s0: read, s1: update}, out: [o0], separable: true}"}), """\
    - {node: n1, call: c0.n1, state: {s0: update}, out: [o0], batch: {dim: 0, size: 6}}
    - loop: l2
      count: 3
      body:
        - {node: n3, call: c0.n3, in: {t: l2.i}, state: {s1: refresh}, out: [o0], batch: {dim: 0, size: 6}}
        - {node: n4, call: c0.n4, in: {x: n3.o0}, state: {s0: read, s1: update}, out: [o0], batch: {dim: 0, size: 6}}
"""),
        ("split-time iteration.l2 3",)),
]

# Found by the after-property (issue 42's generator) on the merged tree: a chain split of a loop inside a part of
# a loop split in time, whose iterations a later item selects (`l1[-1].l4[-1].n7.o0`), failed to build
# ("'l4' is a node, not a loop"). Refused since, with the fix (chain-split before the split in time).
ACCEPTED += [
    Found(
        "split-chain of a loop inside a time-split part whose iterations are selected later (refused)",
        _wf(_mock("c0", [], {"n2": "{state: {}, out: [], separable: true}", "n3": "{state: {}, out: [], separable: true}",
                             "n5": "{state: {}, out: [], separable: true}", "n6": "{state: {}, out: [], separable: true}",
                             "n7": SEP, "n9": "{state: {}, out: [], separable: false}"}), """\
    - loop: l1
      count: 2
      body:
        - {node: n2, call: c0.n2, batch: {dim: 0, size: 6}}
        - {node: n3, call: c0.n3, batch: {dim: 0, size: 6}}
        - loop: l4
          count: 1
          body:
            - {node: n5, call: c0.n5, batch: {dim: 0, size: 6}}
            - {node: n6, call: c0.n6, batch: {dim: 0, size: 6}}
            - {node: n7, call: c0.n7, out: [o0], batch: {dim: 0, size: 6}}
    - {node: n9, call: c0.n9, in: {x0: iteration.i, x1: "l1[-1].l4[-1].n7.o0"}}
""", count=1),
        ("split-time iteration.l1 2", "split-chain iteration.l1@1.n2 iteration.l1@1.n3 iteration.l1@1.l4 2")),
]

# Found by the long profile on the merged tree (issues 45/46): `defer` of a call that reads a loop ending as a
# whole on a condition (`l1[-1].l2.c`, `l1.c`) evaluated its inputs in the next RL iteration's frame, where that
# loop had run no trip yet ("loop 'l1' ran no iteration", or an empty collect). Fixed: the reference interpreter
# evaluates a deferred call's inputs in the frame of its own RL iteration.
ACCEPTED += [
    Found(
        "issue 45/46: `defer` of a call reading a loop that ends as a whole on a condition",
        _wf(_mock("c0", [], {"n3": "{state: {}, out: [], separable: false}",
                             "n4": "{state: {}, out: [], separable: false}", "n5": SEP,
                             "n6": "{state: {}, out: [o0], separable: true, flags: [o0]}",
                             "n7": "{state: {}, out: [], separable: false}"}), """\
    - loop: l1
      count: 2
      until: n6.o0
      body:
        - loop: l2
          count: 1
          body:
            - {node: n3, call: c0.n3}
            - {node: n4, call: c0.n4}
            - {node: n5, call: c0.n5, out: [o0], batch: {dim: 0, size: 6}}
          collect: {c: "stack(l2[*].n5.o0)"}
        - {node: n6, call: c0.n6, in: {t: l1.i}, out: [o0], batch: {dim: 0, size: 6}}
      collect: {c: "stack(l1[*].l2.c)"}
    - {node: n7, call: c0.n7, in: {x0: "{a: l1[-1].l2.c, b: l1.c}"}}
""", count=1),
        ("defer iteration.n7 1",)),
]


@dataclass(frozen=True)
class FoundChain:
    """A failure of the version-lag property (`test_version_properties.py`): the random chain that showed it."""

    title: str
    relays: int
    budgets: tuple[int, ...]
    fan: bool
    requests: tuple[str, ...]
    until: bool = False
    split: bool = False


# Found by the version-lag property (issue 58); the issue's own two shapes are its parametrized cases.
VERSION_CASES: list[FoundChain] = []
