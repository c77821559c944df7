"""Host-side removal of directory trees that agent code made.

Agent code decides the shape of every tree under a workspace or a slot: thousands of
levels deep, directories without read or search permission, symlinks where
directories were a moment ago. ``shutil.rmtree`` recurses once per level (a
``RecursionError`` past about a thousand) and gives up on a directory it cannot list.
:func:`remove_tree` walks with an explicit stack of directory descriptors, each opened
with ``O_NOFOLLOW`` relative to its parent, so it never follows a link out of the tree,
never recurses, and unlocks directories the agent locked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

TYPE_CHECKING = False  # not typing's: in a sandbox's supervisor, every module stays
if TYPE_CHECKING:  # resident, and pathlib alone is over a megabyte
    from pathlib import Path

__all__ = ["open_dir", "remove_tree", "remove_path"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Open descriptors held at once: one per level of the walk, so a deep tree never runs
# the host out of descriptors (RLIMIT_NOFILE is often 1,024).
_MAX_OPEN = 64


def open_dir(name: str, parent_fd: int) -> int:
    """Open the directory ``name`` under ``parent_fd``, unlocking it first if needed."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        # A non-root host: the agent removed our read or search permission.
        os.chmod(name, 0o700, dir_fd=parent_fd, follow_symlinks=False)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    if os.geteuid() != 0:  # or our write permission: children could not be unlinked
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o700)
    return fd


def _unlink(name: str, parent_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=parent_fd)


def _is_dir(name: str, parent_fd: int) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def remove_tree(parent_fd: int, name: str) -> None:
    """Delete ``name`` (a file, link or whole directory tree) under ``parent_fd``.

    Iterative and bounded in open descriptors whatever the depth: a subtree deeper
    than ``_MAX_OPEN`` levels is renamed up beside ``name`` and removed in turn. Links
    are removed, never followed; entries that vanish meanwhile are fine.

    Raises:
        OSError: an entry could not be removed (a mount point, an immutable file).
    """
    pending = [name]
    while pending:
        current = pending.pop()
        if _is_dir(current, parent_fd):
            _remove_dir(parent_fd, current, pending)
        else:
            _unlink(current, parent_fd)


def _remove_dir(parent_fd: int, name: str, pending: list[str]) -> None:
    """Empty and remove one directory, handing subtrees too deep to ``pending``."""
    try:
        top = open_dir(name, parent_fd)
    except FileNotFoundError:
        return
    stack: list[tuple[int, str]] = [(top, name)]  # (fd, name in the level above)
    try:
        while stack:
            fd = stack[-1][0]
            descend = None
            with os.scandir(fd) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if not is_dir:
                        _unlink(entry.name, fd)
                    elif descend is None:
                        descend = entry.name
            if descend is not None and len(stack) >= _MAX_OPEN:
                moved = f".bat-gym-rm-{os.getpid()}-{len(pending)}-{os.urandom(4).hex()}"
                os.rename(descend, moved, src_dir_fd=fd, dst_dir_fd=parent_fd)
                pending.append(moved)
                continue
            if descend is not None:
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    stack.append((open_dir(descend, fd), descend))
                continue
            fd, own = stack.pop()  # empty now: remove it from the level above
            os.close(fd)
            try:
                os.rmdir(own, dir_fd=stack[-1][0] if stack else parent_fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:  # a writer raced us: go round again
                    raise
                if not stack:
                    pending.append(own)
    finally:
        for fd, _ in stack:
            os.close(fd)


def remove_path(path: str | Path) -> None:
    """Delete ``path`` and everything under it, if it exists (see :func:`remove_tree`)."""
    head, name = os.path.split(os.path.normpath(os.fspath(path)))
    parent = os.open(head or ".", _DIR_FLAGS)
    try:
        remove_tree(parent, name)
    finally:
        os.close(parent)
