"""The Docker engine: the SDK, imported on demand, and a client that answers.

Both the docker sandbox and the image builder talk to the engine through this module,
so neither imports the other for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bat_gym.core.errors import SandboxUnavailable

if TYPE_CHECKING:
    import docker

__all__ = ["connect", "load_sdk"]

_START_HINT = (
    "start one with `sudo .ci/docker-setup.sh` (installs docker.io and runs "
    "`dockerd --bridge=none --iptables=false --ip6tables=false`), or "
    "`sudo systemctl start docker`; set DOCKER_HOST if it listens elsewhere"
)


def load_sdk() -> Any:
    """The docker SDK module, or SandboxUnavailable naming the extra that installs it."""
    try:
        import docker
    except ImportError:
        raise SandboxUnavailable(
            "docker", "the docker Python SDK is not installed: pip install 'bat-gym[docker]'"
        ) from None
    return docker


def connect(timeout_s: float = 60.0) -> docker.DockerClient:
    """Return a Docker SDK client for the engine the environment names.

    Raises:
        SandboxUnavailable: the SDK is missing or no engine answers; the message says
            how to start one.
    """
    sdk = load_sdk()
    try:
        client = sdk.from_env(timeout=int(timeout_s))
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "not there"
        raise SandboxUnavailable(
            "docker", f"no Docker engine answers ({exc}); {_START_HINT}"
        ) from None
    return client
