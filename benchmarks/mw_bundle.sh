#!/usr/bin/env bash
# Pack Meta-World for the GPU machine into one archive, .mwbundle/mw-site.tar.xz (~22 MB instead of the
# 46 MB of wheels and debs), so that ONE device call carries it together with the Ray bundle (.raybundle,
# ~29 MB) under the 64 MiB limit: no separate set-up call, no race against the 30 s the machine stays warm.
# Holds: metaworld 3.1.1, PyOpenGL, imageio, glfw (.whlmw), mujoco 3.3.0 cp312, gymnasium, farama-notifications,
# cloudpickle (.whlcpu) and the EGL/GL loader debs (.gl), as benchmarks/paper_table_gpu.sh's header downloads them.
# On the GPU machine `bash benchmarks/mw_env.sh` unpacks it (/tmp/mwsite and the GL libraries under /).
#
# What is left out: the 26 MB of metaworld/assets that no Meta-World v3 task loads. The kept files are
# benchmarks/metaworld_assets.txt, the union of what all 50 v3 envs open when they are built, found with
#   strace -f -e trace=openat python -c "from metaworld.env_dict import ALL_V3_ENVIRONMENTS as E; [c() for c in E.values()]"
# on a CPU install (mujoco 3.3.0 cp311 + the same metaworld wheel); rendering reads nothing more (MuJoCo
# compiles meshes and textures into the model when the env is built).
#   bash benchmarks/mw_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUTDIR:-.mwbundle}
grep -qx '/.mwbundle/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || grep -qx '/.mwbundle/' .gitignore || echo "note: add /.mwbundle/ to .gitignore or .git/info/exclude"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shopt -s nullglob
wheels=(.whlmw/*.whl .whlcpu/*.whl)
debs=(.gl/*.deb)
[ "${#wheels[@]}" -ge 8 ] && [ "${#debs[@]}" -ge 7 ] || { echo "need the wheels in .whlmw, .whlcpu and the debs in .gl (paper_table_gpu.sh's header)" >&2; exit 1; }
mkdir -p "$work/mwsite" "$work/gl"
for w in "${wheels[@]}"; do python3 -m zipfile -e "$w" "$work/mwsite"; done   # a wheel is a zip: unpacked = installed
for d in "${debs[@]}"; do dpkg -x "$d" "$work/gl"; done
assets="$work/mwsite/metaworld/assets"
[ -d "$assets" ] || { echo "no metaworld/assets in the wheels" >&2; exit 1; }
(cd "$assets" && find . -type f | sed 's#^\./##' | sort) > "$work/all.txt"
sort benchmarks/metaworld_assets.txt | comm -23 "$work/all.txt" - | (cd "$assets" && xargs -r -d '\n' rm -f)
missing=$(sort benchmarks/metaworld_assets.txt | comm -13 "$work/all.txt" -)
[ -z "$missing" ] || { echo "metaworld_assets.txt names files the wheel lacks: $missing" >&2; exit 1; }
find "$work/mwsite" -name '__pycache__' -prune -exec rm -rf {} +
mkdir -p "$OUTDIR"
tar -cJf "$OUTDIR/mw-site.tar.xz" -C "$work" mwsite gl
ls -la "$OUTDIR/mw-site.tar.xz"
