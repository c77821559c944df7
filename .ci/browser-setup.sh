#!/usr/bin/env bash
# The viewer's browser tests drive Debian's Chromium headless through its driver; this
# installs both where apt can. Exit 1 when it cannot: .ci/run then lets the tests skip and
# say why (after a success, a skip of theirs fails the run).
set -uo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "browser-setup: no apt-get here; the browser tests will skip" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null && \
    $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null \
    || { echo "browser-setup: installing chromium failed; the browser tests will skip" >&2; exit 1; }
