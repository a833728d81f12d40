"""The workloads of the paper table and the hand-written configurations swept on each (issue 14).

A configuration is named by what a user would do by hand, and its name says how it is built, so any
combination can be asked for on the command line:

| name part | what it does | how rose expresses it |
| --- | --- | --- |
| `declared` | the workflow as written (colocated; dependency-driven overlap only) | the workflow file |
| `pipeG` | simulator-group pipelining with G groups (RLinf's `pipeline_stage_num`) | `rose rewrite --do "split step G" --do "interleave step"` |
| `simS` | S simulator processes (RLinf's env workers; CPU-bound simulators) | `--set sim_replicas=S` (hybrid replicas) |
| `splittimeK` | K rollout epochs at once, each on its own policy + simulator processes | `rose rewrite --do "split-time epoch K"` |
| `fuse` | each epoch's update right after its rollout (overlaps the next rollout) | `rose rewrite --do "fuse epoch update"` |
| `llmpipe` | LLM: reward scoring of one prompt group overlapped with generation of the next | the hand-written `workflows/llm_grpo_gpu_pipelined.yaml` |
| `chainG` | LLM long tail: G prompt groups; a group's reference and reward scoring start when its completions are finished, while the other groups go on decoding (verl's/RLinf's streamed rollout-to-scoring) | `rose rewrite --do "split-chain generate ref score G"` |

Parts combine with `+` (`pipe2+fuse`). The optimizer's rows (`stage1`, `stage1_mps`, `rose`) are plan files
or commands given to `paper_table.py` (`--row`, `--row-cmd`): adding a row is naming a plan.

Each workload also says how to make its CPU smoke variant (tiny sizes, CPU devices, a CPU simulator
standing in for a GPU or EGL one) so that CI runs the same harness end to end.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OPTIMIZER_ROWS = ("stage1", "stage1_mps", "rose")


@dataclass(frozen=True)
class Config:
    """One configuration of a workload: the workflow it runs, the rewrites that make its plan (none:
    the workflow itself), and the params it sets."""

    name: str
    workflow: Path
    requests: tuple[str, ...] = ()
    sets: tuple[tuple[str, str], ...] = ()
    plan: Path | None = None  # a ready plan file (the optimizer's rows)
    kind: str = "hand"  # "declared" | "hand" | one of OPTIMIZER_ROWS


@dataclass(frozen=True)
class Workload:
    name: str
    workflow: Path
    throughput: str  # metric per second written by `rose execute`: env_steps_per_s or tokens_per_s
    work_metric: str  # the per-iteration count it is made of: env_steps or tokens (summed over components)
    sweep: tuple[str, ...]  # hand-written configurations of the default sweep
    smoke_sweep: tuple[str, ...]
    loop: tuple[str, ...] | None = ("iteration", "epoch", "step")  # the interaction loop (shape figures)
    policy_node: str = "act"
    params: dict[str, Any] = field(default_factory=dict)  # --set for every configuration
    smoke_params: dict[str, Any] = field(default_factory=dict)
    smoke_edit: Callable[[dict[str, Any]], None] | None = None  # CPU variant of the workflow document
    variants: dict[str, Path] = field(default_factory=dict)  # hand-written workflow files by config name
    # what the workflow's processes need allowed on the command line (rose refuses loader/interpreter
    # variables and import paths a workflow asks for unless the user allows them: docs/reliability.md)
    trust: tuple[str, ...] = ()
    notes: str = ""
    targets: dict[str, float] | None = None  # shape targets of this workload (default: paper_table.TARGETS)

    def config(self, name: str) -> Config:
        """The configuration called `name` (see the module docstring)."""
        if name == "declared":
            return Config(name, self.workflow, kind="declared")
        if name in self.variants:
            return Config(name, self.variants[name])
        requests: list[str] = []
        sets: list[tuple[str, str]] = []
        for part in name.split("+"):
            if m := re.fullmatch(r"pipe(\d+)", part):
                requests += [f"split step {m[1]}", "interleave step"]
            elif m := re.fullmatch(r"sim(\d+)", part):
                sets.append(("sim_replicas", m[1]))
            elif m := re.fullmatch(r"splittime(\d+)", part):
                requests.append(f"split-time epoch {m[1]}")
            elif part == "fuse":
                requests.append("fuse epoch update")
            elif m := re.fullmatch(r"chain(\d+)", part):
                requests.append(f"split-chain generate ref score {m[1]}")
            else:
                raise ValueError(f"unknown configuration part {part!r} in {name!r} (declared, pipeG, simS, "
                                 f"splittimeK, fuse, chainG, {', '.join(self.variants) or 'no variants'}; joined by '+')")
        return Config(name, self.workflow, tuple(requests), tuple(sets))


def _cpu_devices(doc: dict[str, Any]) -> None:
    for comp in doc["components"].values():
        comp["device"] = "cpu"
        comp.pop("mps_quota", None)
        comp.pop("mps_priority", None)


def _smoke_mjx(doc: dict[str, Any]) -> None:
    """CPU stand-in: gymnasium's MuJoCo Reacher (ReacherVecSim: the same calls, outputs and observation
    as ReacherMjxSim) instead of MJX, which CI does not have."""
    _cpu_devices(doc)
    sim = doc["components"]["sim"]
    sim["impl"] = "examples.embodied.sim_reacher:ReacherVecSim"
    sim["args"].pop("frame_skip", None)
    for key in ("env", "python_path"):
        sim.pop(key, None)
    doc["components"]["policy"]["args"]["cuda_graphs"] = False


def _smoke_metaworld(doc: dict[str, Any]) -> None:
    """CPU: Meta-World without camera images (EGL needs a GPU), state-only policy."""
    _cpu_devices(doc)
    sim = doc["components"]["sim"]
    sim["args"].update(image_size=0, gl=None)
    sim.pop("env", None)
    for comp in ("policy", "trainer"):
        args = doc["components"][comp]["args"]
        args["image"] = False
        args["obs_tokens"] = 4
    doc["components"]["policy"]["args"]["cuda_graphs"] = False


def _smoke_llm(doc: dict[str, Any]) -> None:
    _cpu_devices(doc)


LONGTAIL_SMOKE = {"prompts": 8, "k": 4, "length_mean": 4, "length_p99": 12, "max_new_tokens": 16, "max_batch": 16,
                  "layers": 2, "d_model": 64, "heads": 4, "kv_heads": 2, "intermediate": 128, "context": 24,
                  "micro_tokens": 64, "ref_micro_tokens": 0, "minibatches": 2}


TINY_VLA = {"hidden": 32, "layers": 2, "heads": 4, "expert_layers": 1, "denoise_steps": 2, "micro_batch": 8,
            "trainable_blocks": 1}

WORKLOADS: dict[str, Workload] = {
    "mjx": Workload(
        name="mjx", workflow=ROOT / "workflows" / "paper_mjx_vla.yaml", throughput="env_steps_per_s",
        work_metric="env_steps", sweep=("declared", "pipe2", "pipe4", "pipe8", "splittime2", "fuse"),
        smoke_sweep=("declared", "pipe2", "fuse"),
        smoke_params={**TINY_VLA, "num_envs": 8, "steps": 2, "chunk": 2, "tokens": 4},
        smoke_edit=_smoke_mjx,
        trust=("--allow-env", "JAX_COMPILATION_CACHE_DIR", "--allow-path", "/tmp/mjxenv", "--allow-path", ".mjxenv"),
        notes="GPU simulator (MJX) next to the policy on one GPU: simulator processes are not swept (the "
              "simulator is not CPU-bound); `splittime2` runs two rollout epochs at once on their own "
              "processes (the best hand-written configuration on the H200, 2026-12-02)."),
    "metaworld": Workload(
        name="metaworld", workflow=ROOT / "workflows" / "paper_metaworld_vla.yaml", throughput="env_steps_per_s",
        work_metric="env_steps",
        sweep=("declared", "pipe2", "pipe4", "pipe8", "sim2", "sim4", "sim8", "fuse"),
        smoke_sweep=("declared", "pipe2", "sim2"),
        smoke_params={**TINY_VLA, "num_envs": 4, "steps": 2, "chunk": 2, "patch": 8},
        smoke_edit=_smoke_metaworld,
        notes="CPU physics + EGL rendering: simulator processes swept (hybrid replicas); pipelining and several "
              "simulator processes do not combine in rose today (`split step` refuses a loop whose nodes "
              "declare different batch sizes)."),
    "llm": Workload(
        name="llm", workflow=ROOT / "workflows" / "llm_grpo_gpu.yaml", throughput="tokens_per_s",
        work_metric="tokens", sweep=("declared", "llmpipe"), smoke_sweep=("declared", "llmpipe"),
        loop=None, policy_node="generate",
        variants={"llmpipe": ROOT / "workflows" / "llm_grpo_gpu_pipelined.yaml"},
        smoke_params={"prompts": 8, "k": 4, "max_new_tokens": 4, "minibatches": 2},
        smoke_edit=_smoke_llm,
        notes="Generation on the GPU, reward scoring on CPU workers: the hand-written variant overlaps the "
              "scoring of one prompt group with the generation of the next."),
    "llm_longtail": Workload(
        name="llm_longtail", workflow=ROOT / "workflows" / "llm_grpo_longtail_gpu.yaml", throughput="tokens_per_s",
        work_metric="generated_tokens", sweep=("declared", "chain2", "chain4", "chain8"),
        smoke_sweep=("declared", "chain2"), loop=None, policy_node="generate",
        smoke_params=LONGTAIL_SMOKE, smoke_edit=_smoke_llm,
        targets={"policy_share_min": 0.5, "sm_activity_min": 0.3},
        notes="A 0.5B-shaped decoder (random weights) generating lognormal completion lengths (mean 256, p99 2048) "
              "with continuous batching; reward on CPU workers, reference and learner micro-batched by tokens on "
              "the same GPU. The hand-written rows stream finished prompt groups to scoring (chainG); every row "
              "has the same micro-batches (they bound memory, not speed). Tokens/s: generated tokens over the "
              "iteration's seconds."),
}
