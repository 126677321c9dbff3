"""The shard cache's files: a directory only its owner can write, files made there without
following links, locks, and copies published whole (written as ``.part``, then renamed).

The cache trusts its directory and nothing in it it did not make (see docs/security.md):

- The directory must be owned by the user running the job and writable by no one else
  (as ``ssh`` checks ``~/.ssh`` and pip its cache): otherwise :class:`CacheDirectoryError`.
  One made here is made ``0700``.
- Files are created with ``O_EXCL | O_NOFOLLOW`` and opened with ``O_NOFOLLOW``: a symbolic
  link planted at a name the cache computes is removed, never followed, so no job
  truncates or writes a file somewhere else.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from ..errors import CacheDirectoryError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def make_directory(path: str, create: bool = True) -> None:
    """Makes the cache directory ``path`` (``0700``; its parents as the umask says) unless
    ``create`` is False, and checks that it can be trusted: a directory (or a link to one
    that the user or root made), owned by this user, writable by no one else."""
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except FileExistsError:
            pass  # not a directory: said below
        except OSError as exn:
            raise CacheDirectoryError(path, f"it cannot be made ({type(exn).__name__}: {exn})") from exn
    try:
        link = os.lstat(path)
        info = os.stat(path)
    except FileNotFoundError:
        raise CacheDirectoryError(path, "it does not exist") from None
    except OSError as exn:
        raise CacheDirectoryError(path, f"{type(exn).__name__}: {exn}") from exn
    me = os.geteuid()
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise CacheDirectoryError(path, f"it is a symbolic link made by user {link.st_uid}, not by you ({me})")
    if not stat.S_ISDIR(info.st_mode):
        raise CacheDirectoryError(path, "it is not a directory")
    if info.st_uid != me:
        raise CacheDirectoryError(path, f"it is owned by user {info.st_uid}, not by you ({me}): another user "
                                        "could plant files in it; use a directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheDirectoryError(path, f"it is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'}"
                                        f" (mode {stat.S_IMODE(info.st_mode):o}): another user could plant files "
                                        "in it; chmod go-w it")


def open_existing(path: str, flags: int = os.O_RDONLY) -> int:
    """``os.open`` of a file the cache made, never through a symbolic link: one planted there
    is removed, and the file counts as missing (FileNotFoundError)."""
    try:
        return os.open(path, flags | _NOFOLLOW)
    except OSError as exn:
        if exn.errno != errno.ELOOP:
            raise
    unlink(path)
    raise FileNotFoundError(errno.ENOENT, "a symbolic link stood at the cache's file name; removed", path)


def create_new(path: str) -> int:
    """A new empty file at ``path``, open for reading and writing (``O_EXCL | O_NOFOLLOW``):
    whatever stood there (a crashed download's part, a planted link) is removed first, not
    written through. The caller holds the lock that makes the name its own."""
    for _ in range(3):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        except FileExistsError:
            unlink(path)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)


def publish(part: str, final: str) -> None:
    """Makes a finished ``.part`` the complete file (a rename: readers see all of it or none;
    a link planted at ``final`` is replaced, not followed)."""
    os.rename(part, final)


def unlink(path: str) -> None:
    """Removes ``path`` (a link itself, not what it points to) if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def try_lock(path: str) -> int | None:
    """An exclusive ``flock`` on the file at ``path`` (made if missing), or None where someone holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
        except OSError as exn:
            if exn.errno != errno.ELOOP:
                raise
            unlink(path)  # a planted link: not a lock anyone holds
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder before removed the file: lock the one at the path now


def release_lock(path: str, fd: int) -> None:
    """Removes the lock file (while it is held: no one locks a removed one) and releases it."""
    try:
        unlink(path)
    finally:
        os.close(fd)


def probe_alive(path: str) -> bool:
    """Whether a process holds the lock at ``path`` (a downloader that is alive)."""
    try:
        fd = open_existing(path)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
