"""Root cause of the NaN loss under some MPS SM quotas (issue 16): the first PPO update of
`workflows/embodied_ppo_gpu.yaml` is non-finite with the trainer at 60% (78 SMs), finite at 50/90/100%.

One command, one device call, everything adaptive:
  1. capture: run the declared workflow for one iteration on the local backend (no MPS, full GPU) with
     the trainer's `update` wrapped so that its FIRST call saves the real trajectory, the trainer's
     constructor arguments and its state (weights, optimizer) before updating;
  2. replay that update in a fresh process per configuration (an MPS quota is fixed when CUDA starts),
     under an MPS daemon this script owns: quotas 100/60/50 first; each child reports whether the loss and
     the gradient norm are finite, the first module whose forward output is non-finite (forward hooks),
     the first backward op that produced a non-finite value (`torch.autograd.detect_anomaly`), and the SM
     count it saw;
  3. for a failing quota: variants that each change one suspect (SDPA backend, autocast off, cuBLAS vs
     cuBLASLt, reduced-precision reductions off, CUDA_LAUNCH_BLOCKING=1 for a race) and the CUDA kernels
     of one training step at the failing and a passing quota (torch.profiler), so the differing kernel is
     named; then the failing module's own inputs are saved and the module alone is run under each variant;
  4. if the replay never fails, the end-to-end workflow at 60/60 through `--backend ray` (the only
     difference left is the concurrent policy process);
  5. the first update at every quota from 10% to 100% in 10% steps (the safety table).

  python3 benchmarks/quota_nan_root_cause.py OUT_DIR [--quick] [--quotas 100,20,10]

`--quotas` sets step 2's first quotas (default 100,60,50): the first failing one is the one studied. At 20%
(26 SMs) the first update was NaN although the GEMM self-check passes there (issue 16): `--quotas 100,20,10`
asks which op fails at that level.
Writes OUT_DIR/quota_nan_root_cause.json and prints a short table last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "workflows" / "embodied_ppo_gpu.yaml"

CAPTURE = r'''
import sys, torch
from examples.embodied import ppo
dest = sys.argv[1]
orig_init, orig_update = ppo.PPOTrainer.__init__, ppo.PPOTrainer.update
def init(self, *args, **kwargs):
    orig_init(self, *args, **kwargs)
    self._probe_kwargs = dict(kwargs)
def cpu(tree):
    if isinstance(tree, dict):
        return {k: cpu(v) for k, v in tree.items()}
    return tree.detach().to("cpu") if torch.is_tensor(tree) else tree
def update(self, traj):
    if not getattr(ppo, "_probe_saved", False):
        ppo._probe_saved = True
        torch.save({"traj": cpu(traj), "kwargs": self._probe_kwargs, "weights": cpu(self.get_state("weights")),
                    "optimizer": self.get_state("optimizer")}, dest)
    return orig_update(self, traj)
ppo.PPOTrainer.__init__, ppo.PPOTrainer.update = init, update
from rose_cli.main import app
try:
    app(["execute", sys.argv[2], "--backend", "local", "-n", "1", "--no-mps", "-q"], standalone_mode=False)
except SystemExit as e:
    print("exit", e.code)
'''

REPLAY = r'''
import json, os, sys, traceback, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from examples.embodied.ppo import PPOTrainer
saved = torch.load(sys.argv[1], weights_only=False)
variant = sys.argv[2]
DEV = os.environ.get("PROBE_DEVICE", "cuda")
out = {"variant": variant, "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if DEV == "cuda" else 0,
       "quota": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
if variant == "no_reduced_precision":
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
if variant == "cublas":
    torch.backends.cuda.preferred_blas_library("cublas")
if variant == "cublaslt":
    torch.backends.cuda.preferred_blas_library("cublaslt")
if variant == "deterministic":
    torch.use_deterministic_algorithms(True, warn_only=True)
kwargs = dict(saved["kwargs"], device=DEV)
tr = PPOTrainer(**kwargs)
tr.set_state("weights", saved["weights"])
tr.set_state("optimizer", saved["optimizer"])
if variant == "no_autocast":
    import contextlib
    import examples.embodied.ppo as ppo_mod
    ppo_mod.autocast_for = lambda device: contextlib.nullcontext()
first = []
def hook(name):
    def fn(mod, inp, res):
        if first:
            return
        t = res if torch.is_tensor(res) else (res[0] if isinstance(res, tuple) and res and torch.is_tensor(res[0]) else None)
        if t is not None and t.is_floating_point() and not torch.isfinite(t).all():
            ins = [i for i in inp if torch.is_tensor(i)]
            first.append({"module": name, "type": type(mod).__name__, "out_shape": list(t.shape), "out_dtype": str(t.dtype),
                          "nonfinite": int((~torch.isfinite(t)).sum()),
                          "inputs_finite": [bool(torch.isfinite(i).all()) for i in ins if i.is_floating_point()],
                          "inputs_absmax": [float(i.float().abs().max()) for i in ins if i.is_floating_point() and i.numel()],
                          "input_shapes": [list(i.shape) for i in ins]})
            if os.environ.get("PROBE_SAVE_INPUTS"):
                torch.save({"name": name, "inputs": [i.detach().cpu() for i in ins],
                            "state": {k: v.detach().cpu() for k, v in mod.state_dict().items()}},
                           os.environ["PROBE_SAVE_INPUTS"])
    return fn
if variant != "profile":
    for name, m in tr.model.named_modules():
        if name:
            m.register_forward_hook(hook(name))
sdpa = {"math_sdpa": [SDPBackend.MATH], "flash_sdpa": [SDPBackend.FLASH_ATTENTION],
        "efficient_sdpa": [SDPBackend.EFFICIENT_ATTENTION], "cudnn_sdpa": [SDPBackend.CUDNN_ATTENTION]}.get(variant)
def run():
    if sdpa:
        with sdpa_kernel(sdpa):
            tr.update(saved["traj"])
    else:
        tr.update(saved["traj"])
try:
    if variant == "profile":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            try:
                run()
            except FloatingPointError as e:
                out["error"] = str(e)[:300]
            torch.cuda.synchronize()
        names = {}
        for ev in prof.events():
            if ev.device_type.name == "CUDA":
                names[ev.name] = names.get(ev.name, 0) + 1
        out["kernels"] = names
    elif variant == "anomaly":
        with torch.autograd.detect_anomaly(check_nan=True):
            run()
    else:
        run()
    m = tr.pop_metrics()
    out.update(loss=m.get("loss"), grad_norm=m.get("grad_norm"), finite=True)
except Exception as e:  # the probe reports every failure as data
    out.update(finite=False, error=f"{type(e).__name__}: {str(e)[:600]}",
               where=traceback.format_exc().strip().splitlines()[-6:])
out["first_nonfinite_forward"] = first[0] if first else None
print("PROBE " + json.dumps(out))
'''

MODULE_ALONE = r'''
import json, sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from examples.embodied.ppo import PPOTrainer
saved = torch.load(sys.argv[1], weights_only=False)
captured = torch.load(sys.argv[2], weights_only=False)
tr = PPOTrainer(**dict(saved["kwargs"], device="cuda"))
mod = dict(tr.model.named_modules())[captured["name"]]
mod.load_state_dict(captured["state"])
inputs = [i.cuda() for i in captured["inputs"]]
out = {"module": captured["name"], "sm_count": torch.cuda.get_device_properties(0).multi_processor_count, "runs": {}}
for label, backends in (("default", None), ("math", [SDPBackend.MATH]), ("flash", [SDPBackend.FLASH_ATTENTION]),
                        ("efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("cudnn", [SDPBackend.CUDNN_ATTENTION])):
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if backends:
                with sdpa_kernel(backends):
                    y = mod(*inputs)
            else:
                y = mod(*inputs)
        y = y if torch.is_tensor(y) else y[0]
        out["runs"][label] = {"nonfinite": int((~torch.isfinite(y)).sum()), "numel": y.numel()}
    except Exception as e:
        out["runs"][label] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
print("PROBE " + json.dumps(out))
'''


def _env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = dict(base)
    env.update(extra)
    return env


def _child(code: str, args: list[str], env: dict[str, str], timeout: int = 240) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("PROBE ")), None)
    result = json.loads(line[6:]) if line else {"rc": p.returncode, "stderr": p.stderr[-2000:]}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def main() -> None:
    out_dir = Path(sys.argv[1])
    quick = "--quick" in sys.argv
    quotas = (100, 60, 50)
    if "--quotas" in sys.argv:
        quotas = tuple(int(q) for q in sys.argv[sys.argv.index("--quotas") + 1].split(","))
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nanprobe-"))
    base = _env(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", PYTHONUNBUFFERED="1")
    report: dict = {"workflow": str(WORKFLOW.relative_to(ROOT)), "steps": []}
    import torch

    report["torch"] = torch.__version__
    report["cuda"] = torch.version.cuda
    report["cudnn"] = torch.backends.cudnn.version()
    report["gpu"] = torch.cuda.get_device_name(0)

    saved = work / "update0.pt"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CAPTURE, str(saved), str(WORKFLOW)], env=base, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    report["capture"] = {"rc": p.returncode, "saved": saved.exists(), "wall_s": round(time.perf_counter() - t0, 1),
                         "tail": (p.stdout + p.stderr)[-1500:]}
    print("capture", report["capture"]["saved"], report["capture"]["wall_s"], "s", flush=True)
    if not saved.exists():
        (out_dir / "quota_nan_root_cause.json").write_text(json.dumps(report, indent=1))
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit("the capture run saved no first update: nothing to replay")

    root = tempfile.mkdtemp(prefix="mps-")
    mps = _env(base, CUDA_MPS_PIPE_DIRECTORY=f"{root}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{root}/log")
    os.makedirs(f"{root}/pipe")
    os.makedirs(f"{root}/log")
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps, check=True)

    def replay(quota: int, variant: str = "default", **extra: str) -> dict:
        r = _child(REPLAY, [str(saved), variant], _env(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota), **extra))
        r.setdefault("quota", str(quota))
        r.setdefault("variant", variant)
        report["steps"].append(r)
        (out_dir / "quota_nan_root_cause.json").write_text(json.dumps(report, indent=1, default=str))
        ff = r.get("first_nonfinite_forward") or {}
        print(f"quota {quota:>3} {variant:<22} sms {r.get('sm_count')} finite {r.get('finite')} "
              f"first {ff.get('module')} err {str(r.get('error', r.get('stderr', '')))[:120]} ({r['wall_s']} s)",
              flush=True)
        return r

    try:
        first = {q: replay(q) for q in quotas}
        failing = [q for q, r in first.items() if not r.get("finite")]
        report["failing_quotas_initial"] = failing
        if failing:
            q = failing[0]
            passing = next((p for p, r in first.items() if r.get("finite")), 100)
            for variant in ("anomaly", "math_sdpa", "flash_sdpa", "efficient_sdpa", "cudnn_sdpa", "no_autocast",
                            "no_reduced_precision", "cublas", "cublaslt", "deterministic"):
                replay(q, variant)
            replay(q, "default", CUDA_LAUNCH_BLOCKING="1")
            report["steps"][-1]["variant"] = "launch_blocking"
            kern_fail = replay(q, "profile")
            kern_pass = replay(passing, "profile")
            kf, kp = kern_fail.get("kernels", {}), kern_pass.get("kernels", {})
            report["kernels_only_failing"] = sorted(set(kf) - set(kp))
            report["kernels_only_passing"] = sorted(set(kp) - set(kf))
            for s in (kern_fail, kern_pass):
                s["kernels"] = {k: v for k, v in s.get("kernels", {}).items()}
            captured = work / "module_inputs.pt"
            replay(q, "default", PROBE_SAVE_INPUTS=str(captured))
            if captured.exists():
                for quota in (q, passing):
                    r = _child(MODULE_ALONE, [str(saved), str(captured)],
                               _env(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota)))
                    r["quota"] = quota
                    report.setdefault("module_alone", []).append(r)
                    print("module alone", quota, json.dumps(r)[:400], flush=True)
        elif not quick:
            # the replay is finite at every quota: the concurrent policy process is the only difference left
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "rose_cli", "execute", str(WORKFLOW), "--backend", "ray",
                                "-n", "1", "--set", "trainer_quota=60", "--set", "policy_quota=60", "-q"],
                               env=base, capture_output=True, text=True, timeout=300, cwd=ROOT)
            report["end_to_end_60_60"] = {"rc": p.returncode, "wall_s": round(time.perf_counter() - t0, 1),
                                          "tail": (p.stdout + p.stderr)[-2500:]}
            print("end to end 60/60: rc", p.returncode, (p.stdout + p.stderr)[-600:], flush=True)
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=mps, text=True)

    if not quick:
        os.environ.update({k: v for k, v in base.items() if k == "PYTHONPATH"})
        sweep = {}
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps, check=True)
        try:
            for quota in range(10, 101, 10):
                r = replay(quota)
                sweep[quota] = {"finite": r.get("finite"), "sm_count": r.get("sm_count"), "loss": r.get("loss")}
        finally:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=mps, text=True)
        report["sweep"] = sweep
    (out_dir / "quota_nan_root_cause.json").write_text(json.dumps(report, indent=1, default=str))
    print("\nquota  SMs  finite  first non-finite module / error")
    for s in report["steps"]:
        ff = (s.get("first_nonfinite_forward") or {}).get("module")
        print(f"{s.get('quota'):>5} {str(s.get('sm_count')):>4}  {str(s.get('finite')):<6} {s.get('variant'):<20} "
              f"{ff or ''} {str(s.get('error', ''))[:80]}")


if __name__ == "__main__":
    main()
