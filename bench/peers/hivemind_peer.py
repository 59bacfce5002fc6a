"""hivemind's initial peer for the peers benchmark: a DHT node on the
unshaped service host, as hivemind's quickstart starts its first peer.
Writes its multiaddr to the file given, then serves until stdin closes
(the harness bounds it with timeout(1)).

    python hivemind_peer.py ADDR MADDR_FILE
"""

import os
import sys

import hivemind


def main() -> int:
    addr, out = sys.argv[1], sys.argv[2]
    dht = hivemind.DHT(host_maddrs=[f"/ip4/{addr}/tcp/0"], start=True)
    maddrs = [str(m) for m in dht.get_visible_maddrs() if f"/ip4/{addr}/" in str(m)]
    with open(out + ".part", "w") as f:
        f.write(maddrs[0])
    os.replace(out + ".part", out)
    sys.stdin.read()
    dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
