#!/usr/bin/env bash
# The Python SDK's tests: builds the `starbridge` binary, makes a virtual environment under
# target/, installs the SDK (as `pip install ./sdks/python` would) and its pinned test tools from
# PyPI, type-checks the package and its tests (mypy --strict), then runs pytest against a real
# server and real worker processes. Extra arguments go to pytest (`-k kill`, `-x`, ...).
# PYTHON names the interpreter (default python3; the SDK needs 3.10 or newer).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

python=${PYTHON:-python3}
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --locked --quiet -p starbridge

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv="$target/python-sdk-venv-$version"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r sdks/python/requirements-test.txt ./sdks/python

echo "== mypy --strict (sdks/python)"
(cd sdks/python && "$venv/bin/mypy" --cache-dir "$target/python-sdk-mypy-cache")

echo "== pytest (sdks/python/tests)"
STARBRIDGE_BIN="$target/debug/starbridge" "$venv/bin/python" -m pytest -p no:cacheprovider sdks/python/tests "$@"
