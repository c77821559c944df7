#!/usr/bin/env bash
# verl (bat_gym.integrations.verl) in a venv of its own: verl 0.9 pins its own stack
# (ray, hydra, omegaconf, a newer transformers) that the dev venv does not share.
#
# Creates .venv-verl from the project's own files (`pip install -e '.[verl,train,test]'`,
# CPU torch through the train extra's cap), then runs the verl tests there: the adapter on
# verl's real AgentLoopBase, and verl's own AgentLoopWorker playing bank states through
# BatAgentLoop. Fails when a test fails, and when any of them skipped: here none may.
#
#   bash .ci/venv-verl.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-verl}"
python="${VERL_PYTHON:-python3}"

echo "venv-verl: $("$python" --version) ($python)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
# pip's output only when it fails (setuptools warns at length on every editable build).
if ! { [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"; } >"$log" 2>&1 \
    || ! "$venv/bin/pip" install -q -e '.[verl,train,test]' >>"$log" 2>&1; then
    cat "$log" >&2
    echo "venv-verl: the venv could not be built" >&2
    exit 1
fi
echo "venv-verl: installed in $(( $(date +%s) - start )) s"
"$venv/bin/python" -m pytest tests/integrations/test_verl.py tests/integrations/test_verl_worker.py \
    -n 0 -rs -p no:cacheprovider 2>&1 | tee "$log"
if grep -Eq '[0-9]+ skipped' "$log"; then
    echo "venv-verl: tests skipped in the verl venv, where every one must run" >&2
    exit 1
fi
