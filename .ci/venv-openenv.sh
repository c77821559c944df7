#!/usr/bin/env bash
# The OpenEnv adapter's tests, in a venv of their own: openenv 0.10 brings fastmcp, which
# needs mcp<2, while the dev extra's mcp is 2.x. Installs .[openenv,trl] and pytest from
# the project's own files into .venv-openenv, then runs tests/integrations/test_openenv.py
# (slow tests included: the GRPO step). Fails when a test fails or is skipped.
#   .ci/venv-openenv.sh            install (if needed) and test
#   VENV_OPENENV_FRESH=1 ...       rebuild the venv first
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-openenv
PYTHON=${PYTHON:-python3}
t0=$SECONDS
if [[ ${VENV_OPENENV_FRESH:-} == 1 ]]; then rm -rf "$VENV"; fi
if [[ ! -x $VENV/bin/bat-gym ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    "$VENV/bin/pip" install -q -e '.[openenv,trl]' 'pytest>=8' 'pytest-xdist>=3.5'
    "$VENV/bin/pip" check
fi
echo "venv-openenv: install $((SECONDS - t0)) s"
LOG=$(mktemp)
t1=$SECONDS
rc=0
"$VENV/bin/python" -m pytest -p no:cacheprovider -n 0 -rs -m 'not readme' \
    tests/integrations/test_openenv.py | tee "$LOG" || rc=$?
echo "venv-openenv: tests $((SECONDS - t1)) s"
if ((rc != 0)); then exit "$rc"; fi
if grep -q '^SKIPPED' "$LOG"; then
    echo "venv-openenv: tests were skipped (above): the OpenEnv adapter went untested" >&2
    exit 1
fi
