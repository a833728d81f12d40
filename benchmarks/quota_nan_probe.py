"""Why did the embodied PPO trainer produce NaN under a 25% MPS quota on the H200 (benchmarks/results/
gpu_runs/ppo_mps)? One PPO update of the embodied_ppo_gpu trainer on a fixed synthetic trajectory, in
a fresh process per MPS quota (a quota is fixed when CUDA starts), with forward hooks naming the first
module whose output is not finite, and the same with SDPA restricted to the math kernel.
  python3 benchmarks/quota_nan_probe.py OUT.json          (starts and stops its own MPS daemon)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from examples.embodied.ppo import PPOTrainer
torch.manual_seed(0)
kw = dict(obs_dim=10, act_dim=2, chunk=2, hidden=512, denoise_steps=10, lr=3e-4, sync_every=2, layers=8, heads=8,
          expert_layers=4, device="cuda")
T, N = 25, 256
g = torch.Generator().manual_seed(1)
traj = {"obs": torch.randn(T, N, 10, generator=g), "next_obs": torch.randn(T, N, 10, generator=g),
        "x0": torch.randn(T, N, 2, 2, generator=g), "action": torch.randn(T, N, 2, 2, generator=g),
        "logp": torch.randn(T, N, generator=g) - 3, "reward": torch.randn(T, N, generator=g),
        "done": (torch.rand(T, N, generator=g) < 0.04).float()}
out = {"sm_count": torch.cuda.get_device_properties(0).multi_processor_count}
for mode in ("default", "math_sdpa"):
    tr = PPOTrainer(**kw)
    first = []
    def hook(mod, inp, res, name=None):
        t = res if torch.is_tensor(res) else (res[0] if isinstance(res, tuple) and res and torch.is_tensor(res[0]) else None)
        if t is not None and not first and not torch.isfinite(t).all():
            first.append(name)
    for name, m in tr.model.named_modules():
        m.register_forward_hook(lambda mod, i, r, name=name: hook(mod, i, r, name))
    try:
        if mode == "math_sdpa":
            with sdpa_kernel([SDPBackend.MATH]):
                tr.update(traj)
        else:
            tr.update(traj)
        m = tr.pop_metrics()
        finite = all(torch.isfinite(p).all().item() for p in tr.model.parameters())
        out[mode] = {"loss": m.get("loss"), "grad_norm": m.get("grad_norm"), "weights_finite": finite,
                     "first_nonfinite_module": first[0] if first else None}
    except Exception as e:
        out[mode] = {"error": repr(e)[:500]}
print(json.dumps(out))
'''


def main() -> None:
    dest = sys.argv[1]
    root = tempfile.mkdtemp(prefix="mps-probe-")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{root}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{root}/log")
    os.makedirs(f"{root}/pipe")
    os.makedirs(f"{root}/log")
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    results = {}
    try:
        for quota in (100, 50, 25, 10):
            child_env = dict(env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota))
            p = subprocess.run([sys.executable, "-c", CHILD], env=child_env, capture_output=True, text=True, timeout=150)
            line = (p.stdout.strip().splitlines() or [""])[-1]
            try:
                results[quota] = json.loads(line)
            except ValueError:
                results[quota] = {"rc": p.returncode, "stderr": p.stderr[-1500:]}
            print(quota, results[quota], flush=True)
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True)
    with open(dest, "w") as f:
        json.dump({"torch": __import__("torch").__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
