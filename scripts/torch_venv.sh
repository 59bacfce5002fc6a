#!/usr/bin/env bash
# The virtual environment with PyPI's torch 2.x that `make test` runs the
# Python suite in a second time (python/tests/run_torch2.sh), and the
# wheelhouse the wheel's container test installs torch from.
#
#   scripts/torch_venv.sh venv        prints the venv's python, making it once
#   scripts/torch_venv.sh wheelhouse  prints the wheelhouse, filling it once
#
# Both live outside the clone, in $CO2_CACHE_DIR (default ~/.cache/co2), so a
# fresh clone reuses them. The torch wheels are downloaded once into the
# wheelhouse and installed from it with --no-index. Where PyPI cannot be
# reached and nothing is cached, it exits 77 (ctest's skip) with the reason.
set -euo pipefail

TORCH_VERSION=2.15.0
# The interpreter of the venv: the one the build's extension is made for.
PYTHON=${CO2_TORCH_VENV_PYTHON:-/usr/bin/python3}
CACHE=${CO2_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/co2}
WHEELHOUSE=$CACHE/wheelhouse-torch-$TORCH_VERSION
pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
VENV=$CACHE/venv-torch-$TORCH_VERSION-py$pyver

what=${1:-}
case "$what" in
  venv|wheelhouse) ;;
  *) echo "usage: $0 venv|wheelhouse" >&2; exit 2 ;;
esac

mkdir -p "$CACHE"
# One maker at a time (ctest runs the suites that need it in parallel).
exec 9>"$CACHE/.torch_venv.lock"
flock -w 1800 9 || { echo "$0: $CACHE/.torch_venv.lock held for 30 min" >&2; exit 1; }

fill_wheelhouse() {
  if [ -f "$WHEELHOUSE/.complete" ]; then
    return
  fi
  local probe
  if ! probe=$("$PYTHON" -c '
import urllib.request, sys
try:
    urllib.request.urlopen("https://pypi.org/simple/torch/", timeout=20).read(1)
except Exception as e:
    print(f"{type(e).__name__}: {e}")
    sys.exit(1)' 2>&1); then
    echo "SKIP: PyPI (https://pypi.org) cannot be reached and $WHEELHOUSE is not filled: $probe" >&2
    exit 77
  fi
  rm -rf "$WHEELHOUSE.partial"
  mkdir -p "$WHEELHOUSE.partial"
  # pip from a venv of its own, kept beside: Debian's interpreter has none.
  local tools="$CACHE/pip-tools-py$pyver"
  [ -x "$tools/bin/pip" ] || "$PYTHON" -m venv "$tools"
  "$tools/bin/pip" download --quiet --no-cache-dir --only-binary=:all: \
    --timeout 60 --retries 3 -d "$WHEELHOUSE.partial" \
    "torch==$TORCH_VERSION" numpy pytest
  touch "$WHEELHOUSE.partial/.complete"
  mv "$WHEELHOUSE.partial" "$WHEELHOUSE"
}

fill_wheelhouse
if [ "$what" = wheelhouse ]; then
  echo "$WHEELHOUSE"
  exit 0
fi

if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --no-index --find-links "$WHEELHOUSE" \
    "torch==$TORCH_VERSION" numpy pytest
  touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
