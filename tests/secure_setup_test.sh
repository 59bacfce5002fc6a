#!/usr/bin/env bash
# Runs the secure setup of docs/operations.md ("By hand, secure": the sh block
# after <!-- runbook: secure-setup -->) as it is written, in a fresh
# directory where build/ and scripts/ are this tree's, and checks what it
# printed: the job trained over mTLS with its token, every rank agrees, both
# shards list it as finished through co2-admin (with the admin token), it
# left shard 0's metrics, and the checkpoints hold it and its anchor. Then, in
# the runbook's Prometheus (tests/prometheus_check.py): every target was up
# while the job ran, every dashboard expression returned data, every alert
# rule evaluates, and no series names the job once it finished. The shards
# and Prometheus are stopped at the end, also on failure.
#
# Usage: secure_setup_test.sh BUILD_DIR
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd)
WORK=$(mktemp -d /tmp/co2-secure-setup.XXXXXX)
fail() { echo "FAIL: $*"; exit 1; }
cleanup() {
  pkill -f -- "--checkpoint_dir=ckpt[01] --tls_cert=secrets/shard.crt" 2>/dev/null || true
  pkill -f -- "--config.file=deploy/prometheus/local.yml" 2>/dev/null || true
  [[ ${KEEP:-} ]] || rm -rf "$WORK"
}
trap cleanup EXIT

/usr/bin/python3 - "$SRC/docs/operations.md" >"$WORK/runbook.sh" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.index("<!-- runbook: secure-setup -->")
block = text[text.index("```sh\n", start) + 6:]
print(block[:block.index("```")])
PY
[[ -s $WORK/runbook.sh ]] || fail "no runbook block in docs/operations.md"
ln -s "$SRC/scripts" "$WORK/scripts"
ln -s "$SRC/deploy" "$WORK/deploy"
ln -s "$BUILD" "$WORK/build"
cd "$WORK"
status=0
timeout -s KILL 360 bash -euo pipefail runbook.sh >out 2>&1 || status=$?
cat out
(( status == 0 )) || { KEEP=1; fail "the runbook exited with $status (kept in $WORK)"; }
grep -q "parameters identical on every rank after every boundary: yes" out ||
  fail "co2-train did not report every rank identical"
for port in 50051 50053; do
  grep -Eq "^localhost:$port +example +finished +300/300 +0 " out ||
    fail "co2-admin does not list job example as finished after 300 of 300 rounds on localhost:$port"
done
grep -q '^co2_aggregator_jobs{shard="0"} 0$' out ||
  fail "shard 0 still counts the finished job among its open jobs"
grep -q 'co2_job="example"' out && fail "the finished job is still in shard 0's metrics"
[[ $(grep -c "rounds_closed=300 members=0 state=finished" out) == 2 ]] ||
  fail "the checkpoints do not hold the finished job at round 300"
grep -q "anchor_fnv1a=" out || fail "co2-checkpoint printed no anchor hash"
/usr/bin/python3 "$SRC/tests/prometheus_check.py" --url http://localhost:9090 --src "$SRC" \
  --job example --config deploy/prometheus/local.yml --gone ||
  fail "Prometheus checks failed"
echo PASS
