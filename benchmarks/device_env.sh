# The one device-environment helper: every benchmark script that runs on the GPU machine sources it
# (docs/device.md says what a call carries):
#
#   . benchmarks/device_env.sh need   # the Ray bundle must be carried: fail without it
#   . benchmarks/device_env.sh        # use the Ray bundle when it is carried, else only the repository
#   . benchmarks/device_env.sh none   # only the repository (CPU runs, SMOKE=1)
#
# Ray, lark and jsonschema are not on the GPU machine's image: `bash ../shared/tools/ray-bundle.sh` writes
# them here as .raybundle/ray-site.tar.xz (Python 3.12, the machine's), a call carries `.raybundle`, and this
# unpacks it into /tmp/site. Exports PYTHONPATH=[/tmp/site:]$PWD:$PYTHONPATH and PYTHONUNBUFFERED=1; returns
# non-zero (the caller's `|| exit 1`) when the bundle is needed and missing or does not unpack.
rose_device_env() {
  local use=${1:-auto}
  if [ "$use" != none ] && [ -f .raybundle/ray-site.tar.xz ]; then
    local stamp
    stamp=$(stat -c %s-%Y .raybundle/ray-site.tar.xz)  # unpacked once per bundle: sourcing again is free
    if [ "$(cat /tmp/site/.rose-bundle 2>/dev/null)" != "$stamp" ]; then
      mkdir -p /tmp/site && tar -xJf .raybundle/ray-site.tar.xz -C /tmp/site || return 1
      echo "$stamp" > /tmp/site/.rose-bundle
    fi
    export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
  elif [ "$use" = need ]; then
    echo "carry .raybundle (bash ../shared/tools/ray-bundle.sh; docs/device.md)" >&2
    return 1
  else
    export PYTHONPATH=$PWD:${PYTHONPATH:-}
  fi
  export PYTHONUNBUFFERED=1
}
rose_device_env "$@"
