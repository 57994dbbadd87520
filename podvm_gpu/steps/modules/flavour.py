"""``check --image``'s ``module-flavour`` row (issue 46 item 7): whether the nvidia module that
``modprobe nvidia`` reaches (as the ``modules`` row resolves it, host/kmod.py) is NVIDIA's open
kernel module or the proprietary one, read from the file's ``.modinfo`` ``license`` (host/kmod.py
``modinfo``: the host's modinfo, else the file's own strings; nothing in the image runs).

The open module says ``license: Dual MIT/GPL``, the proprietary one ``license: NVIDIA`` (read from
Debian 12's ``nvidia-current-open.ko`` and ``nvidia-current.ko`` 535.261.03, tests/test_module_flavour.py).
A proprietary module fails where it cannot work: in an image that says it serves Blackwell GPUs
(``modules.image_serves_blackwell``; NVIDIA: Blackwell and Grace Hopper are supported by the open
modules only), and at driver 615 or later (from R615 NVIDIA ships no proprietary module for
Turing and newer, cupy#10296; docs/compatibility.md). When a module of the other flavour is
installed too, the row warns naming which one loads and why (the modprobe.d rule it follows and,
on Debian, the ``nvidia`` alternative that set that rule up; or depmod's index).
"""

from __future__ import annotations

import os

from podvm_gpu import readers
from podvm_gpu.host import kmod
from podvm_gpu.host.fs import Root
from podvm_gpu.row import FAIL, PASS, SKIP, WARN, Check

OPEN_LICENSE = "Dual MIT/GPL"
PROPRIETARY_LICENSE = "NVIDIA"
# The first driver branch without a proprietary module for Turing and newer (cupy#10296).
NO_PROPRIETARY_FROM = 615
DEBIAN_ALTERNATIVE = "/var/lib/dpkg/alternatives/nvidia"
OPEN_HINT = ("install the open kernel module and make modprobe nvidia reach it (Debian: "
             "nvidia-open-kernel-dkms, which then needs the nvidia alternative set to it; "
             "NVIDIA's packages: the -open ones; the .run installer: -m=kernel-open)")


def flavour(license_text: str | None) -> str | None:
    """``open`` for ``Dual MIT/GPL``, ``proprietary`` for ``NVIDIA``, None for anything else
    (no license read, or another one)."""
    return {OPEN_LICENSE: "open", PROPRIETARY_LICENSE: "proprietary"}.get(license_text or "")


def module_license(runner, real_path: str) -> str | None:
    """The first ``license`` of a module file (host path), or None when it cannot be read."""
    values = kmod.modinfo(runner, real_path, "license")
    return values[0] if values else None


def module_version(runner, real_path: str) -> str | None:
    """A module file's version, read as the ``versions`` row reads it (``modinfo -F version``,
    else the file's ``.modinfo`` strings)."""
    values = kmod.modinfo(runner, real_path, "version")
    return readers.version_in(values[0]) if values else None


def branch(version: str | None) -> int | None:
    """The driver branch of a module version: ``615.71.09`` -> 615; None when unreadable."""
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def debian_alternative(root: Root) -> str | None:
    """What Debian's ``nvidia`` alternative selects, as one clause: ``Debian's nvidia alternative
    (auto) selects /usr/lib/nvidia/current (priority 535) over /usr/lib/nvidia/current-open
    (priority 534)``; None where the image has no such alternative. The file is dpkg's
    (update-alternatives' administrative format: mode, link, slave pairs, a blank line, then
    each choice as path, priority and one line per slave)."""
    text = root.read_text(DEBIAN_ALTERNATIVE)
    if not text:
        return None
    lines = text.split("\n")
    try:
        blank = lines.index("", 2)
    except ValueError:
        return None
    slaves = (blank - 2) // 2
    choices, i = [], blank + 1
    while i + 1 < len(lines) and lines[i]:
        choices.append((lines[i], lines[i + 1]))
        i += 2 + slaves
    try:
        chosen = os.readlink(root.resolve("/etc/alternatives/nvidia", follow_last=False))
    except OSError:
        chosen = None
    if chosen is None and lines[0] == "auto" and choices:
        chosen = max(choices, key=lambda c: int(c[1]) if c[1].isdigit() else -1)[0]
    said = {path: prio for path, prio in choices}
    if chosen not in said:
        return None
    over = [f"{p} (priority {said[p]})" for p, _ in choices if p != chosen]
    return (f"Debian's nvidia alternative ({lines[0]}) selects {chosen} (priority "
            f"{said[chosen]})" + (f" over {', '.join(over)}" if over else ""))


def why_reached(root: Root, res: kmod.Resolution) -> str:
    """Why ``modprobe nvidia`` reaches ``res.file``: the modprobe.d rule it follows (and the
    Debian alternative behind it), or depmod's index when no rule leads there."""
    if res.rules:
        said = f"modprobe nvidia follows {res.rules[0]}"
        alternative = debian_alternative(root)
        return f"{said}; {alternative}" if alternative else said
    return ("no modprobe.d rule names a file, so modprobe takes the one modules.dep lists as "
            "nvidia (depmod's search order: /etc/depmod.d, updates/ first on Debian)")


def module_flavour_image_row(image) -> Check:
    """The ``module-flavour`` row (module docstring). ``image``: a
    :class:`podvm_gpu.check.image.Image`."""
    root, runner = image.root, image.runner
    blackwell = image.config.modules.image_serves_blackwell
    files = kmod.present_files(root, image.found)
    if not files:
        return Check("module-flavour", SKIP, "no nvidia module that modprobe reaches (see modules)",
                     "fix the modules row first")
    fails, warns, said = [], [], []
    for release, path in files.items():
        real = root.resolve(path)
        license_text = module_license(runner, real)
        kind = flavour(license_text)
        version = module_version(runner, real)
        major = branch(version)
        shown = f"{release}: nvidia -> {path}: {kind or 'unknown'} (license: {license_text or 'unread'}" \
                f", {version or 'version unread'})"
        said.append(shown)
        if kind != "open" and blackwell:
            fails.append(f"{shown}: modules.image_serves_blackwell is true and Blackwell GPUs work "
                         "only with NVIDIA's open kernel module (the proprietary one logs "
                         "'requires use of the NVIDIA open kernel modules' and attaches no GPU)")
        elif kind == "proprietary" and major is not None and major >= NO_PROPRIETARY_FROM:
            fails.append(f"{shown}: from driver {NO_PROPRIETARY_FROM} NVIDIA has no proprietary "
                         "module for Turing and newer GPUs")
        elif kind is None:
            warns.append(f"{shown}: neither {OPEN_LICENSE!r} (open) nor {PROPRIETARY_LICENSE!r} "
                         "(proprietary)")
        others = [(p, flavour(module_license(runner, root.resolve(p))))
                  for p in kmod.files_named(root, release, "nvidia") if p != path]
        other = next(((p, k) for p, k in others if k and k != kind), None)
        if other:
            warns.append(f"{release}: the {other[1]} module {other[0]} is installed too, and the "
                         f"{kind or 'unknown'} {path} is the one that loads: "
                         f"{why_reached(root, image.found[release]['nvidia'])}")
    if fails:
        return Check("module-flavour", FAIL, "; ".join(fails[:2]), OPEN_HINT)
    if warns:
        return Check("module-flavour", WARN, "; ".join(warns[:2]),
                     "remove the module the image does not use, or set the modprobe.d rule (on "
                     "Debian: update-alternatives --set nvidia <path>) to the one it should load"
                     if any("installed too" in w for w in warns) else kmod.UNREADABLE_MODULE_HINT)
    return Check("module-flavour", PASS, "; ".join(said))
