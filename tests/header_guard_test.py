#!/usr/bin/env python3
"""Every header's include guard names its path: a/b/c_d.h -> CO2_A_B_C_D_H_.

Usage: header_guard_test.py SOURCE_DIR

Scans every .h under SOURCE_DIR except build trees (build*/, out/), hidden
directories and generated protobuf headers, and checks the #ifndef, the
#define after it and the comment on the last #endif. Exits 1 listing each
header that does not match, with the guard it should have.
"""

import os
import re
import sys

SKIPPED_DIRS = {"out", "__pycache__", "third_party"}
GENERATED_SUFFIXES = (".pb.h",)


def expected_guard(relative_path: str) -> str:
    return "CO2_" + re.sub(r"[^A-Za-z0-9]", "_", relative_path).upper() + "_"


def headers(source_dir: str):
    for root, dirs, files in os.walk(source_dir):
        dirs[:] = sorted(
            d for d in dirs
            if not d.startswith((".", "build")) and d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(".h") and not name.endswith(GENERATED_SUFFIXES):
                path = os.path.join(root, name)
                yield os.path.relpath(path, source_dir).replace(os.sep, "/")


def problems(source_dir: str, relative_path: str):
    """What is wrong with the guard of one header, as a list of strings."""
    want = expected_guard(relative_path)
    with open(os.path.join(source_dir, relative_path), encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    directives = [line for line in lines if line.startswith("#")]
    found = []
    ifndef = next((l for l in directives if l.startswith("#ifndef")), None)
    if ifndef is None:
        return ["no #ifndef guard"]
    got = ifndef.split()[1] if len(ifndef.split()) > 1 else ""
    if got != want:
        found.append(f"#ifndef {got}")
    after = directives[directives.index(ifndef) + 1:]
    if not after or after[0].split()[:2] != ["#define", want]:
        found.append(f"'{after[0] if after else ''}' after the #ifndef")
    endifs = [l for l in directives if l.startswith("#endif")]
    if not endifs or endifs[-1] != f"#endif  // {want}":
        found.append(f"last '{endifs[-1] if endifs else '#endif'}'")
    return found


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source_dir = sys.argv[1]
    checked = 0
    bad = []
    for relative_path in headers(source_dir):
        checked += 1
        found = problems(source_dir, relative_path)
        if found:
            bad.append(f"{relative_path}: want {expected_guard(relative_path)}"
                       f", found {'; '.join(found)}")
    if checked == 0:
        print(f"no headers found under {source_dir}", file=sys.stderr)
        return 1
    for line in bad:
        print(line)
    print(f"{checked} headers checked, {len(bad)} with a guard that does not "
          "match the path")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
