#!/usr/bin/env bash
# Make a Docker engine and the bat-gym sandbox base image available on a CI machine.
#
# Usage: .ci/docker-setup.sh [PYTHON]    (run as root on Debian 12; PYTHON defaults
#                                          to python3 and must be able to import bat_gym)
#
# Idempotent: each step is skipped when its result is already there. When Docker cannot
# be set up it says why and exits 1; .ci/run then lets the tests marked `docker` skip
# with a reason of their own (after a success, a skip of theirs fails the run).
set -u

PYTHON="${1:-python3}"
DOCKERD_LOG=/tmp/dockerd.log
WAIT_S=60

say() { echo "docker-setup: $*" >&2; }
give_up() {
    say "$*"
    say "Docker is not set up; tests marked 'docker' will be skipped."
    exit 1
}

engine_answers() { docker info >/dev/null 2>&1; }
wait_for_engine() {
    for ((i = 0; i < WAIT_S * 5; i++)); do
        engine_answers && return 0
        sleep 0.2
    done
    return 1
}

# 1. Packages. The docker CLI alone is not enough: a machine may ship it without an
#    engine, so look for dockerd itself.
missing=()
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    missing+=(docker.io)
fi
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ((${#missing[@]})); then
    [[ $(id -u) -eq 0 ]] || give_up "need root to install ${missing[*]} (apt-get install ${missing[*]})"
    command -v apt-get >/dev/null 2>&1 || give_up "no apt-get here to install ${missing[*]}"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || give_up "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || give_up "apt-get install ${missing[*]} failed"
fi

# 2. The engine. Installing docker.io may already have started one through systemd;
#    otherwise start dockerd by hand. --bridge=none and no iptables: sandboxes run
#    with no network at all, and the host's networking must stay as it is.
if ! engine_answers && command -v pidof >/dev/null 2>&1 && pidof dockerd >/dev/null; then
    # One is starting (systemd, an earlier run) or stopping: a second would clash
    # with it over /var/run/docker.pid.
    say "a dockerd runs but does not answer yet; waiting up to ${WAIT_S} s"
    for ((i = 0; i < WAIT_S * 5; i++)); do
        engine_answers || ! pidof dockerd >/dev/null && break
        sleep 0.2
    done
    engine_answers || ! pidof dockerd >/dev/null \
        || give_up "the running dockerd did not answer within ${WAIT_S} s"
fi
if ! engine_answers; then
    command -v dockerd >/dev/null 2>&1 || give_up "dockerd is not installed"
    say "starting dockerd (log: $DOCKERD_LOG)"
    # setsid + nohup: the engine must outlive this script and the CI step's shell.
    setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false \
        >"$DOCKERD_LOG" 2>&1 </dev/null &
    wait_for_engine || {
        tail -n 20 "$DOCKERD_LOG" >&2 2>/dev/null
        give_up "dockerd did not answer within ${WAIT_S} s"
    }
fi
say "engine answers: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"

# 3. The sandbox image: built offline with debootstrap, cached, imported once. It has
#    what every installed benchmark's sandbox_requirements() asks for (MedBench-Lite's
#    nibabel, pydicom and Pillow included), so each benchmark's envs, and the tests,
#    find an image that covers them instead of building one of their own.
"$PYTHON" -c "
from bat_gym.core.sandbox.docker_image import ensure_image
from bat_gym.catalog import installed_requirements
req = installed_requirements()
print('sandbox image for modules', ', '.join(req.modules) or '-', '...', flush=True)
print(ensure_image(req))
" || give_up "building the sandbox image failed"
say "ready"
exit 0
