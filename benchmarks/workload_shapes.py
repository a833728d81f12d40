"""Calibration for the paper-shaped GPU workloads (issue 14): what choosing their sizes needs, measured
in ONE device call of at most ~4 minutes.

The shape targets (interaction loop >= 60% of the declared iteration; halving the policy's batch cuts
its call time to <= 0.65x; the declared iteration's mean SM activity < 50%) depend on a few numbers
that only the GPU can give:

* **policy** -- `FlowPolicy` phases for candidate (hidden, layers, tokens) configs at batch B and B/2,
  bf16: the backbone, one denoising step and the whole denoising loop eagerly and replayed from CUDA
  graphs (`DenoiseGraphs`), the head, the whole `act`; parameters, peak memory, SM activity per phase
  (NVML GPM over >= 0.5 s of back-to-back calls: GPM advances in ~100 ms steps).
* **trainer** -- one `PPOTrainer.update` with gradient accumulation over micro-batches, all blocks or
  only the top ones trainable, the critic recomputed or taken from the rollout: seconds, peak memory,
  SM activity.
* **mjx** -- `ReacherMjxSim` (GPU physics) step time per action chunk for (envs, chunk, frame_skip),
  the first call's compile time, and a second process's first call (JAX's persistent compilation
  cache, what every `rose execute` run after the first pays). Runs in a child process with the MJX
  import path (`benchmarks/mjx_env.sh` installs it into /tmp/mjxenv).
* **metaworld** -- `MetaWorldVecSim` step time with EGL camera images of a few sizes (child process;
  needs metaworld + mujoco 3.3.0 + EGL: skipped with the reason when absent).

Each section checks the remaining budget first and the JSON is rewritten after every section, so a
run that is cut short still returns what it measured. A short table is printed last.

    # GPU (see /work/notes or DEVELOPERS.md for the carry list):
    python3 benchmarks/workload_shapes.py --out $OUT/workload_shapes.json --budget-s 210
    # CPU smoke (tiny sizes, seconds; what tests/benchmarks runs):
    python3 benchmarks/workload_shapes.py --smoke --out /tmp/shapes.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.lib.common import Budget, machine, summary, time_calls, versions  # noqa: E402

# Candidate policies. Reacher-shaped (obs 10, act 2) for the MJX workload; the image one is the
# Meta-World (LIBERO-like) shape: 128x128 frames in 8x8 patches = 256 visual tokens + 4 proprio tokens.
REACHER = dict(obs_dim=10, act_dim=2, chunk=8, denoise_steps=10, expert_layers=4)
POLICIES: dict[str, dict[str, Any]] = {
    "d1024_l24_t256": dict(REACHER, hidden=1024, layers=24, heads=16, obs_tokens=256),
    "d2048_l16_t256": dict(REACHER, hidden=2048, layers=16, heads=16, obs_tokens=256),
    "img128_d1024_l24": dict(obs_dim=39, act_dim=4, chunk=8, denoise_steps=10, expert_layers=4, hidden=1024,
                             layers=24, heads=16, obs_tokens=4, image=True, image_size=128, patch=8),
}
EXTRA_POLICIES = {  # measured last, if the budget allows: the token knob
    "d1024_l24_t128": dict(REACHER, hidden=1024, layers=24, heads=16, obs_tokens=128),
}
BATCHES = {"d1024_l24_t256": (512, 256, 128), "img128_d1024_l24": (64, 32, 16)}
DEFAULT_BATCHES = (256, 128)
SMOKE_POLICIES = {
    "tiny": dict(obs_dim=10, act_dim=2, chunk=4, denoise_steps=3, expert_layers=1, hidden=32, layers=2, heads=4,
                 obs_tokens=8),
    "tiny_img": dict(obs_dim=39, act_dim=4, chunk=4, denoise_steps=3, expert_layers=1, hidden=32, layers=2, heads=4,
                     obs_tokens=4, image=True, image_size=16, patch=8),
}
# Trainer variants on the first candidate: (label, micro_batch, trainable_blocks, values, ppo_epochs);
# "top2_rollout_mb256_e2" is the paper workflows' default, "all_recompute_mb128_e1" the plain update
TRAINER_VARIANTS = (
    ("all_recompute_mb128_e1", 128, None, "recompute", 1),
    ("top2_rollout_mb256_e2", 256, 2, "rollout", 2),
    ("top2_rollout_mb256_e1", 256, 2, "rollout", 1),
    ("top4_rollout_mb256_e2", 256, 4, "rollout", 2),
    ("top0_rollout_mb256_e2", 256, 0, "rollout", 2),
)
MJX_COMBOS = ((256, 8, 2), (256, 8, 8), (128, 8, 8))  # (envs, chunk, frame_skip)
METAWORLD_COMBOS = ((8, 8, 0), (8, 8, 128), (8, 8, 224))  # (envs, chunk, image_size)


def _sync(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def _activity(fn: Any, sampler: Any, seconds: float, cuda: bool) -> float | None:
    """Mean device-wide SM activity over `seconds` of back-to-back calls (None without a sampler)."""
    if sampler is None:
        return None
    fn()
    _sync(cuda)
    t0 = time.perf_counter_ns()
    while time.perf_counter_ns() - t0 < seconds * 1e9:
        fn()
        _sync(cuda)
    return sampler.mean_activity([(t0, time.perf_counter_ns())])


def _obs(cfg: dict[str, Any], n: int, device: str) -> Any:
    import torch

    state = torch.randn(n, cfg["obs_dim"], device=device)
    if cfg.get("image"):
        size = cfg["image_size"]
        return {"state": state, "image": torch.randint(0, 255, (n, 3, size, size), dtype=torch.uint8, device=device)}
    return state


def measure_policy(name: str, cfg: dict[str, Any], batches: tuple[int, ...], args: argparse.Namespace,
                   sampler: Any) -> dict[str, Any]:
    """Every phase of `FlowPolicy` at each batch size, eager and with the denoising loop's CUDA graphs."""
    import torch

    from examples.embodied.model import count_parameters
    from examples.embodied.policy import FlowPolicy

    cuda = args.device == "cuda"
    t0 = time.perf_counter()
    policy = FlowPolicy(**cfg, num_envs=max(batches), device=args.device, cuda_graphs=cuda)
    _sync(cuda)
    model = policy.model
    out: dict[str, Any] = {"config": cfg, "build_s": time.perf_counter() - t0,
                           "params": count_parameters(model),
                           "backbone_params": sum(p.numel() for p in model.blocks.parameters()),
                           "expert_params": sum(p.numel() for p in model.expert.parameters()), "batches": {}}
    for n in batches:
        row = _policy_phases(policy, cfg, n, args, sampler)
        out["batches"][str(n)] = row
        print(f"  policy {name} n={n}: act {row.get('act_graph_ms', row['act_eager_ms'])['median']:.2f} ms", flush=True)
    med = {n: (r.get("act_graph_ms") or r["act_eager_ms"])["median"] for n, r in out["batches"].items()}
    ns = sorted(int(n) for n in med)
    out["halving_ratio"] = {f"{ns[i]}/{ns[i + 1]}": med[str(ns[i])] / med[str(ns[i + 1])] for i in range(len(ns) - 1)}
    if cuda:
        policy.graphs = None
        torch.cuda.empty_cache()
    return out


def _policy_phases(policy: Any, cfg: dict[str, Any], n: int, args: argparse.Namespace, sampler: Any) -> dict[str, Any]:
    """One batch size: each phase's time (median of `reps`), peak memory, SM activity."""
    import torch

    cuda = args.device == "cuda"
    rows = slice(0, n)
    obs = _obs(cfg, n, args.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    first = policy.backbone(obs, 0, 0, 0, rows)
    x, prefix = first["x"], first["prefix"]
    graphs = policy.graphs

    def eager(fn: Any) -> Any:
        def call() -> Any:
            policy.graphs = None
            try:
                return fn()
            finally:
                policy.graphs = graphs
        return call

    def loop_eager() -> Any:
        y = x
        for k in range(policy.cfg.denoise_steps):
            y = policy.flow_step(y, prefix, k, rows)["x"]
        return y

    phases: dict[str, Any] = {
        "backbone": lambda: policy.backbone(obs, 0, 0, 0, rows),
        "flow_step_eager": eager(lambda: policy.flow_step(x, prefix, 0, rows)),
        "denoise_loop_eager": eager(loop_eager),
        "head": lambda: policy.head(x, prefix, 0, 0, 0, rows),
        "act_eager": eager(lambda: policy.act(obs, 0, 0, 0, rows)),
    }
    if graphs is not None:
        phases["flow_step_graph"] = lambda: policy.flow_step(x, prefix, 0, rows)
        phases["denoise_loop_graph"] = lambda: graphs.loop(x, prefix)
        phases["act_graph"] = lambda: policy.act(obs, 0, 0, 0, rows)
    row: dict[str, Any] = {}
    for phase, fn in phases.items():
        row[f"{phase}_ms"] = summary(time_calls(fn, args.reps, warmup=2, cuda=cuda))
    if graphs is not None:  # the replayed loop computes what the eager loop computes
        row["graph_vs_eager_max_abs"] = float((graphs.loop(x, prefix) - eager(loop_eager)()).abs().max())
    if cuda:
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    if sampler is not None and args.activity_s > 0:
        for phase in ("backbone", "flow_step_eager", "flow_step_graph", "act_eager", "act_graph"):
            if phase in phases:
                row[f"{phase}_sm_activity"] = _activity(phases[phase], sampler, args.activity_s, cuda)
    return row


def measure_trainer(cfg: dict[str, Any], steps: int, n: int, args: argparse.Namespace, sampler: Any,
                    budget: Budget) -> dict[str, Any]:
    """One PPO update (epochs x 4 minibatches) of `steps x n` rows per variant: time, memory, activity."""
    import torch

    from examples.embodied.ppo import PPOTrainer

    cuda = args.device == "cuda"
    dev = args.device
    T, c, a = steps, cfg["chunk"], cfg["act_dim"]
    obs = _obs(cfg, T * n, dev)
    shaped = ({k: v.view(T, n, *v.shape[1:]) for k, v in obs.items()} if isinstance(obs, dict)
              else obs.view(T, n, -1))
    done = torch.zeros(T, n, device=dev)
    done[-1] = 1.0
    traj = {"obs": shaped, "next_obs": shaped, "x0": torch.randn(T, n, c, a, device=dev),
            "action": torch.randn(T, n, c, a, device=dev), "logp": torch.randn(T, n, device=dev) - 3,
            "value": torch.randn(T, n, device=dev), "reward": torch.randn(T, n, device=dev), "done": done}
    variants = TRAINER_VARIANTS if not args.smoke else tuple((v[0], 4, v[2] and 1, v[3], v[4]) for v in TRAINER_VARIANTS)
    out: dict[str, Any] = {"rows": T * n, "steps": T, "envs": n, "minibatches": 4, "variants": {}}
    for label, micro, trainable, values, epochs in variants:
        if budget.left() < 20:
            out["variants"][label] = {"skipped": "budget"}
            continue
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        trainer = PPOTrainer(**cfg, lr=3e-4, device=dev, ppo_epochs=epochs, minibatches=4, micro_batch=micro,
                             trainable_blocks=trainable, values=values)
        trainer.update(traj)  # warm: allocator, cuBLAS, autotuning
        _sync(cuda)
        t0 = time.perf_counter_ns()
        trainer.update(traj)
        _sync(cuda)
        t1 = time.perf_counter_ns()
        row = {"micro_batch": micro, "trainable_blocks": trainable, "values": values, "ppo_epochs": epochs,
               "update_s": (t1 - t0) / 1e9,
               "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)}
        if cuda:
            row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        if sampler is not None:
            row["sm_activity"] = sampler.mean_activity([(t0, t1)])
        out["variants"][label] = row
        print(f"  trainer {label}: {row['update_s']:.2f} s", flush=True)
        del trainer
    return out


def _child(section: str, spec: Any, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one simulator section in a child process (its own imports: MJX's MuJoCo, EGL)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", section, "--spec", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr.strip().splitlines()[-12:]}
    return json.loads(lines[-1])


def child_mjx(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: ReacherMjxSim step times (and compile times) for each (envs, chunk, frame_skip)."""
    import jax
    import torch

    from examples.embodied.sim_mjx import ReacherMjxSim

    device = "cuda" if jax.default_backend() == "gpu" else "cpu"
    sampler = _sampler() if device == "cuda" else None
    rows = []
    for n, chunk, frame_skip in spec["combos"]:
        t0 = time.perf_counter()
        sim = ReacherMjxSim(num_envs=n, chunk=chunk, frame_skip=frame_skip, device=device,
                            max_episode_steps=chunk * spec["chunks_per_episode"])
        sim.reset(it=0, ep=0)
        action = torch.rand(n, chunk, 2) * 2 - 1
        sim.step(action)
        first = time.perf_counter() - t0
        times = time_calls(lambda sim=sim, action=action: sim.step(action), spec["reps"], warmup=1)
        t1 = time.perf_counter_ns()
        for _ in range(spec["reps"]):
            sim.step(action)
        activity = sampler.mean_activity([(t1, time.perf_counter_ns())]) if sampler else None
        rows.append({"envs": n, "chunk": chunk, "frame_skip": frame_skip, "first_call_s": first,
                     "step_ms": summary(times), "sm_activity": activity})
    return {"device": device, "jax": jax.__version__, "rows": rows}


def child_metaworld(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: MetaWorldVecSim step times per chunk, without and with camera images."""
    import torch

    from examples.embodied.sim_metaworld import MetaWorldVecSim

    rows = []
    for n, chunk, size in spec["combos"]:
        t0 = time.perf_counter()
        sim = MetaWorldVecSim(num_envs=n, chunk=chunk, image_size=size, gl=spec.get("gl"), camera="corner2",
                              max_episode_steps=100)
        sim.reset(it=0, ep=0)
        build = time.perf_counter() - t0
        action = torch.rand(n, chunk, 4) * 2 - 1
        times = time_calls(lambda sim=sim, action=action: sim.step(action), spec["reps"], warmup=1)
        rows.append({"envs": n, "chunk": chunk, "image_size": size, "build_s": build, "step_ms": summary(times),
                     "ms_per_env_step": summary([t / (n * chunk) for t in times])})
        sim.close()
    return {"rows": rows}


def _sampler() -> Any:
    from interpreter.gpu_activity import ActivitySampler

    sampler = ActivitySampler(0, interval_s=0.1)
    if sampler.open() == "none":
        return None
    sampler.start()
    return sampler


def _table(results: dict[str, Any]) -> str:
    lines = ["policy            batch  backbone  step(eager/graph)  loop(eager/graph)  act(eager/graph)  act SM"]
    for name, pol in results.get("policy", {}).items():
        if "batches" not in pol:
            lines.append(f"{name:<17} {pol}")
            continue
        for n, r in pol["batches"].items():
            def m(key: str, r: dict = r) -> str:
                v = r.get(key)
                return f"{v['median']:.1f}" if v else "-"
            act_sm = r.get("act_graph_sm_activity", r.get("act_eager_sm_activity"))
            lines.append(f"{name:<17} {n:>5}  {m('backbone_ms'):>8}  {m('flow_step_eager_ms'):>7}/{m('flow_step_graph_ms'):<7}"
                         f"   {m('denoise_loop_eager_ms'):>7}/{m('denoise_loop_graph_ms'):<7}  "
                         f"{m('act_eager_ms'):>7}/{m('act_graph_ms'):<7}  {act_sm if act_sm is None else f'{act_sm:.2f}'}")
        lines.append(f"{'':<17} halving {pol.get('halving_ratio')}  params {pol['params'] / 1e6:.0f}M")
    for label, v in results.get("trainer", {}).get("variants", {}).items():
        lines.append(f"trainer {label:<22} {v}")
    for section in ("mjx", "metaworld"):
        for row in results.get(section, {}).get("rows", []) or [results.get(section)]:
            lines.append(f"{section} {row}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("workload_shapes.json"))
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, 2 repeats: checks the script runs")
    ap.add_argument("--sections", default="policy,trainer,mjx,metaworld")
    ap.add_argument("--policies", default=None, help="comma-separated names from POLICIES (default: all)")
    ap.add_argument("--budget-s", type=float, default=210.0)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--activity-s", type=float, default=0.5, help="seconds of back-to-back calls per phase (GPM)")
    ap.add_argument("--trainer-steps", type=int, default=8, help="rollout steps T of the trainer's batch (T x B rows)")
    ap.add_argument("--mjx-path", default="/tmp/mjxenv", help="import path holding mujoco-mjx (mjx_env.sh)")
    ap.add_argument("--child", choices=("mjx", "metaworld"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = child_mjx if args.child == "mjx" else child_metaworld
        try:
            result = fn(json.loads(args.spec))
        except ImportError as exc:  # the simulator's packages are not on this machine: say so, not a traceback
            result = {"skipped": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)
        return

    import torch

    cuda = torch.cuda.is_available() and not args.smoke
    args.device = "cuda" if cuda else "cpu"
    if args.smoke:
        args.reps, args.activity_s = 2, 0.0
    budget = Budget(args.budget_s)
    sections = set(args.sections.split(","))
    results: dict[str, Any] = {"script": "benchmarks/workload_shapes.py", "argv": sys.argv[1:], "machine": machine(),
                               "versions": versions(), "device": args.device, "smoke": args.smoke}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        results["gpu"] = {"name": props.name, "sms": props.multi_processor_count,
                          "memory_gb": props.total_memory / 2**30,
                          "flash_sdp": torch.backends.cuda.flash_sdp_enabled()}
    sampler = _sampler() if cuda else None
    results["sampler"] = getattr(sampler, "source", "none")
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        results["elapsed_s"] = budget.elapsed()
        args.out.write_text(json.dumps(results, indent=1) + "\n")

    policies = SMOKE_POLICIES if args.smoke else POLICIES
    extras = {} if args.smoke else EXTRA_POLICIES
    if args.policies:
        chosen = args.policies.split(",")
        policies = {k: v for k, v in {**policies, **extras}.items() if k in chosen}
        extras = {}

    def policy_section(which: dict[str, dict[str, Any]]) -> None:
        for name, cfg in which.items():
            if budget.left() < 60 and not args.smoke:
                results["policy"][name] = {"skipped": "budget"}
                continue
            batches = (8, 4) if args.smoke else BATCHES.get(name, DEFAULT_BATCHES)
            results["policy"][name] = measure_policy(name, cfg, batches, args, sampler)
            save()

    results["policy"] = {}
    if "policy" in sections:
        policy_section(policies)
    if "trainer" in sections:
        name, cfg = next(iter(policies.items()))
        n = 8 if args.smoke else BATCHES.get(name, DEFAULT_BATCHES)[1]
        results["trainer"] = {"policy": name, **measure_trainer(cfg, 2 if args.smoke else args.trainer_steps, n, args,
                                                               sampler, budget)}
        save()
    if "mjx" in sections:
        results["mjx"] = _mjx(args, budget)
        save()
    if "metaworld" in sections:
        if budget.left() < 25 and not args.smoke:
            results["metaworld"] = {"skipped": "budget"}
        else:
            spec = {"combos": [(2, 2, 0)] if args.smoke else METAWORLD_COMBOS, "reps": args.reps,
                    "gl": "egl" if cuda else None}
            env = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"} if cuda else {"MUJOCO_GL": "disable"}
            results["metaworld"] = _child("metaworld", spec, env, timeout=max(20.0, budget.left() - 5))
        save()
    if "policy" in sections:
        policy_section(extras)
    if sampler is not None:
        sampler.close()
    save()
    print(_table(results))


def _mjx(args: argparse.Namespace, budget: Budget) -> dict[str, Any]:
    """MJX step times in a child (first process: compiles), then one combo again in a second child
    (what a later run pays when JAX's persistent compilation cache holds the programs)."""
    combos = [(8, 2, 2)] if args.smoke else list(MJX_COMBOS)
    env = {"PYTHONPATH": os.pathsep.join([args.mjx_path, str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "MUJOCO_GL": "disable",
           "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR", "/tmp/jax-cache")}
    if budget.left() < 40 and not args.smoke:
        return {"skipped": "budget"}
    spec = {"combos": combos, "reps": args.reps, "chunks_per_episode": 6}
    out = _child("mjx", spec, env, timeout=max(30.0, budget.left() - 30))
    if "rows" in out and budget.left() > 30:
        again = _child("mjx", {**spec, "combos": combos[:1]}, env, timeout=max(20.0, budget.left() - 5))
        out["cached_first_call_s"] = (again.get("rows") or [{}])[0].get("first_call_s", again.get("error"))
    return out


if __name__ == "__main__":
    main()
