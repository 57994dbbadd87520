"""Paths under the root (``--root``) and atomic file writes.

Contract section 1: every host path is taken under the root, resolved as a chroot would, so an
absolute symlink such as ``/var/run -> /run`` stays inside the root. Contract section 2: files
are written atomically (temporary name without ``.yaml``/``.json``, fsync, mode, ``os.replace``,
fsync of the directory).

Only the standard library is imported here: the CPU fast path uses this module.
"""

from __future__ import annotations

import errno
import os
import stat

_MAX_LINKS = 40  # the kernel's own limit on symlinks followed in one lookup (MAXSYMLINKS)


class Root:
    """A file-system root, ``/`` on a real VM or a directory in tests and image builds.

    Args:
        path: the root directory (str or path-like); made absolute.
    """

    def __init__(self, path: str | os.PathLike = "/"):
        self.path = os.path.abspath(os.fspath(path))

    @property
    def is_host(self) -> bool:
        """True when the root is the real ``/``."""
        return self.path == "/"

    def __repr__(self) -> str:
        return f"Root({self.path!r})"

    def resolve(self, host_path: str, *, follow_last: bool = True) -> str:
        """Map an absolute host path to a real path under the root, following symlinks chroot-style.

        Args:
            host_path: an absolute path as seen inside the VM, e.g. ``/var/run/cdi/nvidia.yaml``.
            follow_last: follow a symlink in the last component too (False: the link itself).

        Returns:
            A path under ``self.path``. Components that do not exist are appended as they are.
            An absolute link target is taken under the root and ``..`` never climbs above it,
            so the result cannot leave the root.

        Raises:
            OSError: ``ELOOP`` after 40 links, as the kernel does; a path that kept the 41st
                link as a plain component would let the kernel follow it out of the root.
        """
        if self.is_host:
            parts = [p for p in host_path.split("/") if p]
            return "/" + "/".join(parts) if not follow_last else os.path.realpath("/" + "/".join(parts))
        todo = [p for p in host_path.split("/") if p]
        done: list[str] = []
        links = 0
        while todo:
            part = todo.pop(0)
            if part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = os.path.join(self.path, *done, part)
            if (todo or follow_last) and os.path.islink(candidate):
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", host_path)
                target = os.readlink(candidate)
                if target.startswith("/"):
                    done = []
                todo = [p for p in target.split("/") if p] + todo
                continue
            done.append(part)
        return os.path.join(self.path, *done)

    def __truediv__(self, host_path: str) -> str:
        """``root / "/proc/devices"``: shorthand for :meth:`resolve`."""
        return self.resolve(host_path)

    def host_path(self, real_path: str) -> str:
        """The inverse of :meth:`resolve` for a path under the root: ``<root>/dev/x`` -> ``/dev/x``."""
        if self.is_host:
            return real_path
        rel = os.path.relpath(real_path, self.path)
        return "/" if rel == "." else "/" + rel

    def read_text(self, host_path: str, default: str | None = None) -> str | None:
        """Read a text file under the root; ``default`` when it is missing or unreadable."""
        try:
            with open(self.resolve(host_path), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return default

    def exists(self, host_path: str) -> bool:
        """True when the path exists under the root (links followed chroot-style)."""
        try:
            return os.path.exists(self.resolve(host_path))
        except OSError:
            return False


def atomic_write(path: str, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a part.

    Contract section 2. The temporary file lives in the same directory under a name that does
    not end in ``.yaml``/``.json`` (CDI readers scan those), is created with ``O_EXCL`` and
    ``O_NOFOLLOW`` (a planted symlink cannot redirect the write), fsynced, given ``mode``, then
    renamed over ``path`` (which replaces a symlink at ``path`` rather than writing through it),
    and the directory is fsynced.

    Args:
        path: the real target path (already resolved under the root).
        data: text (UTF-8) or bytes.
        mode: the file mode, 0644 by default.

    Raises:
        OSError: the directory is missing or not writable, or the disk is full.
    """
    directory = os.path.dirname(path) or "."
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.unlink(tmp)  # a leftover of a killed earlier run with the same pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not decide the mode
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def ensure_dir(path: str, mode: int = 0o755) -> None:
    """Create ``path`` and its parents (mode 0755, not world-writable) if they are missing.

    Raises:
        OSError: a component exists and is not a directory, or permission is denied.
    """
    os.makedirs(path, mode=mode, exist_ok=True)


def is_char_device(path: str) -> tuple[int, int] | None:
    """``(major, minor)`` when ``path`` is a character device, else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)
