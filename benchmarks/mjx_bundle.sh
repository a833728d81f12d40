#!/usr/bin/env bash
# Pack MJX (mujoco 3.17 + mujoco-mjx 3.17 + trimesh) for the GPU machine into one small archive,
# .mjxbundle/mjx-site.tar.xz (~7.5 MB instead of the 34 MB of wheels), so that a device call can carry it
# together with the Ray bundle (.raybundle, ~28 MB) under the 64 MiB limit. Run here (any CPU machine,
# repo root); `bash benchmarks/mjx_env.sh` on the GPU machine unpacks it into /tmp/mjxenv.
#
# What is left out (none of it is imported by mujoco or mujoco.mjx; checked by stepping ReacherMjxSim
# with the same files removed from a CPU install): mujoco/experimental (the Studio UI: Dear ImGui,
# ImPlot, 41 MB), mujoco/mjx/test_data (16 MB of test models), integration tests and *_test.py.
# absl-py, etils, fsspec and zipp are not packed: the GPU image has them.
#   bash benchmarks/mjx_bundle.sh            # wheels from .whl/ (the pip download line in mjx_env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
OUTDIR=${OUTDIR:-.mjxbundle}
grep -qx '/.mjxbundle/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || grep -qx '/.mjxbundle/' .gitignore || echo "note: add /.mjxbundle/ to .gitignore or .git/info/exclude"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shopt -s nullglob
wheels=("$WHEELS"/mujoco-3.17.0-*.whl "$WHEELS"/mujoco_mjx-3.17.0-*.whl "$WHEELS"/trimesh-*.whl)
[ "${#wheels[@]}" -eq 3 ] || { echo "need mujoco 3.17.0, mujoco_mjx 3.17.0 and trimesh wheels in $WHEELS" >&2; exit 1; }
# gymnasium's MuJoCo envs (embodied_ppo_gpu's Reacher, stepped by benchmarks/call_overhead.py and the
# NaN replay) import glfw and imageio at module load for their viewer, which no run opens; the GPU image
# has neither, so they travel too when their wheels are in $WHEELS (~0.6 MB; `pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl glfw imageio`).
wheels+=("$WHEELS"/glfw-*.whl "$WHEELS"/imageio-*.whl)
for w in "${wheels[@]}"; do python3 -m zipfile -e "$w" "$work"; done   # a wheel is a zip: unpacked = installed
rm -rf "$work/mujoco/experimental" "$work/mujoco/mjx/test_data" "$work/mujoco/mjx/integration_test"
find "$work" -name '*_test.py' -delete
find "$work" -name '__pycache__' -prune -exec rm -rf {} +
mkdir -p "$OUTDIR"
tar -C "$work" -cJf "$OUTDIR/mjx-site.tar.xz" .
ls -la "$OUTDIR/mjx-site.tar.xz"
