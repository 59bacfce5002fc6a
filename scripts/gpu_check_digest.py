"""Prints one digest of the sources that build-gpu-check is built from, so
that scripts/gpu_check.sh can tell a prepared folder made from another tree
(it may run where git is not). Run from anywhere: python3 gpu_check_digest.py"""

import hashlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = ["proto", "common", "server", "client", "apps/co2-aggregator", "python/co2",
        "python/src", "cmake"]
FILES = ["CMakeLists.txt", "python/CMakeLists.txt", "tests/nccl_group_test.cc"]
SUFFIXES = (".cc", ".h", ".py", ".proto", ".txt", ".cmake", ".in")


def main() -> int:
    paths = list(FILES)
    for d in DIRS:
        for dirpath, dirnames, names in os.walk(os.path.join(ROOT, d)):
            dirnames[:] = sorted(n for n in dirnames if n != "__pycache__")
            paths += [os.path.relpath(os.path.join(dirpath, n), ROOT)
                      for n in names if n.endswith(SUFFIXES)]
    h = hashlib.sha256()
    for rel in sorted(set(paths)):
        full = os.path.join(ROOT, rel)
        if os.path.isfile(full):
            h.update(rel.encode() + b"\0")
            with open(full, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    print(h.hexdigest()[:20])
    return 0


if __name__ == "__main__":
    sys.exit(main())
