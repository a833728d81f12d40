#!/usr/bin/env bash
# Install MJX (mujoco 3.17 + mujoco-mjx) into its own import dir, /tmp/mjxenv, on the GPU machine,
# offline, from wheels carried in the repo's ignored .whl/ folder. The machine's own JAX (0.11.2 with
# CUDA) stays the one in use; the project's mujoco 3.3.0 is untouched: only the processes whose
# PYTHONPATH starts with /tmp/mjxenv (workflows/embodied_ppo_mjx.yaml's sim, via `python_path:`)
# see mujoco 3.17.
#
# Populate .whl/ on a machine with PyPI access, from the repo root (Python 3.12, manylinux x86_64;
# ~35 MB, 26.7 of them the mujoco wheel):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl "mujoco==3.17.0" "mujoco-mjx==3.17.0" "trimesh==5.2.0" "absl-py==2.5.1" \
#     "etils[epath]==1.15.0" "fsspec==2026.9.0" "zipp==4.1.2"
# That is mujoco-mjx's full requirement list (absl-py, etils[epath], jax, jaxlib, mujoco, scipy,
# trimesh) minus what the GPU image has (jax, jaxlib, scipy, numpy, typing_extensions). mujoco's own
# glfw / pyopengl / websockets are left out (3.7 MB): only its renderers and viewer use them, and
# mujoco imports those inside `try: ... except ImportError` (the workflow also sets MUJOCO_GL=disable).
#
# Usage (repo root, GPU machine):  bash benchmarks/mjx_env.sh [--bench]
#   MJXENV=/other/dir WHEELS=/other/wheels bash benchmarks/mjx_env.sh   # other locations
# --bench: also step ReacherMjxSim on the GPU at a few num_envs (BENCH_ENVS, default
# "256 2048 8192 32768") and print env-steps/s (JSON to $OUT/mjx_bench.json when OUT is set).
#
# Or from the packed bundle (benchmarks/mjx_bundle.sh, ~7 MB: fits in one device call with the Ray bundle):
# when .mjxbundle/mjx-site.tar.xz exists it is unpacked into the target instead of installing wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${MJXENV:-/tmp/mjxenv}
WHEELS=${WHEELS:-.whl}
BUNDLE=${MJXBUNDLE:-.mjxbundle/mjx-site.tar.xz}
PY=${PYTHON:-python3}

# mujoco and mujoco-mjx always (the image may hold another mujoco); the others only where the image
# lacks them, so that the image's versions are not shadowed.
if [ -f "$BUNDLE" ]; then
  mkdir -p "$TARGET" && tar -xJf "$BUNDLE" -C "$TARGET"
else
mapfile -t FILES < <("$PY" - "$WHEELS" <<'PY'
import importlib.metadata as md
import pathlib
import sys

for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = wheel.name.split("-")[0]
    if name not in ("mujoco", "mujoco_mjx"):
        try:
            md.distribution(name)
            print(f"have {name}", file=sys.stderr)
            continue
        except md.PackageNotFoundError:
            pass
    print(wheel)
PY
)
[ "${#FILES[@]}" -ge 2 ] || { echo "no mujoco wheels in $WHEELS (see the pip download command above)" >&2; exit 1; }
"$PY" -m pip install -q --no-index --no-deps --upgrade --target "$TARGET" "${FILES[@]}"
fi
PYTHONPATH="$TARGET:$PWD" XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -c "
import jax, mujoco
from examples.embodied.sim_mjx import ReacherMjxSim
print('mujoco', mujoco.__version__, 'jax', jax.__version__, 'devices', jax.devices(), 'in', '$TARGET')"

[ "${1:-}" = "--bench" ] || exit 0
PYTHONPATH="$TARGET:$PWD" XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache "$PY" - <<'PY'
import json, os, time

import jax
import torch

from examples.embodied.sim_mjx import ReacherMjxSim

device = "cuda" if jax.default_backend() == "gpu" else "cpu"
results = []
for n in map(int, os.environ.get("BENCH_ENVS", "256 2048 8192 32768").split()):
    t0 = time.perf_counter()
    sim = ReacherMjxSim(num_envs=n, chunk=2, device=device)
    sim.reset(it=0, ep=0)
    action = torch.rand(n, 2, 2) * 2 - 1
    sim.step(action)  # compiles
    compile_s = time.perf_counter() - t0
    sim.pop_metrics()
    t0 = time.perf_counter()
    for _ in range(25):
        sim.step(action)
    seconds = time.perf_counter() - t0
    row = {"device": device, "num_envs": n, "env_steps_per_s": sim.pop_metrics()["env_steps"] / seconds,
           "ms_per_chunk": seconds / 25 * 1e3, "first_call_s": compile_s}
    print(json.dumps(row), flush=True)
    results.append(row)
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "mjx_bench.json"), "w") as f:
        json.dump(results, f, indent=1)
PY
