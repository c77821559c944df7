"""A private Orthanc DICOM server per env: started on 127.0.0.1, stopped with the env.

:class:`OrthancServer` runs Debian's ``Orthanc`` binary with a configuration of its
own: the REST API on a free port of 127.0.0.1 only, no DICOM network listener, no
plugins, no authentication (nothing but this host can reach it), and storage and index
in a private temporary directory removed on :meth:`OrthancServer.stop`. Two envs never
share a server, so each has its own study space.

:class:`OrthancClient` is the small REST client the tools and the service use
(``urllib``, JSON in and out, every request under a timeout).

A missing binary is :class:`OrthancMissing`, whose message is the install command.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bat_gym.core.errors import BatGymError

__all__ = [
    "INSTALL",
    "OrthancClient",
    "OrthancError",
    "OrthancMissing",
    "OrthancServer",
    "find_orthanc",
]

INSTALL = "apt-get update && apt-get install -y orthanc"
"""How to get the server (Debian and Ubuntu's ``orthanc`` package)."""

_BINARY = "Orthanc"
_START_TIMEOUT_S = 30.0


class OrthancMissing(BatGymError):
    """The Orthanc binary is not on PATH."""

    def __init__(self, binary: str = _BINARY) -> None:
        super().__init__(
            f"the radiology suite needs the Orthanc DICOM server, and {binary!r} is not on "
            f"PATH; install it with: {INSTALL}"
        )


class OrthancError(BatGymError):
    """The server did not start, or answered a request with an error.

    Attributes:
        status: the HTTP status of an error answer, or None.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def find_orthanc() -> str:
    """The path of the Orthanc binary.

    Raises:
        OrthancMissing: it is not installed.
    """
    path = shutil.which(_BINARY) or shutil.which(_BINARY.lower())
    if path is None:
        raise OrthancMissing()
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OrthancClient:
    """JSON over Orthanc's REST API at ``base`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, base: str, timeout_s: float = 30.0) -> None:
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | list[Any] | None = None,
        *,
        timeout_s: float | None = None,
        raw: bool = False,
    ) -> Any:
        """Send one request; return the decoded JSON (or the bytes, with ``raw``).

        Raises:
            OrthancError: the server answered with an HTTP error or could not be reached.
        """
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if isinstance(body, bytes):
            req.add_header("Content-Type", "application/dicom")
        elif body is not None:
            req.add_header("Content-Type", "application/json")
        # The proxy variables of the host must not route a loopback request elsewhere.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=timeout_s or self.timeout_s) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            raise OrthancError(f"{method} {path}: HTTP {exc.code} {exc.reason}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise OrthancError(f"{method} {path}: the server did not answer ({exc})") from None
        if raw:
            return payload
        return json.loads(payload) if payload.strip() else None

    def get(self, path: str, **kwargs: Any) -> Any:
        """``GET path``."""
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        """``POST path``."""
        return self.request("POST", path, body, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        """``DELETE path``."""
        return self.request("DELETE", path, **kwargs)

    def upload(self, dicom: bytes) -> str:
        """Store one DICOM file; return its Orthanc instance id."""
        return str(self.post("/instances", dicom)["ID"])


class OrthancServer:
    """One Orthanc process on 127.0.0.1 with a private storage directory.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        binary: the Orthanc executable (default: found on PATH).
        workdir: where storage, index and log go (default: a new temporary directory,
            removed on stop).
    """

    def __init__(self, binary: str | None = None, workdir: str | Path | None = None) -> None:
        self.binary = binary or find_orthanc()
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.client: OrthancClient | None = None

    @property
    def url(self) -> str:
        """The REST API's base URL."""
        if self.port is None:
            raise OrthancError("the server is not started; call start()")
        return f"http://127.0.0.1:{self.port}"

    def _config(self, root: Path, port: int) -> dict[str, Any]:
        return {
            "Name": "bat_gym",
            "StorageDirectory": str(root / "storage"),
            "IndexDirectory": str(root / "index"),
            "HttpPort": port,
            # Loopback only: Orthanc refuses every other client with this off.
            "RemoteAccessAllowed": False,
            "AuthenticationEnabled": False,
            "DicomServerEnabled": False,
            "Plugins": [],
            "StorageCompression": False,
            # Stored files come back byte for byte: snapshots depend on it.
            "OverwriteInstances": True,
            "SaveJobs": False,
            "HttpThreadsCount": 4,
            "ConcurrentJobs": 1,
            "StableAge": 1,
        }

    def start(self) -> OrthancServer:
        """Start the server and wait until its API answers.

        Raises:
            OrthancError: it exited or did not answer within 30 s (the message holds
                the tail of its log).
        """
        if self._proc is not None:
            return self
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="bat-gym-orthanc-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            port = _free_port()
            config = self.workdir / "orthanc.json"
            config.write_text(json.dumps(self._config(self.workdir, port), indent=2))
            log = open(self.workdir / "orthanc.log", "wb")  # noqa: SIM115 - the child holds it
            self._proc = subprocess.Popen(
                [self.binary, str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
            )
            log.close()
            self.port = port
            self.client = OrthancClient(self.url, timeout_s=10.0)
            if self._wait_ready():
                return self
            self._kill()
        tail = (self.workdir / "orthanc.log").read_text(errors="replace")[-1500:]
        self.stop()
        raise OrthancError(f"Orthanc did not start (3 tries); its log ends:\n{tail}")

    def _wait_ready(self) -> bool:
        assert self._proc is not None and self.client is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                self.client.get("/system", timeout_s=2.0)
                return True
            except OrthancError:
                time.sleep(0.05)
        return False

    def _kill(self, graceful: bool = True) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None and not graceful:
            # Its directory is deleted next: nothing on disk needs a clean shutdown,
            # which takes Orthanc seconds.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        elif proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server and remove its private directory (when it made one)."""
        self._kill(graceful=not self._own_dir)
        self.port = None
        self.client = None
        if self._own_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> OrthancServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # a server must not outlive a forgotten env
        with contextlib.suppress(Exception):
            self._kill()
