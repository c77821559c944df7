#!/usr/bin/env bash
# verifiers v1 (bat_gym.integrations.verifiers, the `bat-gym-stages` environment) in a venv
# of its own: verifiers 0.4 cannot share one with openenv 0.10 or the dev extra.
#
# Creates .venv-verifiers from the project's own files (`pip install -e '.[verifiers,test]'`
# on Python 3.11-3.14, which verifiers requires), then runs tests/integrations/test_verifiers.py
# there, the slow end-to-end ones included (vf-eval against bat-gym serve-policy). Fails when a
# test fails, and when any of them skipped: in this venv none may.
#
#   bash .ci/venv-verifiers.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-verifiers}"

# The first interpreter that runs and is 3.11 to 3.14 (a pyenv shim may exist and refuse).
python=""
pyenv_312="$(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.12*/bin/python \
    2>/dev/null | tail -n 1 || true)"
for candidate in python3.12 "$pyenv_312" python3.13 python3.11 python3; do
    if [ -n "$candidate" ] && "$candidate" -c \
        'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    echo "venv-verifiers: verifiers 0.4 needs Python 3.11 to 3.14; none found" >&2
    exit 1
fi

echo "venv-verifiers: $("$python" --version) ($python)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
# pip's output only when it fails (setuptools warns at length on every editable build).
if ! { [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"; } >"$log" 2>&1 \
    || ! "$venv/bin/pip" install -q -e '.[verifiers,test]' >>"$log" 2>&1; then
    cat "$log" >&2
    echo "venv-verifiers: the venv could not be built" >&2
    exit 1
fi
echo "venv-verifiers: installed in $(( $(date +%s) - start )) s"
# -m "": the slow end-to-end tests too (the default run leaves them out). A failure ends
# the script here (pipefail).
"$venv/bin/python" -m pytest tests/integrations/test_verifiers.py -m "" -n 0 -rs \
    -p no:cacheprovider 2>&1 | tee "$log"
if grep -Eq '[0-9]+ skipped' "$log"; then
    echo "venv-verifiers: tests skipped in the verifiers venv, where every one must run" >&2
    exit 1
fi
echo "venv-verifiers: done in $(( $(date +%s) - start )) s"
