"""The ``docker`` backend's base image, built offline.

No image registry is needed: ``debootstrap`` builds a minimal Debian root filesystem
from the Debian mirror apt already uses, ``tar`` packs it, and the engine imports
the tarball as an image. The tarball is cached (``$BAT_GYM_CACHE``, default
``/var/cache/bat_gym``), so a machine that has built it once only imports it again,
in a few seconds, after the engine's images were wiped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.errors import SandboxUnavailable

if TYPE_CHECKING:
    import docker

__all__ = ["DEFAULT_TAG", "SUITE", "PACKAGES", "cache_dir", "debian_mirror", "ensure_image"]

DEFAULT_TAG = "bat-gym/sandbox:bookworm"
SUITE = "bookworm"
PACKAGES: tuple[str, ...] = ("python3", "python3-numpy")
_FALLBACK_MIRROR = "http://deb.debian.org/debian"
_DEBOOTSTRAP_TIMEOUT_S = 1800
# Applied at import: what every container of the image starts with.
_IMAGE_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "WORKDIR /workspace",
    'CMD ["sleep", "infinity"]',
)


def cache_dir() -> Path:
    """Where built root filesystems are kept (``BAT_GYM_CACHE`` overrides).

    Falls back to ``~/.cache/bat_gym`` when ``/var/cache`` is not writable.
    """
    env = os.environ.get("BAT_GYM_CACHE")
    candidates = [Path(env)] if env else [Path("/var/cache/bat_gym"), _user_cache()]
    for path in candidates:
        with contextlib.suppress(OSError):
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
            if os.access(path, os.W_OK):
                return path
    raise SandboxUnavailable(
        "docker", f"no writable cache directory for the base image (tried {candidates})"
    )


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bat_gym"


def debian_mirror() -> str:
    """The Debian mirror apt is configured with for :data:`SUITE`.

    ``BAT_GYM_DEBIAN_MIRROR`` overrides. Reads deb822 ``*.sources`` files and one-line
    ``*.list`` files; falls back to ``deb.debian.org``.
    """
    if env := os.environ.get("BAT_GYM_DEBIAN_MIRROR"):
        return env
    apt = Path("/etc/apt")
    files = [apt / "sources.list"]
    with contextlib.suppress(OSError):
        files += sorted((apt / "sources.list.d").iterdir())
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            found = _mirror_from_deb822(text)
        elif path.suffix == ".list":
            found = _mirror_from_one_line(text)
        else:
            found = None
        if found:
            return found
    return _FALLBACK_MIRROR


def _mirror_from_deb822(text: str) -> str | None:
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if (
            "deb" in fields.get("types", "").split()
            and SUITE in fields.get("suites", "").split()
            and "main" in fields.get("components", "").split()
            and fields.get("enabled", "yes").lower() != "no"
            and fields.get("uris")
        ):
            return fields["uris"].split()[0]
    return None


def _mirror_from_one_line(text: str) -> str | None:
    for line in text.splitlines():
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
        if len(words) >= 4 and words[0] == "deb" and words[2] == SUITE and "main" in words[3:]:
            return words[1]
    return None


def _rootfs_name() -> str:
    # The tarball's name records what is in it, so changing PACKAGES rebuilds.
    key = hashlib.sha256(f"minbase|{SUITE}|{','.join(PACKAGES)}".encode()).hexdigest()[:12]
    return f"rootfs-{SUITE}-{key}.tar"


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    # Several processes (test workers, trainers) may ask for the image at once; one
    # builds, the others wait and then find it.
    fd = os.open(directory / ".build.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _unmount_under(root: Path) -> None:
    # A debootstrap that died half way can leave /proc or /sys mounted in the chroot;
    # removing the tree through such a mount would reach the host's files.
    prefix = str(root.resolve()) + "/"
    with contextlib.suppress(OSError):
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def build_rootfs(dest: Path) -> Path:
    """Build the minimal Debian root filesystem and pack it as the tarball ``dest``.

    Raises:
        SandboxUnavailable: debootstrap or tar is missing, this process is not root,
            or the build failed (the message holds the end of its log).
    """
    for tool, package in (("debootstrap", "debootstrap"), ("tar", "tar")):
        if shutil.which(tool) is None:
            raise SandboxUnavailable(
                "docker",
                f"building the base image needs {tool}: apt-get install {package} "
                "(or pass image= an existing image)",
            )
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "docker",
            "building the base image needs root (debootstrap): run `sudo .ci/docker-setup.sh`"
            " once, or pass image= an existing image",
        )
    work = Path(tempfile.mkdtemp(prefix=".rootfs-", dir=dest.parent))
    rootfs = work / "rootfs"
    try:
        argv = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(rootfs),
            debian_mirror(),
        ]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=_DEBOOTSTRAP_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise SandboxUnavailable(
                "docker", f"debootstrap took longer than {_DEBOOTSTRAP_TIMEOUT_S} s"
            ) from None
        if proc.returncode != 0:
            log = (proc.stdout + proc.stderr).strip()[-2000:]
            raise SandboxUnavailable("docker", f"debootstrap failed ({' '.join(argv)}):\n{log}")
        _trim(rootfs)
        tmp_tar = work / "rootfs.tar"
        proc = subprocess.run(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tmp_tar), "."],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SandboxUnavailable("docker", f"packing the root filesystem failed: {proc.stderr}")
        os.replace(tmp_tar, dest)  # atomically: a half-written tarball never has the name
        return dest
    finally:
        _unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)


def _trim(rootfs: Path) -> None:
    """Drop what a sandbox never uses and add the workspace mount point."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "var/log/*.log"):
        for path in rootfs.glob(pattern):
            if path.is_file() and not path.is_symlink():
                path.unlink()
    # The root filesystem is read-only at run time; the mount points must already exist.
    (rootfs / "workspace").mkdir(mode=0o755, exist_ok=True)


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure_image(tag: str = DEFAULT_TAG, *, client: docker.DockerClient | None = None) -> str:
    """Return ``tag``, building and importing the base image first if the engine lacks it.

    The first build runs ``debootstrap`` (about a minute, needs root and the Debian
    mirror); later builds import the cached tarball.

    Args:
        tag: the image name to give the result.
        client: a Docker SDK client; by default one from the environment.

    Raises:
        SandboxUnavailable: no Docker SDK or engine, or the image cannot be built.
    """
    if client is None:
        from bat_gym.sandbox.docker import connect

        client = connect()
    if _has_image(client, tag):
        return tag
    directory = cache_dir()
    with _build_lock(directory):
        if _has_image(client, tag):  # built by someone else while we waited
            return tag
        tarball = directory / _rootfs_name()
        if not tarball.is_file():
            build_rootfs(tarball)
        _import(client, tarball, tag)
    return tag


def _import(client: docker.DockerClient, tarball: Path, tag: str) -> None:
    from docker.utils import parse_repository_tag

    repository, version = parse_repository_tag(tag)
    try:
        reply: Any = client.api.import_image_from_file(
            str(tarball), repository=repository, tag=version or "latest", changes=_IMAGE_CHANGES
        )
    except Exception as exc:
        raise SandboxUnavailable("docker", f"importing {tarball} as {tag} failed: {exc}") from None
    if not _has_image(client, tag):
        raise SandboxUnavailable(
            "docker", f"importing {tarball} as {tag} left no image: {str(reply)[-500:]}"
        )
