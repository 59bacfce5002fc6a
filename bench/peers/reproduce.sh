#!/bin/sh
# Every run of bench/results/peers.json from an empty cache, about 12.5 h on
# 2 cores: the sweeps and every row of the grid, then the rows run again
# (repeat K, rows named ...-rK). Runs are cached ($CO2_CACHE_DIR/peers-runs),
# so it resumes where it stopped. A failed row is a result (the table shows
# it as failed, and each call runs it again): it goes on, and exits 1 at the
# end if any failed. Needs root.
#
#   sudo bench/peers/reproduce.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
status=0
run() { python3 "$here/run.py" "$@" || status=1; }

run
run --repeat 2 --only small-100mbit-tau16-seed1-co2,small-100mbit-tau16-seed1-co2-diloco,small-100mbit-tau16-seed1-co2-a0.5,small-100mbit-tau16-seed1-co2-nocarry,small-100mbit-tau16-seed1-co2-a0.5-carry,small-100mbit-tau16-seed1-torchft-localsgd
run --repeat 3 --only small-100mbit-tau16-seed1-co2,small-100mbit-tau16-seed1-torchft-localsgd,small-1gbit-tau16-seed1-co2,small-1gbit-tau16-seed1-torchft-localsgd,small-100mbit-tau16-seed1-co2-a0.5
run --repeat 4 --only small-100mbit-tau16-seed1-torchft-localsgd,small-100mbit-tau16-seed1-co2,small-1gbit-tau16-seed1-co2,small-1gbit-tau16-seed1-torchft-localsgd,small-1gbit-seed1-ddp
run --repeat 2 --only small-100mbit-tau16-seed2-co2,small-100mbit-tau16-seed2-torchft-localsgd,small-none-seed2-ddp
run --repeat 2 --only small-100mbit-tau64-seed1-co2,small-100mbit-tau64-seed1-co2-int8,small-100mbit-tau64-seed1-torchft-localsgd,small-1gbit-tau64-seed1-co2,small-1gbit-tau64-seed1-co2-int8,small-1gbit-tau64-seed1-torchft-localsgd
run --repeat 3 --only small-100mbit-tau64-seed1-co2,small-100mbit-tau64-seed1-co2-int8,small-100mbit-tau64-seed1-torchft-localsgd,small-1gbit-tau64-seed1-co2,small-1gbit-tau64-seed1-co2-int8,small-1gbit-tau64-seed1-torchft-localsgd
run --repeat 5 --only small-1gbit-tau16-seed1-co2,small-1gbit-tau16-seed1-co2-int8,small-1gbit-tau16-seed1-torchft-localsgd,small-1gbit-tau16-seed1-co2-by1
run --repeat 6 --only small-1gbit-tau16-seed1-co2,small-1gbit-tau16-seed1-co2-int8,small-1gbit-tau16-seed1-torchft-localsgd,small-1gbit-tau16-seed1-co2-by1
run --repeat 2 --only medium-local-seed1,medium-100mbit-tau16-seed1-co2,medium-100mbit-tau16-seed1-co2-int8,medium-100mbit-tau16-seed1-torchft-localsgd,medium-100mbit-tau8-seed1-co2-int8,medium-100mbit-tau8-seed1-torchft-localsgd,medium-1gbit-tau16-seed1-co2,medium-1gbit-tau16-seed1-co2-int8,medium-1gbit-tau16-seed1-torchft-localsgd
run --repeat 3 --only medium-local-seed1,medium-1gbit-tau16-seed1-co2,medium-1gbit-tau16-seed1-co2-int8,medium-1gbit-tau16-seed1-torchft-localsgd
exit $status
