#!/usr/bin/env bash
# On the GPU machine: unpack .mwbundle/mw-site.tar.xz (benchmarks/mw_bundle.sh) -- Meta-World's packages
# into /tmp/mwsite and the EGL/GL loader libraries under / -- unless /tmp/mwsite is there already.
# Then: export PYTHONPATH=/tmp/mwsite:$PYTHONPATH and __EGL_VENDOR_LIBRARY_FILENAMES (optimize_gpu.sh and
# paper_table_gpu.sh do both).
set -euo pipefail
[ -d /tmp/mwsite/metaworld ] && exit 0
[ -f .mwbundle/mw-site.tar.xz ] || { echo "carry .mwbundle (bash benchmarks/mw_bundle.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
tar -xJf .mwbundle/mw-site.tar.xz -C "$tmp"
rm -rf /tmp/mwsite && mv "$tmp/mwsite" /tmp/mwsite
cp -a "$tmp/gl/." / && ldconfig
rm -rf "$tmp"
echo "Meta-World unpacked into /tmp/mwsite"
