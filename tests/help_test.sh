#!/usr/bin/env bash
# Every binary answers --help on stdout with exit status 0: its usage and its
# own flags with their defaults; co2-checkpoint refuses an unknown option
# and co2-admin an unknown command with exit status 2.
#
# Usage: help_test.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
fail() { echo "FAIL: $*"; exit 1; }

# expect BINARY TEXT...: `BINARY --help` exits 0 and prints every TEXT.
expect() {
  local binary=$1 out status=0
  shift
  out=$("$binary" --help 2>/dev/null) || status=$?
  (( status == 0 )) || fail "$binary --help exited with $status"
  for text in "$@"; do
    grep -qF -- "$text" <<<"$out" || fail "$binary --help does not print '$text':
$out"
  done
}

expect "$BUILD/bin/co2-aggregator" "co2-aggregator --shard_index=i" \
  "--shard_index" "--checkpoint_dir" "default: 9464"
expect "$BUILD/bin/co2-train" "co2-train --task=fashion-mnist" \
  "--tau" "--max_restarts" "--verify_final_anchor" "--metrics_host" \
  'default: "0.0.0.0"'
expect "$BUILD/bin/co2-checkpoint" "usage: co2-checkpoint FILE..." \
  "anchor_fnv1a="
expect "$BUILD/bin/co2-admin" "co2-admin [--aggregators=H:P,...]" \
  "list | delete JOB" "--admin_token_file" 'default: "localhost:50051"'

# docs/co2-train.md's table of co2-train flags gives the binary's defaults.
"$BUILD/bin/co2-train" --help | /usr/bin/python3 -c '
import re, sys
usage, help_text = sys.argv[1], sys.stdin.read()
binary = {m.group(1): m.group(2).strip().strip("\"") for m in re.finditer(
    r"--(\w+) (?:\((?:[^()]|\([^()]*\))*\))?;\s*default: (.*?);\n", help_text, re.S)}
def value(text):
    # Numbers as numbers, durations (30s, 1m, 1h30m) in seconds.
    try:
        return float(text)
    except ValueError:
        pass
    parts = re.fullmatch(r"((?:\d+(?:\.\d+)?(?:h|m|s|ms))+)", text)
    if parts:
        unit = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
        return sum(float(n) * unit[u] for n, u in
                   re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text))
    return text
said = 0
for row in open(usage):
    m = re.match(r"\| `--(\w+)` \| ([^|]+) \|", row)
    if not m or m.group(1) not in binary:
        continue
    doc = m.group(2).strip().strip("`")
    if doc in ("unique per run", "fresh in /tmp"):
        continue
    doc = "" if doc == "empty" else doc
    have = binary[m.group(1)]
    same = value(doc) == value(have)
    if not same:
        sys.exit(f"docs/co2-train.md: --{m.group(1)} defaults to {doc!r}, the binary to {have!r}")
    said += 1
if said < 40:
    sys.exit(f"only {said} flags of docs/co2-train.md were compared; the table or --help changed shape")
' "$(dirname "$0")/../docs/co2-train.md" || fail "docs/co2-train.md disagrees with co2-train --help"

status=0
"$BUILD/bin/co2-checkpoint" --bogus >/dev/null 2>&1 || status=$?
(( status == 2 )) || fail "co2-checkpoint --bogus exited with $status, not 2"
status=0
"$BUILD/bin/co2-admin" frobnicate >/dev/null 2>&1 || status=$?
(( status == 2 )) || fail "co2-admin frobnicate exited with $status, not 2"
echo PASS
