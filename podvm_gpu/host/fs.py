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
# Files the agent reads and does not own (/proc, /sys, the image's configuration) are small;
# a bigger one is not what its name says.
READ_LIMIT = 4 << 20
TMP_SUFFIX = ".tmp"  # atomic_write's temporary names: ".<name>.<pid>.tmp", never *.yaml/*.json


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

    def resolve(self, host_path: str, *, follow_last: bool = True,
                links: list[str] | None = None) -> str:
        """Map an absolute host path to a real path under the root, following symlinks chroot-style.

        Args:
            host_path: an absolute path as seen inside the VM, e.g. ``/var/run/cdi/nvidia.yaml``.
            follow_last: follow a symlink in the last component too (False: the link itself).
            links: when given, every link followed is appended to it (its real path under the
                root), for callers that must judge who could change them (boot's root trust).

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
        followed = 0
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
                followed += 1
                if links is not None:
                    links.append(candidate)
                if followed > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), host_path)
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

    def read_text(self, host_path: str, default: str | None = None,
                  limit: int = READ_LIMIT) -> str | None:
        """Read a text file under the root (see :func:`read_bounded`); ``default`` when it is
        missing, unreadable, not a regular file or larger than ``limit`` bytes."""
        try:
            data = read_bounded(self.resolve(host_path), limit)
        except OSError:
            return default
        return data.decode("utf-8", errors="replace")

    def read_or_why(self, host_path: str, limit: int = READ_LIMIT) -> tuple[str | None, str]:
        """``(text, "")`` of a file under the root, or ``(None, why)``: why it was not read,
        naming it (:func:`unread`; ``why`` starts with the host path)."""
        try:
            data = read_bounded(self.resolve(host_path), limit)
        except OSError as err:
            return None, unread(host_path, err)
        return data.decode("utf-8", errors="replace"), ""

    def exists(self, host_path: str) -> bool:
        """True when the path exists under the root (links followed chroot-style)."""
        try:
            return os.path.exists(self.resolve(host_path))
        except OSError:
            return False


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISLNK, "a link"))


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for a message: ``a FIFO``, ``a character device``,
    ``a block device``, ``a socket``, ``a folder``, ``a link`` or ``a regular file``."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file")


def _open_regular(path: str) -> int:
    """A descriptor of the regular file at ``path``, opened as :func:`read_bounded` says."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP and os.path.islink(path):
            raise OSError(errno.ELOOP, "a link, not followed here", path) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        err = OSError(errno.EINVAL, "not a regular file", path)
        err.kind = file_kind(mode)  # for unread(): "a FIFO, not a regular file"
        raise err
    return fd


def read_bounded(path: str, limit: int = READ_LIMIT, truncate: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Opened without blocking and without following a link in the last component (paths come
    resolved under the root), so a FIFO, a device or a link planted where a file should be
    cannot hang or redirect the read. procfs and sysfs files count as regular files (their size
    reads 0), so the file is read until its end, not by its size.

    Args:
        path: a real path (already resolved under the root).
        limit: the most bytes read.
        truncate: True: a longer file gives its first ``limit`` bytes (a log, a configuration
            file read as far as its tool would need); False: it is an error.

    Raises:
        OSError: the file is missing or unreadable; ``EINVAL`` when it is not a regular file
            (its ``kind`` attribute says what it is: :func:`file_kind`), ``ELOOP`` for a link,
            ``EFBIG`` when it holds more than ``limit`` bytes (without ``truncate``).
            :func:`unread` makes the message.
    """
    fd = _open_regular(path)
    try:
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                if truncate:
                    return b"".join(chunks)[:limit]
                raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_regular(path: str):
    """The regular file at ``path`` as a binary file object, for readers that stream it (a
    compressed kernel module read through ``lzma``/``gzip``); opened as :func:`read_bounded`
    opens (without blocking, no link in the last component). The caller bounds what it reads.

    Raises:
        OSError: as :func:`read_bounded`, without ``EFBIG``.
    """
    return os.fdopen(_open_regular(path), "rb")


def unread(host_path: str, err: OSError) -> str:
    """Why a file was not read, naming it: ``/etc/modprobe.d/x.conf is a FIFO, not a regular
    file``, ``/etc/x: Permission denied``, ``/etc/x is larger than 4194304 bytes``.

    Args:
        host_path: the path as the VM or image names it (not the real path under ``--root``).
        err: what :func:`read_bounded` or :func:`open_regular` raised.
    """
    why = err.strerror or str(err)
    kind = getattr(err, "kind", None)
    if kind:
        return f"{host_path} is {kind}, not a regular file"
    if err.errno == errno.EFBIG or (err.errno == errno.ELOOP and why.startswith("a link")):
        return f"{host_path} is {why}"
    return f"{host_path}: {why}"


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
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}{TMP_SUFFIX}")
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
    """Create ``path`` and its parents if they are missing, each with ``mode`` (0755) whatever
    the umask (a boot started with umask 077 must not make /var/run/cdi unreadable to kata-agent).
    Existing directories are left as they are.

    Raises:
        OSError: a component exists and is not a directory (``NotADirectoryError``, in words:
            ``not a folder: a file is in its place``), or permission is denied.
    """
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        ensure_dir(parent, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            # "File exists" would not say what is wrong: a file (or a link to one) is where
            # a folder must be
            raise NotADirectoryError(errno.ENOTDIR, "not a folder: a file is in its place",
                                     path) from None
        return
    os.chmod(path, mode)


def folder_trust_problems(folder: str, owners: frozenset[int] | None = None,
                          stop_at: str = "/") -> list[tuple[str, str]]:
    """What would let another user than root change what is under ``folder``:
    ``[("owner" | "mode", text), ...]``, empty when nothing does.

    ``folder`` (its real path) and every folder above it up to ``stop_at`` must be owned by one
    of ``owners`` (root and the user running the agent) and not be writable by its group or
    others; a folder with the sticky bit (``/tmp``) may be, since nobody but an entry's owner
    can replace the entry. The rule of OpenSSH's ``safe_path``: whoever can change a folder on
    the way can swap what follows for a link between a check and a use.

    Args:
        folder: an existing folder.
        owners: the uids that may own them (default root and the effective uid).
        stop_at: the last folder checked (an image root for ``check --image``).
    """
    owners = owners if owners is not None else frozenset({0, os.geteuid()})
    problems: list[tuple[str, str]] = []
    stop = os.path.realpath(stop_at)
    folder = os.path.realpath(folder)
    while True:
        try:
            st = os.stat(folder)
        except OSError as err:
            return problems + [("mode", f"cannot stat {folder}: {err.strerror}")]
        if st.st_uid not in owners:
            problems.append(("owner", f"{folder} is owned by uid {st.st_uid}, not root"))
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problems.append(("mode", f"{folder} is writable by group or others (mode "
                                     f"{stat.S_IMODE(st.st_mode):04o})"))
        if folder in ("/", stop) or not folder.startswith(stop.rstrip("/") + "/"):
            return problems
        folder = os.path.dirname(folder)


def untrusted_dirs(root: Root, host_dirs) -> str | None:
    """Why root must not write under ``root`` into ``host_dirs`` (host paths: boot's are the
    folders of the status file and the spec): a folder on the way (the deepest one that exists,
    and every one above it, the root and its parents included) that another user than root
    owns or can write, or a link on the way that another user may replace. Such a user could
    swap what follows for a link between the checks and the writes and make root write
    anywhere. None when only root can change them (a sticky folder such as /tmp is fine).

    Args:
        root: the :class:`Root` written under.
        host_dirs: host paths of folders, e.g. ``("/run/podvm-gpu", "/var/run/cdi")``.

    Returns:
        One line: the first problem found, or None.
    """
    for host_dir in host_dirs:
        links: list[str] = []
        try:
            folder = root.resolve(host_dir, links=links)
        except OSError:
            continue  # a link loop: the write fails and says so
        while not os.path.isdir(folder) and folder != root.path:
            folder = os.path.dirname(folder)
        problems = folder_trust_problems(folder)
        if problems:
            return problems[0][1]
        why = _foreign_link(links)
        if why:
            return why
    return None


def _foreign_link(links: list[str]) -> str | None:
    """A link on the way that another user may replace: one they own in a folder that others
    can write (a sticky folder lets an entry's owner replace it). Under ``--root`` the agent
    follows links itself, so the kernel's ``protected_symlinks`` does not stand guard."""
    owners = (0, os.geteuid())
    for link in links:
        try:
            st, parent = os.lstat(link), os.stat(os.path.dirname(link))
        except OSError:
            continue
        if st.st_uid not in owners and parent.st_mode & 0o002:
            return (f"{link} is a link owned by uid {st.st_uid} in {os.path.dirname(link)}, "
                    "which others can write: its owner can point it anywhere")
    return None


def is_char_device(path: str, follow: bool = True) -> tuple[int, int] | None:
    """``(major, minor)`` when ``path`` is a character device, else None; with ``follow``
    False a symlink at ``path`` is not one (``lstat``)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def trust_problems(path: str, info: os.stat_result | None = None, *,
                   owners: frozenset[int] | None = None, stop_at: str = "/") -> list[tuple[str, str]]:
    """What would let another user than root change a file that boot (as root) takes orders
    from: ``[("owner" | "mode", text), ...]``, empty when nothing does.

    The file, and every directory above its real path up to ``stop_at``, must be owned by one of
    ``owners`` (root and the user running the agent) and not be writable by its group or others.
    A directory with the sticky bit (``/tmp``) may be writable by others: nobody but an entry's
    owner can replace the entry. The rule of OpenSSH's ``safe_path`` for its keys.

    Args:
        path: the file's path.
        info: the file's ``os.fstat`` when it is already open (no race on the file itself).
        owners: the uids that may own them (default root and the effective uid).
        stop_at: the last directory checked (an image root for ``check --image``).
    """
    owners = owners if owners is not None else frozenset({0, os.geteuid()})
    problems: list[tuple[str, str]] = []
    try:
        info = info or os.stat(path)
    except OSError as err:
        return [("mode", f"cannot stat it: {err.strerror}")]
    if info.st_uid not in owners:
        problems.append(("owner", f"it is owned by uid {info.st_uid}, not root"))
    if info.st_mode & 0o022:
        problems.append(("mode", f"it is writable by group or others (mode "
                                 f"{stat.S_IMODE(info.st_mode):04o})"))
    return problems + [(kind, f"above it, {text}") for kind, text in folder_trust_problems(
        os.path.dirname(os.path.realpath(path)), owners, stop_at)]


def untrusted_because(path: str, info: os.stat_result | None = None) -> str | None:
    """The first of :func:`trust_problems` of ``path`` as one line, or None."""
    problems = trust_problems(path, info)
    return problems[0][1] if problems else None
