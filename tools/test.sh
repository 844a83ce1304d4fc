#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs the whole check gate.
#   tools/test.sh
# Steps: Python test deps (PyPI), the real test model (tools/fetch-models.sh), cargo fmt --check,
# cargo clippy -D warnings, cargo test (release) over the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
echo "== python test dependencies"
"$PY" -m pip install --quiet --disable-pip-version-check -r tools/requirements-test.txt

echo "== test model"
MEMRA_TEST_MODEL="$(tools/fetch-models.sh)"
export MEMRA_TEST_MODEL

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== cargo test"
cargo test --workspace --release 2>&1 | tee /tmp/memra-test.log | grep -vE '^test .* \.\.\. ok$'
status=${PIPESTATUS[0]}
passed=$(grep -E '^test result:' /tmp/memra-test.log | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/' | awk '{p+=$1; f+=$2} END {print p+0, f+0}')
read -r p f <<<"$passed"
echo "$p passed, $f failed"
exit "$status"
