"""``check --image``'s ``toolkit`` row (issue 36): which nvidia-ctk and nvidia-cdi-hook an image
carries, and whether they fit each other and the config.

An image is not run: the versions come from the package manager's records, dpkg's
``/var/lib/dpkg/info/<package>.list`` (which package installed the binary; only the lists of
packages whose name holds ``nvidia`` are read) and ``/var/lib/dpkg/status`` (that package's
``Version``, its upstream part: ``1.17.8-1`` -> ``1.17.8``). On root ``/`` (check run inside
the image, in nspawn) a binary no package installed is asked its ``--version`` (bounded).
Binaries of two toolkit versions warn (a spec of the newer nvidia-ctk can name hooks the older
hook binary refuses, and the boot then fails: steps/cdi/toolkit.py; the toolkit's tables are
podvm_gpu/nvidia_ctk.py's); so does a version below
1.18.0 with ``imex.channels`` or ``cdi.disable_hooks`` set. Versions not known are a ``skip``.

CDI versions (issue 46): podman before 5 cannot read a spec of ``cdiVersion`` 0.7.0
(``unresolvable CDI devices nvidia.com/gpu=0``, nvidia-container-toolkit#1940). The image is not
run, so which version its nvidia-ctk writes comes from
:data:`~podvm_gpu.nvidia_ctk.SPEC_VERSIONS`, the versions seen written by each toolkit version
(nvidia-ctk writes the lowest version its spec's content needs, so it is a version seen, not a
rule); podman's from dpkg's ``podman`` package. A warning only when
both are known: podman older than 5 and a toolkit whose spec was seen at 0.7.0 or newer; a version
not in the table, or no podman (kata-agent reads with its own CDI crate, which reads 0.7.0), says
nothing.
"""

from __future__ import annotations

import os
import re

from podvm_gpu.host.fs import read_bounded
from podvm_gpu.nvidia_ctk import BINARIES, SINCE_1_18, SPEC_VERSIONS, needed_features, parse_version, version_argv
from podvm_gpu.row import PASS, SKIP, WARN, Check

ROW = "toolkit"
DPKG_INFO = "/var/lib/dpkg/info"
DPKG_STATUS = "/var/lib/dpkg/status"
STATUS_LIMIT = 64 << 20  # a dpkg status of a full desktop is a few MB
PODMAN_READS_0_7 = 5  # podman's major version from which its CDI library reads 0.7.0
_UPSTREAM = re.compile(r"^(?:\d+:)?(\d+\.\d+\.\d+[^-\s]*)")


def owner(root, path: str) -> str | None:
    """The dpkg package (``name`` or ``name:arch``) whose file list holds ``path`` (or its
    usr-merged twin, ``/bin/x`` for ``/usr/bin/x``), among the packages named ``*nvidia*``."""
    wanted = {path, path[len("/usr"):] if path.startswith("/usr/") else "/usr" + path}
    try:
        names = sorted(n for n in os.listdir(root.resolve(DPKG_INFO))
                       if n.endswith(".list") and "nvidia" in n)
    except OSError:
        return None
    for name in names:
        try:
            text = read_bounded(root.resolve(f"{DPKG_INFO}/{name}")).decode(errors="replace")
        except OSError:
            continue
        if wanted & set(text.splitlines()):
            return name[:-len(".list")]
    return None


def installed_versions(root) -> dict[str, str]:
    """Package name -> ``Version`` of every installed package in dpkg's status (``Status:
    install ok installed``); ``{}`` when it cannot be read."""
    try:
        text = read_bounded(root.resolve(DPKG_STATUS), STATUS_LIMIT).decode(errors="replace")
    except OSError:
        return {}
    found = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            name = fields["Package"]
            arch = fields.get("Architecture", "")
            found[name] = found[f"{name}:{arch}"] = fields.get("Version", "")
    return found


def upstream(version: str) -> str | None:
    """The upstream part of a Debian version (``1.17.8-1`` -> ``1.17.8``), None if none."""
    m = _UPSTREAM.match(version)
    return m.group(1) if m else None


def image_row(image) -> Check:
    """nvidia-ctk's and nvidia-cdi-hook's versions in the image (see the module docstring)."""
    paths = {b: image.tool(b) for b in BINARIES}
    if paths["nvidia-ctk"] is None:
        return Check(ROW, SKIP, "no nvidia-ctk in the image (the tools row)")
    packages = installed_versions(image.root)
    seen, said = {}, []
    for binary, path in paths.items():
        if path is None:
            if binary != "nvidia-cdi-hook":  # its problem below says it (issue 47 item 13)
                said.append(f"no {binary}")
            continue
        package = owner(image.root, path)
        version = upstream(packages.get(package, "")) if package else None
        how = f"package {package} {packages.get(package)}" if version else ""
        if version is None and image.root.is_host:
            version, how = _asked(image, path), "its --version"
        if version is None:
            said.append(f"{path}: version unknown (no dpkg package lists it)")
            continue
        seen[binary] = version
        said.append(f"{binary} {version} at {path} ({how})")
    detail = "; ".join(said) or "no toolkit binary"
    problems, hints = [], []
    if paths["nvidia-cdi-hook"] is None:
        problems.append("no nvidia-cdi-hook: the hooks of nvidia-ctk's specs name it")
        hints.append("install nvidia-container-toolkit-base, which carries both")
    if len(set(seen.values())) > 1:
        problems.append("nvidia-ctk and nvidia-cdi-hook come from different toolkit versions: "
                        "a spec of the newer can name hooks the older refuses, and the boot "
                        "then fails")
        hints.append("install both from one nvidia-container-toolkit version")
    ctk = parse_version(f"version {seen['nvidia-ctk']}") if "nvidia-ctk" in seen else None
    lacking = needed_features(image.config)
    if ctk is not None and ctk.number < SINCE_1_18 and lacking:
        problems.append(f"{', '.join(lacking)} need nvidia-ctk 1.18.0 or later; the boot fails "
                        "before generating")
        hints.append("install nvidia-container-toolkit 1.18.0 or later, or unset "
                     f"{', '.join(lacking)}")
    podman = podman_problem(packages, seen.get("nvidia-ctk"))
    if podman:
        problems.append(podman[0])
        hints.append(podman[1])
    if problems:
        return Check(ROW, WARN, f"{detail}: {'; '.join(problems)}", "; ".join(hints))
    if len(seen) < len(BINARIES):
        return Check(ROW, SKIP, f"{detail}: versions not compared")
    return Check(ROW, PASS, detail)


def podman_problem(packages: dict[str, str], ctk: str | None) -> tuple[str, str] | None:
    """``(problem, hint)`` when dpkg's podman is older than 5 and nvidia-ctk ``ctk`` (its
    version) was seen writing a spec of cdiVersion 0.7.0 or newer
    (:data:`~podvm_gpu.nvidia_ctk.SPEC_VERSIONS`); None when either is not known or they fit.

    Args:
        packages: :func:`installed_versions`; ctk: nvidia-ctk's upstream version or None.
    """
    spec = SPEC_VERSIONS.get(ctk or "")
    podman = upstream(packages.get("podman", ""))
    if spec is None or podman is None:
        return None
    major = int(podman.split(".")[0])
    if major >= PODMAN_READS_0_7 or tuple(int(x) for x in spec.split(".")) < (0, 7, 0):
        return None
    return (f"podman {podman} (dpkg) is older than {PODMAN_READS_0_7} and nvidia-ctk {ctk} was "
            f"seen writing specs of cdiVersion {spec} (the toolkit version table): podman "
            "refuses them (unresolvable CDI devices nvidia.com/gpu=0, "
            "nvidia-container-toolkit#1940)",
            f"install podman {PODMAN_READS_0_7} or later, or an nvidia-container-toolkit whose "
            "specs podman reads (1.20.0 wrote 0.5.0)")


def _asked(image, path: str) -> str | None:
    """A binary's version from its ``--version`` (root ``/`` only), None when not told."""
    from podvm_gpu.errors import CommandError
    from podvm_gpu.steps.context import HARMLESS_CALL_S

    try:
        done = image.runner.run(version_argv(path), check=False, timeout=HARMLESS_CALL_S)
    except CommandError:
        return None
    found = parse_version(done.output) if done.returncode == 0 else None
    return found.text if found else None
