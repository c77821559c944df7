#!/usr/bin/env bash
# CI: install Debian's Orthanc DICOM server for the radiology suite's tests. Exit 1 when
# it cannot: .ci/run then lets those tests skip and name the install command (after a
# success, a skip of theirs fails the run).
#
# The package's own service is never started (the suite starts a private server per
# env on a free 127.0.0.1 port), so a policy-rc.d that refuses service starts is put in
# place for the install where none exists, and removed after.
set -uo pipefail

if command -v Orthanc >/dev/null 2>&1; then
    echo "orthanc-setup: $(Orthanc --version 2>/dev/null | head -1) is installed"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "orthanc-setup: no apt-get here; the radiology tests will skip"
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo="sudo -n"
    else
        echo "orthanc-setup: not root and no passwordless sudo; the radiology tests will skip"
        exit 1
    fi
fi
placed=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    placed=1
fi
$sudo apt-get update -q >/dev/null 2>&1 \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends orthanc >/dev/null 2>&1 \
    || echo "orthanc-setup: the install failed; the radiology tests will skip"
if [ -n "$placed" ]; then
    $sudo rm -f /usr/sbin/policy-rc.d
fi
# A service the package started anyway (no policy-rc.d honoured) is stopped: the suite
# needs none, and it would hold port 8042.
$sudo service orthanc stop >/dev/null 2>&1 || true
command -v Orthanc >/dev/null 2>&1 || exit 1
echo "orthanc-setup: $(Orthanc --version | head -1) installed"
