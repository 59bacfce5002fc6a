#!/usr/bin/env bash
# The peers benchmark's own virtual environment: Debian's python3, PyPI's
# torch (from scripts/torch_venv.sh's wheelhouse), the pinned peers from
# PyPI and co2 built from this clone with pip. Prints the venv's python.
#
#   bench/peers/venv.sh            makes it once (co2 reinstalls when the
#                                  clone's HEAD differs from the last build)
#
# It lives outside the clone, in $CO2_CACHE_DIR (default ~/.cache/co2), so a
# fresh clone reuses it. A peer that fails to install is recorded in the
# venv's install.json with pip's error; the harness then runs the rest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# The pins: change here, and the venv's name changes with them.
TORCH=2.15.0
TORCHFT=torchft==0.2.0
HIVEMIND=hivemind==1.1.12
PYTHON=${CO2_PEERS_PYTHON:-/usr/bin/python3}
CACHE=${CO2_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/co2}
pins="torch==$TORCH $TORCHFT $HIVEMIND"
tag=$(echo "$pins" | sha1sum | cut -c1-10)
VENV=$CACHE/venv-peers-$tag
wheelhouse=$("$root/scripts/torch_venv.sh" wheelhouse)

mkdir -p "$CACHE"
exec 9>"$CACHE/.venv-peers.lock"
flock -w 3600 9 || { echo "$0: $CACHE/.venv-peers.lock held for an hour" >&2; exit 1; }

log=$VENV/install.log
if [ ! -f "$VENV/.base-complete" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --no-index --find-links "$wheelhouse" \
    "torch==$TORCH" numpy >"$VENV/install.log" 2>&1
  # A peer's failure is a result, not the end of the setup.
  : >"$VENV/peers.status"
  for pin in $TORCHFT $HIVEMIND; do
    if "$VENV/bin/pip" install --find-links "$wheelhouse" "$pin" "torch==$TORCH" \
        >"$VENV/pip-${pin%%==*}.log" 2>&1; then
      echo "$pin ok" >>"$VENV/peers.status"
    else
      echo "$pin failed" >>"$VENV/peers.status"
    fi
  done
  touch "$VENV/.base-complete"
fi

# co2 from this clone, rebuilt when a commit outside bench/ and docs/
# changed it (or the clone has uncommitted changes there).
head=$(git -C "$root" log -1 --format=%H -- . ':!bench' ':!docs' ':!README.md' 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain -- . ':!bench' ':!docs' ':!README.md' 2>/dev/null)" ]; then
  head="$head-dirty-$(date +%s)"
fi
if [ "$(cat "$VENV/.co2-head" 2>/dev/null)" != "$head" ]; then
  export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
  "$VENV/bin/pip" install --quiet --no-deps --force-reinstall "$root" >>"$log" 2>&1 ||
    { echo "$0: pip install $root failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
  echo "$head" >"$VENV/.co2-head"
fi
echo "$VENV/bin/python"
