"""The ``docker`` backend's images, built offline.

No image registry is needed: ``debootstrap`` builds a minimal Debian root filesystem
from the Debian mirror apt already uses, ``tar`` packs it, and the engine imports
the tarball as an image. The tarball is cached (``$BAT_GYM_CACHE``, default
``/var/cache/bat_gym``), so a machine that has built it once only imports it again,
in a few seconds, after the engine's images were wiped.

What goes in is :data:`PACKAGES` (python3 and numpy, always) plus what the sandbox's
:class:`~bat_gym.core.sandbox.requirements.SandboxRequirements` ask for: Debian packages
(``debootstrap --include``) and pure-Python distributions copied from this
interpreter. The image's tag and the tarball's name hold a short hash of that set
(``bat-gym/sandbox:bookworm-<hash>``), so images of different sets coexist, and an
image that already has everything asked for (e.g. the union CI builds) is reused.
Each built image is checked to import every module asked for before it is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from bat_gym.core.errors import SandboxUnavailable
from bat_gym.core.sandbox.engine import connect
from bat_gym.core.sandbox.requirements import SandboxRequirements

if TYPE_CHECKING:
    import docker

__all__ = [
    "DEFAULT_TAG",
    "REPOSITORY",
    "SUITE",
    "PACKAGES",
    "ImageContents",
    "build_rootfs",
    "cache_dir",
    "debian_mirror",
    "ensure_image",
    "import_check",
    "image_contents",
]

SUITE = "bookworm"
REPOSITORY = "bat-gym/sandbox"
PACKAGES: tuple[str, ...] = ("python3", "python-is-python3", "python3-numpy")
"""Debian packages every image has, whatever is asked for.

``python-is-python3`` gives the image a ``python`` command, as the local sandbox has:
agent code and the suites' scripts run ``python pipeline/infer.py``.
"""
# Image labels: what an image holds, so that one with everything asked for is reused.
_LABEL = "bat-gym.sandbox"
_LABEL_DEBIAN = "bat-gym.sandbox.debian"
_LABEL_HOST = "bat-gym.sandbox.from-host"
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


class ImageContents(NamedTuple):
    """What one image holds: Debian packages, and distributions copied from this host.

    Attributes:
        debian: Debian package names, sorted, :data:`PACKAGES` included.
        from_host: ``name==version`` of each pure-Python distribution copied from this
            interpreter, sorted.
        modules: the modules a build checks the image imports (not part of its key:
            what imports follows from the packages).
    """

    debian: tuple[str, ...]
    from_host: tuple[str, ...]
    modules: tuple[str, ...]

    @property
    def key(self) -> str:
        """A short hash of the packages; the default set keeps the key it always had."""
        raw = f"minbase|{SUITE}|{','.join(self.debian)}"
        if self.from_host:
            raw += f"|host|{','.join(self.from_host)}"
        return hashlib.sha256(raw.encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        """The image's name: ``bat-gym/sandbox:bookworm-<key>``."""
        return f"{REPOSITORY}:{SUITE}-{self.key}"

    @property
    def rootfs_name(self) -> str:
        """The cached tarball's name; it records what is in it, so another set rebuilds."""
        return f"rootfs-{SUITE}-{self.key}.tar"

    def covered_by(self, labels: dict[str, str]) -> bool:
        """Whether an image with these labels has every package this set asks for."""
        if labels.get(_LABEL) != SUITE:
            return False
        have = set(_split(labels.get(_LABEL_DEBIAN, "")))
        host = set(_split(labels.get(_LABEL_HOST, "")))
        return set(self.debian) <= have and set(self.from_host) <= host

    def labels(self) -> dict[str, str]:
        """The labels an image of this set is imported with."""
        return {
            _LABEL: SUITE,
            _LABEL_DEBIAN: ",".join(self.debian),
            _LABEL_HOST: ",".join(self.from_host),
        }


def _split(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


def image_contents(requirements: SandboxRequirements | None = None) -> ImageContents:
    """What the image for ``requirements`` holds: :data:`PACKAGES` and what they ask for.

    Raises:
        SandboxUnavailable: a distribution to copy from this interpreter is not installed.
    """
    req = requirements or SandboxRequirements()
    host = []
    for name in req.from_host:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise SandboxUnavailable(
                "docker",
                f"the image takes {name} from this interpreter ({sys.executable}), which "
                f"lacks it: {sys.executable} -m pip install {name}",
            ) from None
        host.append(f"{name}=={version}")
    return ImageContents(
        debian=tuple(sorted({*PACKAGES, *req.debian})),
        from_host=tuple(sorted(host)),
        modules=req.modules,
    )


DEFAULT_TAG = image_contents().tag
"""The tag of the image of :data:`PACKAGES` alone."""


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


def build_rootfs(dest: Path, contents: ImageContents | None = None) -> Path:
    """Build the minimal Debian root filesystem and pack it as the tarball ``dest``.

    Args:
        dest: the tarball to write (atomically).
        contents: what goes in; default :data:`PACKAGES` alone. Its ``from_host``
            distributions are copied from this interpreter and byte-compiled by the
            image's python, and every one of its ``modules`` must then import there.

    Raises:
        SandboxUnavailable: debootstrap or tar is missing, this process is not root,
            the build failed (the message holds the end of its log), or the result
            cannot import a module asked for.
    """
    contents = contents or image_contents()
    for tool, package in (("debootstrap", "debootstrap"), ("tar", "tar"), ("chroot", "coreutils")):
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
            f"--include={','.join(contents.debian)}",
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
        _add_host_distributions(rootfs, contents.from_host)
        _check_imports(rootfs, contents)
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


def _in_rootfs(
    rootfs: Path, argv: list[str], timeout_s: float = 600
) -> subprocess.CompletedProcess:
    """Run ``argv`` chrooted in ``rootfs``, with a clean environment."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
    return subprocess.run(
        [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )


def _image_site_packages(rootfs: Path) -> Path:
    """``/usr/local/lib/python3.X/dist-packages`` of the image's python, on the host."""
    versions = [
        p.name
        for p in (rootfs / "usr/lib").glob("python3.*")
        if re.fullmatch(r"python3\.\d+", p.name)
    ]
    if len(versions) != 1:
        raise SandboxUnavailable("docker", f"cannot tell the image's python version ({versions})")
    return rootfs / "usr/local/lib" / versions[0] / "dist-packages"


def _add_host_distributions(rootfs: Path, pinned: tuple[str, ...]) -> None:
    """Copy each ``name==version`` distribution's files from this interpreter into the image.

    Only pure-Python distributions travel: a compiled extension is built for this
    host's interpreter, not the image's.
    """
    if not pinned:
        return
    site = _image_site_packages(rootfs)
    for spec in pinned:
        name, _, version = spec.partition("==")
        dist = importlib.metadata.distribution(name)
        if dist.version != version:  # upgraded since the set was computed
            raise SandboxUnavailable(
                "docker", f"{name} changed from {version} to {dist.version} during the build"
            )
        root = Path(str(dist.locate_file(""))).resolve()
        if not dist.files:
            raise SandboxUnavailable(
                "docker", f"{name} {version} lists no files (no RECORD); reinstall it with pip"
            )
        for file in dist.files:
            src = Path(str(dist.locate_file(file))).resolve()
            try:
                rel = src.relative_to(root)
            except ValueError:  # console scripts in bin/, outside site-packages
                continue
            if "__pycache__" in rel.parts or not src.is_file():
                continue
            if rel.suffix in (".so", ".pyd") or ".so." in rel.name:
                raise SandboxUnavailable(
                    "docker",
                    f"{name} is not pure Python ({rel}); provide it through a Debian package "
                    "(SandboxRequirements.debian) instead of from_host",
                )
            target = site / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            target.chmod(0o644)
    # The root filesystem is read-only at run time: compile now, with the image's python.
    inside = "/" + str(site.relative_to(rootfs))
    proc = _in_rootfs(rootfs, ["python3", "-m", "compileall", "-q", "-j", "0", inside])
    if proc.returncode != 0:
        raise SandboxUnavailable(
            "docker",
            f"byte-compiling {', '.join(pinned)} in the image failed:\n"
            + (proc.stdout + proc.stderr).strip()[-2000:],
        )


# Run with the image's python, never imported here.
_IMPORT_CHECK = Path(__file__).with_name("_import_check.py")


def import_check(modules: tuple[str, ...] | list[str]) -> str:
    """Python that imports each of ``modules``, prints those that fail, exits 1 if any did."""
    source = _IMPORT_CHECK.read_text(encoding="utf-8")
    return f"{source}\nraise SystemExit(main({list(modules)!r}))\n"


class _CannotImport(SandboxUnavailable):
    """The image built, but lacks a module asked for: the requirements are at fault."""


def _check_imports(rootfs: Path, contents: ImageContents) -> None:
    """Refuse a root filesystem in which a module asked for does not import."""
    if not contents.modules:
        return
    proc = _in_rootfs(rootfs, ["python3", "-c", import_check(contents.modules)])
    if proc.returncode != 0:
        raise _CannotImport(
            "docker",
            f"an image of Debian packages {', '.join(contents.debian)}"
            + (f" and {', '.join(contents.from_host)} from this host" if contents.from_host else "")
            + f" cannot import:\n{(proc.stdout + proc.stderr).strip()[-2000:]}\nadd what "
            "provides them to the benchmark's sandbox_requirements() (debian=, or from_host= "
            "for a pure-Python distribution Debian lacks or ships too old)",
        )


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


def _covering_image(client: docker.DockerClient, contents: ImageContents) -> str | None:
    """The tag of an image that has every package of ``contents``, or None.

    Its own image first, else the smallest other one that covers it (CI builds one
    image of every installed benchmark's needs).
    """
    if _has_image(client, contents.tag):
        return contents.tag
    found = []
    try:
        images = client.images.list(filters={"label": _LABEL})
    except Exception:  # noqa: BLE001 - an engine that cannot list simply has none to reuse
        return None
    for image in images:
        labels = image.labels or {}
        tags = [t for t in image.tags if t.startswith(f"{REPOSITORY}:")]
        if tags and contents.covered_by(labels):
            size = len(_split(labels.get(_LABEL_DEBIAN, ""))) + len(
                _split(labels.get(_LABEL_HOST, ""))
            )
            found.append((size, sorted(tags)[0]))
    return min(found)[1] if found else None


def ensure_image(
    requirements: SandboxRequirements | None = None,
    *,
    tag: str | None = None,
    client: docker.DockerClient | None = None,
) -> str:
    """Return the tag of an image that provides ``requirements``, building it if needed.

    An image the engine has whose packages include everything asked for is reused (the
    image of this exact set first, else the smallest such image). Otherwise the image
    of :data:`PACKAGES` plus what is asked for is built and imported: the first build
    runs ``debootstrap`` (a minute or more, needs root and the Debian mirror) and is
    checked to import every module asked for; later builds import the cached tarball.

    Args:
        requirements: what the sandbox needs; default: :data:`PACKAGES` alone.
        tag: a name of your choosing for the image (it is then neither looked up by
            its contents nor reused from another set); default
            ``bat-gym/sandbox:bookworm-<hash of the set>``.
        client: a Docker SDK client; by default one from the environment.

    Raises:
        SandboxUnavailable: no Docker SDK or engine, or no image has the packages and
            none can be built; the message names the modules and the fix.
    """
    if client is None:
        client = connect()
    contents = image_contents(requirements)

    def existing() -> str | None:
        if tag is not None:
            return tag if _has_image(client, tag) else None
        return _covering_image(client, contents)

    if (found := existing()) is not None:
        return found
    directory = cache_dir()
    with _build_lock(directory):
        if (found := existing()) is not None:  # built by someone else while we waited
            return found
        tarball = directory / contents.rootfs_name
        try:
            if not tarball.is_file():
                build_rootfs(tarball, contents)
        except _CannotImport:
            raise
        except SandboxUnavailable as exc:
            raise SandboxUnavailable("docker", _build_hint(contents, exc.reason)) from None
        _import(client, tarball, tag or contents.tag, contents)
    return tag or contents.tag


def _build_hint(contents: ImageContents, reason: str) -> str:
    extra = sorted(set(contents.debian) - set(PACKAGES)) + list(contents.from_host)
    if not extra:
        return reason
    mods = f" (modules {', '.join(contents.modules)})" if contents.modules else ""
    return (
        f"no image here has what the sandbox needs{mods}: {', '.join(extra)}; building it "
        f"failed: {reason}\nFix: build it once as root, e.g. `sudo .ci/docker-setup.sh` "
        "(the image of every installed benchmark), or pass image= one that has them"
    )


def _import(client: docker.DockerClient, tarball: Path, tag: str, contents: ImageContents) -> None:
    from docker.utils import parse_repository_tag

    repository, version = parse_repository_tag(tag)
    changes = [*_IMAGE_CHANGES, *(f"LABEL {k}={v}" for k, v in contents.labels().items() if v)]
    try:
        reply: Any = client.api.import_image_from_file(
            str(tarball), repository=repository, tag=version or "latest", changes=changes
        )
    except Exception as exc:
        raise SandboxUnavailable("docker", f"importing {tarball} as {tag} failed: {exc}") from None
    if not _has_image(client, tag):
        raise SandboxUnavailable(
            "docker", f"importing {tarball} as {tag} left no image: {str(reply)[-500:]}"
        )
