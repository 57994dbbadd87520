"""What ``modprobe <name>`` would load for a kernel: kmod itself asked, or its files read as kmod reads them.

Distributions do not all install the module as ``nvidia.ko``. NVIDIA's own packages and most
DKMS builds do (``/lib/modules/<release>/updates/dkms/nvidia.ko``); Debian 12 builds
``nvidia-current.ko``, ``nvidia-current-uvm.ko``, ... (DKMS module ``nvidia-current``, internal
name still ``nvidia``, so ``/proc/modules`` says ``nvidia``) and reaches them through ``install``
rules in ``/etc/modprobe.d/nvidia.conf``, a link through the alternatives system to
``/etc/nvidia/current/nvidia-modprobe.conf``::

    install nvidia modprobe -i nvidia-current $CMDLINE_OPTS
    install nvidia-uvm modprobe nvidia ; modprobe -i nvidia-current-uvm $CMDLINE_OPTS

Debian sets that link up (glx-alternative-nvidia) only when an NVIDIA library such as
``libcuda1`` is installed; without it ``modprobe nvidia`` fails with ``Module nvidia not found``
although ``nvidia-current.ko`` is there (tests/data/nvidia-535.261.03/README.md).

:func:`resolve` answers with the real kmod (``modprobe -S <release> --show-depends <name>``,
with a timeout) when the root is ``/`` and ``modprobe`` exists, and otherwise (an image root, a
machine without kmod) with :func:`read_resolve`, which reads the modprobe.d files, ``modules.dep``
and ``modules.alias`` of the root the way kmod 30 does: configuration files sorted by name across
``/etc``, ``/run``, ``/usr/local/lib``, ``/usr/lib`` and ``/lib`` ``modprobe.d`` (a name in an
earlier folder hides the same name in a later one; links resolved inside the root), the first
``install`` line of a module wins and runs instead of loading it, ``alias`` lines of the
configuration come before the module files, ``blacklist`` only affects ``modprobe -b`` (which the
agent does not use), names match with ``-`` and ``_`` alike. Those rules were checked against the
real kmod 30 of Debian 12 (tests/test_kmod.py).
"""

from __future__ import annotations

import fnmatch
import os
import re

from podvm_gpu.errors import CommandError
from podvm_gpu.host.fs import Root, file_kind, open_regular, read_bounded
from podvm_gpu.host.fs import unread as _unread
from podvm_gpu.record import REQUIRED, Record

CONFIG_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/usr/lib/modprobe.d",
               "/lib/modprobe.d")
_MAX_DEPTH = 6  # install rules that call modprobe for another name: a loop ends here
_MAX_CONFIG = 1 << 20  # a modprobe.d file is a few KiB; a larger one is read only this far
_MODULE_SUFFIX = re.compile(r"\.ko(?:\.(?:xz|zst|gz))?$")


def norm(name: str) -> str:
    """A module name as kmod compares it: ``-`` and ``_`` are the same."""
    return name.replace("-", "_")


class Rule(Record):
    """One modprobe.d line: ``command`` (install, alias, ...), ``name``, ``rest`` of the line, and
    ``where``: ``<host path of the file>: <line>``."""

    FIELDS = (("command", REQUIRED), ("name", REQUIRED), ("rest", REQUIRED), ("where", REQUIRED))


class Resolution(Record):
    """What ``modprobe <name>`` loads.

    Attributes:
        name: the name asked for (``nvidia``).
        file: host path (inside the root) of the module file it inserts, or None.
        rules: the modprobe.d lines that led there (``<file>: install nvidia modprobe -i ...``).
        blocked: an ``install`` rule whose command loads no module (``/bin/false``,
            ``/bin/true``), as ``<file>: <line>``; then ``file`` is None.
        builtin: the module is built into the kernel.
        source: ``modprobe --show-depends`` (the real kmod) or ``modprobe.d and modules.dep``.
        unread: the modprobe.d files that could not be read, each named with why (a FIFO, a
            folder, unreadable): what they say is not in this answer (:func:`read_rules`).
    """

    FIELDS = (("name", REQUIRED), ("file", REQUIRED), ("rules", ()), ("blocked", None),
              ("builtin", False), ("source", "modprobe.d and modules.dep"), ("unread", ()))

    @property
    def found(self) -> bool:
        return self.file is not None or self.builtin


def config_files(root: Root) -> list[str]:
    """Host paths of the modprobe.d ``*.conf`` files kmod reads, in its order."""
    chosen: dict[str, str] = {}
    for folder in CONFIG_DIRS:
        try:
            names = os.listdir(root.resolve(folder))
        except OSError:
            continue
        for name in names:
            if name.endswith(".conf") and name not in chosen:
                chosen[name] = f"{folder}/{name}"
    return [chosen[name] for name in sorted(chosen)]


def read_rules(root: Root, unread: list[str] | None = None) -> list[Rule]:
    """Every ``alias``/``install``/``blacklist``/``options``/``remove``/``softdep`` line, in order.

    Lines ending in ``\\`` continue on the next; ``#`` starts a comment. A file's links are
    resolved inside the root (Debian's are absolute links into ``/etc/alternatives``). Each file
    is read as a bounded regular file (host/fs.py ``read_bounded``, its first
    ``_MAX_CONFIG`` bytes): a FIFO, a device or a folder named ``*.conf`` is not read and never
    waited on.

    Args:
        unread: when given, why each file that could not be read was not, naming it
            (``/etc/modprobe.d/x.conf is a FIFO, not a regular file``), is appended to it.
    """
    rules = []
    for host_path in config_files(root):
        try:
            text = read_bounded(root.resolve(host_path), _MAX_CONFIG, truncate=True).decode(
                "utf-8", errors="replace")
        except OSError as err:
            if unread is not None:
                unread.append(_unread(host_path, err))
            continue
        for line in text.replace("\\\n", " ").splitlines():
            words = line.split("#", 1)[0].split(None, 2)
            if len(words) >= 2 and words[0] in ("alias", "install", "blacklist", "options", "remove",
                                                  "softdep"):
                rest = words[2] if len(words) > 2 else ""
                rules.append(Rule(words[0], words[1], rest,
                                  f"{host_path}: {' '.join(line.split('#', 1)[0].split())}"))
    return rules


def _modules_dep(root: Root, release: str) -> dict[str, str] | None:
    """modname -> host path from ``modules.dep`` (None when depmod never ran for the release)."""
    base = f"/lib/modules/{release}"
    text = root.read_text(f"{base}/modules.dep")
    if text is None:
        return None
    found: dict[str, str] = {}
    for line in text.splitlines():
        path = line.split(":", 1)[0].strip()
        if path:
            name = norm(_MODULE_SUFFIX.sub("", os.path.basename(path)))
            found.setdefault(name, path if path.startswith("/") else f"{base}/{path}")
    return found


def depmod_ran(root: Root, release: str) -> bool:
    """Whether ``/lib/modules/<release>/modules.dep.bin`` is there: depmod's index of
    ``modules.dep``, the only file kmod's modprobe looks a module up in (kmod 30 finds nothing
    with the text ``modules.dep`` alone, and nothing without both: ``FATAL: Module nvidia not
    found in directory``; checked in tests/test_check_image_gaps.py). A link counts if it leads
    to a file inside the root."""
    try:
        return os.path.isfile(root.resolve(f"/lib/modules/{release}/modules.dep.bin"))
    except OSError:
        return False


def unindexed(root: Root, kernels: list[str]) -> tuple[str, str] | None:
    """``check --image``'s verdict on kernels depmod never indexed (:func:`depmod_ran`): the
    detail and the hint (``run depmod -b <root> <release>``), or None when every kernel is.
    An image is finished, so the image check does not read the module files instead, as
    :func:`read_resolve` does for a live VM's diagnosis (issue 35 item 2)."""
    missing = [k for k in kernels if not depmod_ran(root, k)]
    if not missing:
        return None
    release = missing[0]
    more = f" (and kernel(s) {', '.join(missing[1:])})" if missing[1:] else ""
    return (f"kernel {release}: no /lib/modules/{release}/modules.dep.bin: kmod's modprobe looks "
            f"modules up only in depmod's index, so modprobe nvidia finds no module ('Module "
            f"nvidia not found in directory /lib/modules/{release}'){more}",
            "; ".join(f"{'run ' if i == 0 else ''}depmod -b {root.path} {k}"
                      for i, k in enumerate(missing)))


def _walk_modules(root: Root, release: str) -> dict[str, str]:
    """modname -> host path of every module file under ``/lib/modules/<release>`` (no
    ``modules.dep``: a tree depmod never ran on, as in an image being built)."""
    found: dict[str, str] = {}
    top = root.resolve(f"/lib/modules/{release}")
    for dirpath, dirs, files in os.walk(top):
        dirs.sort()
        for f in sorted(files):
            if _MODULE_SUFFIX.search(f):
                relative = os.path.relpath(os.path.join(dirpath, f), top)
                found.setdefault(norm(_MODULE_SUFFIX.sub("", f)), f"/lib/modules/{release}/{relative}")
    return found


def _aliases(root: Root, release: str) -> list[tuple[str, str]]:
    """(pattern, modname) from ``modules.alias`` (what depmod collected from the modules)."""
    out = []
    for line in (root.read_text(f"/lib/modules/{release}/modules.alias") or "").splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "alias":
            out.append((norm(words[1]), norm(words[2])))
    return out


def install_targets(command: str) -> list[tuple[str, bool]]:
    """The modules an install command loads with modprobe, in order, as (name, ``-i`` given).

    ``modprobe nvidia ; modprobe -i nvidia-current-uvm $CMDLINE_OPTS`` ->
    ``[("nvidia", False), ("nvidia-current-uvm", True)]``. Removals (``-r``) and words that are
    options, variables or ``KEY=VALUE`` parameters are left out. Commands other than modprobe
    (``/bin/false``) load nothing.
    """
    targets = []
    for part in re.split(r";|&&|\|\|?", command):
        try:
            import shlex  # install rules only

            words = shlex.split(part)
        except ValueError:
            words = part.split()
        if not words or os.path.basename(words[0]) != "modprobe":
            continue
        options = [w for w in words[1:] if w.startswith("-")]
        if any(o in ("-r", "--remove") or (o.startswith("-") and not o.startswith("--") and "r" in o[1:])
               for o in options):
            continue
        names = [w for w in words[1:] if not w.startswith(("-", "$")) and "=" not in w]
        ignore = any(o in ("-i", "--ignore-install") or (not o.startswith("--") and "i" in o[1:])
                     for o in options)
        targets.extend((name, ignore) for name in names[:1])
    return targets


def read_resolve(root: Root, release: str, name: str) -> Resolution:
    """What ``modprobe <name>`` would load for ``release``, from the root's files (see the module
    docstring for the rules); links resolved inside the root, nothing run."""
    unread: list[str] = []
    rules = read_rules(root, unread)
    modules = _modules_dep(root, release)
    if modules is None:
        modules = _walk_modules(root, release)
    builtin = {norm(_MODULE_SUFFIX.sub("", os.path.basename(line.strip())))
               for line in (root.read_text(f"/lib/modules/{release}/modules.builtin") or "").splitlines()}
    aliases = _aliases(root, release)

    def lookup(wanted: str, ignore_install: bool, depth: int, trail: tuple[str, ...]) -> Resolution:
        # kmod's lookup order: configuration aliases, then the name itself (modules.dep or an
        # install rule), then modules.alias, then built-in modules
        key = norm(wanted)
        for rule in rules:
            target = rule.rest.split()[0] if rule.rest.split() else ""
            if rule.command == "alias" and target and fnmatch.fnmatchcase(key, norm(rule.name)):
                return load(target, ignore_install, depth + 1, trail + (rule.where,))
        return load(key, ignore_install, depth, trail)

    def load(wanted: str, ignore_install: bool, depth: int, trail: tuple[str, ...]) -> Resolution:
        key = norm(wanted)
        if depth > _MAX_DEPTH:
            return Resolution(name, None, trail, blocked=f"install and alias rules loop at {wanted}")
        if not ignore_install:
            rule = next((r for r in rules if r.command == "install" and norm(r.name) == key), None)
            if rule is not None:
                targets = install_targets(rule.rest)
                if not targets:
                    return Resolution(name, None, trail + (rule.where,), blocked=rule.where)
                # the rule's earlier modprobe calls load what the module needs first
                target, ignore = targets[-1]
                return lookup(target, ignore or norm(target) == key, depth + 1, trail + (rule.where,))
        if key in modules:
            return Resolution(name, modules[key], trail)
        for pattern, target in aliases:
            if target != key and fnmatch.fnmatchcase(key, pattern):
                return load(target, False, depth + 1, trail)
        if key in builtin:
            return Resolution(name, None, trail, builtin=True)
        return Resolution(name, None, trail)

    found = lookup(name, False, 0, ())
    return Resolution(**{**found.to_dict(), "unread": tuple(unread)}) if unread else found


def kmod_resolve(runner, release: str, name: str) -> Resolution | None:
    """Ask the real kmod: ``modprobe -S <release> --show-depends <name>``, following ``install``
    commands that call modprobe for another name. None when kmod cannot answer (not installed,
    timed out), so the caller reads the files instead.

    Args:
        runner: a :class:`podvm_gpu.host.proc.Runner` (read-only is fine: only queries run).
    """
    trail: list[str] = []
    wanted, ignore = name, False
    for _ in range(_MAX_DEPTH):
        argv = ["modprobe", "-S", release, "--show-depends", *(["-i"] if ignore else []), wanted]
        try:
            done = runner.run(argv, check=False)
        except CommandError:
            return None
        lines = [ln.split() for ln in done.stdout.splitlines() if ln.strip()]
        if done.returncode != 0 or not lines:
            # "modprobe: FATAL: Module nvidia not found in directory /lib/modules/<release>"
            return Resolution(name, None, tuple(trail), source="modprobe --show-depends")
        last = lines[-1]
        if last[0] == "insmod" and len(last) > 1:
            return Resolution(name, last[1], tuple(trail), source="modprobe --show-depends")
        if last[0] == "builtin":
            return Resolution(name, None, tuple(trail), builtin=True, source="modprobe --show-depends")
        if last[0] != "install":
            return None
        command = " ".join(last[1:])
        trail.append(f"install {wanted} {command}")
        targets = install_targets(command)
        if not targets:
            return Resolution(name, None, tuple(trail), blocked=f"install {wanted} {command}",
                              source="modprobe --show-depends")
        target, target_ignore = targets[-1]
        ignore = target_ignore or norm(target) == norm(wanted)
        wanted = target
    return None


def resolve(root: Root, release: str, name: str, runner=None) -> Resolution:
    """What ``modprobe <name>`` loads for ``release``: the real kmod where the root is ``/`` and a
    runner is given, else (or when kmod cannot answer) :func:`read_resolve`."""
    if runner is not None and root.is_host and runner.which("modprobe"):
        asked = kmod_resolve(runner, release, name)
        if asked is not None:
            return asked
    return read_resolve(root, release, name)


def internal_name(root: Root, host_path: str) -> str | None:
    """The ``name=`` a module file carries in its ``.modinfo`` section: the name the kernel lists
    in ``/proc/modules`` (Debian's ``nvidia-current.ko`` says ``nvidia``). Uncompressed files
    only; None when unreadable (a link loop on its way included)."""
    try:
        real = root.resolve(host_path)
    except OSError:
        return None
    return modinfo_field(real, "name")


def modinfo_field(real_path: str, field: str) -> str | None:
    """The first ``<field>=`` string of a module file's ``.modinfo`` section, or None."""
    values = modinfo_fields(real_path, field)
    return values[0] if values else None


def modinfo_fields(real_path: str, field: str, limit: int = 128 << 20) -> list[str]:
    """Every ``<field>=`` string of a module file's ``.modinfo`` section (a NUL-separated list of
    ``key=value`` strings; ``firmware`` appears once per file), in order. Plain, ``.ko.xz`` and
    ``.ko.gz`` files (Debian's DKMS modules are plain; distribution kernels compress theirs);
    ``.ko.zst`` needs ``modinfo`` (no zstd in Python's standard library): ``[]``. A file is read
    up to 128 MiB (nvidia.ko is about 60 MiB) of its uncompressed bytes; a file larger than that
    (``limit``), or not a regular file, gives ``[]`` unread."""
    try:
        raw = open_regular(real_path)  # a FIFO or a device named like a module never blocks
    except OSError:
        return []
    errors: tuple = (OSError, EOFError, ValueError)
    with raw:
        if os.fstat(raw.fileno()).st_size > limit:
            return []  # no module is that large, compressed or not: not read at all
        try:
            if real_path.endswith(".xz"):
                import lzma

                errors += (lzma.LZMAError,)
                # the xz format only, as kmod reads .ko.xz: liblzma's auto-detection takes a
                # file of zeros for a raw LZMA stream and reads all of it
                with lzma.open(raw, format=lzma.FORMAT_XZ) as f:
                    data = f.read(limit)
            elif real_path.endswith(".gz"):
                import gzip
                import zlib

                errors += (zlib.error,)
                with gzip.open(raw) as f:
                    data = f.read(limit)
            else:
                data = raw.read(limit)
        except errors:  # unreadable, or a corrupt archive
            return []
    pattern = rb"(?:^|\0)" + re.escape(field.encode()) + rb"=([^\0]{1,200})(?=\0)"
    return list(dict.fromkeys(m.decode(errors="replace") for m in re.findall(pattern, data)))


def files_named(root: Root, release: str, module: str) -> list[str]:
    """Host paths of module files under ``/lib/modules/<release>`` whose internal name is
    ``module`` (``nvidia-current.ko`` for ``nvidia``), whatever their file name; only files whose
    name starts with the module's first word are opened (the nvidia ones are tens of MB)."""
    stem = norm(module).split("_")[0]
    found = []
    for modname, path in sorted(_walk_modules(root, release).items()):
        if modname.startswith(stem) and norm(internal_name(root, path) or "") == norm(module):
            found.append(path)
    return found


def unreached(root: Root, release: str, module: str) -> str | None:
    """Why a file that holds ``module`` is not what ``modprobe <module>`` finds, or None when no
    such file is there: a module file ``modules.dep`` does not list (depmod did not run after it
    was installed), or the module under another file name that no modprobe.d rule reaches
    (Debian's ``nvidia-current.ko`` without ``/etc/modprobe.d/nvidia.conf``)."""
    named = files_named(root, release, module)
    if not named:
        return None
    path = named[0]
    if norm(_MODULE_SUFFIX.sub("", os.path.basename(path))) == norm(module):
        return (f"{path} is not in modules.dep (depmod has not run for {release} since it was "
                "installed)")
    return (f"{path} is the {module} module under another name, and no modprobe.d "
            f"'install {module}' or 'alias {module}' rule points to it")


UNREADABLE_MODULE_HINT = ("run the check where modinfo is installed (in the image with "
                          "systemd-nspawn, as the Packer build does), or check that the file is a "
                          "kernel module")


def modinfo(runner, path: str, field: str) -> list[str]:
    """``modinfo -F FIELD FILE`` (one value a line) run by ``runner`` (a read-only
    :class:`podvm_gpu.host.proc.Runner`), else the file's own ``.modinfo`` strings; ``[]`` for
    what is not a regular file (modinfo would wait on a FIFO until its timeout)."""
    if not_a_file(path):
        return []
    try:
        done = runner.run(["modinfo", "-F", field, path], check=False)
        values = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        if done.returncode == 0 and values:
            return values
    except CommandError:
        pass
    return modinfo_fields(path, field)


def not_a_file(real_path: str) -> str | None:
    """What the file at ``real_path`` is when it exists and is not a regular file (``a FIFO``,
    host/fs.py ``file_kind``), else None."""
    import stat

    try:
        mode = os.stat(real_path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


def absent_file(root: Root, res: Resolution) -> str | None:
    """Why what ``modprobe <name>`` reaches cannot load: the file ``modules.dep`` names is not
    in the root (a DKMS build removed, or a module deleted, without running depmod; kmod would
    fail with "could not insert ...: No such file or directory"), or is not a regular file (a
    FIFO, a folder: named, never opened); None when it is there or nothing was reached."""
    if res.file is None:
        return None
    try:
        real = root.resolve(res.file)
    except OSError as err:
        return f"{res.file}, which modules.dep names, cannot be reached: {err.strerror}"
    kind = not_a_file(real)
    if kind:
        return f"{res.file}, which modules.dep names, is {kind}, not a module file"
    if os.path.isfile(real):
        return None
    return f"{res.file}, which modules.dep names, is not there"


def present_files(root: Root, found: dict[str, dict[str, Resolution]], module: str = "nvidia") -> dict[str, str]:
    """Kernel -> host path of the ``module`` file ``modprobe`` reaches for that kernel, for the
    kernels where that file is in the root (``found``: release -> name -> resolution); the
    modules row says why the others have none."""
    return {k: r[module].file for k, r in found.items()
            if module in r and r[module].file and not absent_file(root, r[module])}
