"""The trainer -> policy weight refresh between two Ray processes, with torch's own tensor pickling
(`default`), rose's raw out-of-band bytes (`rose`) and, on a GPU, rose's CUDA IPC path (`rose_ipc`: what the
runtime uses where both processes share the GPU; interpreter/tensor_transport.py), each as plain calls and
inside a Ray Compiled Graph (`*_compiled`), interleaved round by round.

What it times, per refresh: `trainer.get_weights()` in the trainer's process, the value's way through Ray
(the object store), and `policy.load_weights(w)` in the policy's process up to device completion -- the
`publish` -> `sync` edge of the paper workflows, whose gap the H200 timelines show at ~1 s per iteration.
Both components are built from the workflow file's own arguments (the real model, not a stand-in); the
two processes register or deregister the transport between rounds, so one pair of processes serves both.
Also checks that both transports load bit-identical weights into the policy.

    python3 benchmarks/weight_transfer.py --out $OUT/weight_transfer.json                     # GPU (H200)
    python3 benchmarks/weight_transfer.py --device cpu --out /tmp/weight_transfer_cpu.json
    python3 benchmarks/weight_transfer.py --smoke                                             # tiny, CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.lib.common import machine, summary, versions  # noqa: E402

TINY = {"hidden": 32, "layers": 2, "heads": 4, "expert_layers": 1, "denoise_steps": 2, "trainable_blocks": 1,
        "num_envs": 4, "micro_batch": 8, "image_size": 16}


class _Side:
    """One component in its own Ray process, with the transport switchable (Ray's serializer registry is
    per process)."""

    def __init__(self, comp: Any, seed: int, device: str) -> None:
        sys.path.insert(0, str(ROOT))
        from interpreter.components import construct

        self.obj = construct(comp, seed, device, ["examples"])
        self.device = device

    def transport(self, rose: bool) -> None:
        from interpreter import tensor_transport

        if rose:
            tensor_transport.register()
        else:
            tensor_transport.unregister()

    def publish(self, _: Any = None) -> Any:  # (the argument: a compiled graph's input, unused)
        from interpreter import tensor_transport

        tensor_transport.device_site(None)  # (this thread may have run publish_ipc before)
        return self.obj.get_weights()["w"]

    def publish_ipc(self, _: Any = None) -> Any:
        """The published tensors as rose sends them between processes on one GPU (CUDA IPC: its runtime
        marks such a compiled call with `device_site`; here every publish is one)."""
        from interpreter import tensor_transport

        tensor_transport.device_site("publish")
        return self.obj.get_weights()["w"]

    def sync(self, w: Any) -> float:
        import torch

        self.obj.load_weights(w)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    def digest(self) -> str:
        import hashlib

        import torch

        h = hashlib.sha256()
        for name, t in sorted(self.obj.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def nbytes(self) -> tuple[int, int]:
        w = self.obj.get_weights()["w"]
        return len(w), sum(t.numel() * t.element_size() for t in w.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflow", type=Path, default=ROOT / "workflows" / "paper_metaworld_vla.yaml")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=4, help="refreshes per transport per round")
    ap.add_argument("--smoke", action="store_true", help="tiny model sizes, 2 rounds (CPU)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import ray
    import torch

    from rose_dsl import load_workflow

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    params = dict(TINY) if args.smoke else {}
    wf = load_workflow(args.workflow, params)
    rounds = 2 if args.smoke else args.rounds
    ray.init(num_cpus=4, num_gpus=1 if device.startswith("cuda") else 0, include_dashboard=False,
             logging_level="ERROR")
    gpu = {"num_gpus": 0.5} if device.startswith("cuda") else {}
    side = ray.remote(_Side)
    trainer = side.options(**gpu).remote(wf.components["trainer"], wf.seed, device)
    policy = side.options(**gpu).remote(wf.components["policy"], wf.seed, device)
    tensors, nbytes = ray.get(trainer.nbytes.remote())
    names: tuple[str, ...] = ("default", "rose", "default_compiled", "rose_compiled")
    if device.startswith("cuda"):  # same-GPU processes: CUDA IPC, what colocated RL frameworks use
        names += ("rose_ipc", "rose_ipc_compiled")
    seconds: dict[str, list[float]] = {n: [] for n in names}
    digests: dict[str, set[str]] = {n: set() for n in names}
    started = time.perf_counter()
    for r in range(rounds + 1):  # round 0: warm-up, not measured
        for name in (names if r % 2 else tuple(reversed(names))):
            ray.get([trainer.transport.remote(name.startswith("rose")), policy.transport.remote(name.startswith("rose"))])
            dag = None
            if name.endswith("_compiled"):  # as rose runs a GPU workflow: one Ray Compiled Graph per iteration
                from ray.dag import InputNode

                with InputNode() as inp:
                    if name.startswith("rose_ipc"):
                        dag = policy.sync.bind(trainer.publish_ipc.bind(inp)).experimental_compile()
                    else:
                        dag = policy.sync.bind(trainer.publish.bind(inp)).experimental_compile()
            for i in range(args.reps):
                t0 = time.perf_counter()
                if dag is not None:
                    end = ray.get(dag.execute(i))
                elif name == "rose_ipc":
                    end = ray.get(policy.sync.remote(trainer.publish_ipc.remote()))
                else:
                    end = ray.get(policy.sync.remote(trainer.publish.remote()))
                if r:
                    seconds[name].append(max(end, t0) - t0)  # (one host clock: both processes on this machine)
            if dag is not None:
                dag.teardown()
            digests[name].add(ray.get(policy.digest.remote()))
    ray.shutdown()
    result = {
        "script": "benchmarks/weight_transfer.py", "argv": sys.argv[1:] if argv is None else argv,
        "machine": machine(), "versions": versions(), "device": device, "workflow": str(args.workflow.relative_to(ROOT)),
        "params": params, "tensors": tensors, "bytes": nbytes, "rounds": rounds, "reps": args.reps,
        "seconds": {k: summary(v) for k, v in seconds.items()},
        "all_seconds": seconds,
        "speedup_median": statistics.median(seconds["default"]) / statistics.median(seconds["rose"]),
        "speedup_median_compiled": statistics.median(seconds["default_compiled"])
        / statistics.median(seconds["rose_compiled"]),
        "speedup_median_ipc": (statistics.median(seconds["default_compiled"])
                               / statistics.median(seconds["rose_ipc_compiled"]) if "rose_ipc_compiled" in seconds else None),
        "bit_identical": len(set().union(*digests.values())) == 1,
        "elapsed_s": time.perf_counter() - started,
        "definition": "seconds from the driver's submit of trainer.get_weights to the end of policy.load_weights "
                      "(device synchronised), median over rounds x reps; rounds alternate the order; *_compiled: "
                      "the two calls as one Ray Compiled Graph (how rose runs GPU workflows)",
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(f"{tensors} tensors, {nbytes / 1e6:.1f} MB: default {result['seconds']['default']['median']:.3f} s, "
          f"rose {result['seconds']['rose']['median']:.3f} s ({result['speedup_median']:.2f}x); compiled graph: "
          f"default {result['seconds']['default_compiled']['median']:.3f} s, rose "
          f"{result['seconds']['rose_compiled']['median']:.3f} s ({result['speedup_median_compiled']:.2f}x); "
          + (f"CUDA IPC {result['seconds']['rose_ipc']['median']:.4f} s, compiled "
             f"{result['seconds']['rose_ipc_compiled']['median']:.4f} s; " if "rose_ipc" in seconds else "")
          + f"bit-identical {result['bit_identical']}")
    return 0 if result["bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
