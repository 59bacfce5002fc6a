#!/usr/bin/env bash
# ctest python_tests_torch_<version>: the pytest suite again, on PyPI's torch
# 2.x, in the venv scripts/torch_venv.sh makes and caches outside the clone.
# Exits 77 (ctest's skip), saying why, where PyPI cannot be reached and no
# venv is cached; any other failure to make the venv fails the test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=$("$here/../../scripts/torch_venv.sh" venv) || exit $?
exec "$python" -m pytest -q -p no:cacheprovider "$here" "$@"
