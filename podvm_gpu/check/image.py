"""``check --image`` (contract section 6): what an image needs before it ships. The facts about
the image's kernels and modules are read once (:class:`Image`); the rows run in the order: the
image's own (unit, kata-agent, tools), each step's ``IMAGE_ROWS`` in the step order, then the
refresh units, the trust of the config and tools, and the compiled config."""

from __future__ import annotations

import os

from podvm_gpu import steps, units
from podvm_gpu.check import FAIL, PASS, SKIP, WARN, Check, isolated
from podvm_gpu.check.early import early_clients_check
from podvm_gpu.check.units import (
    UNREAD_HINT,
    kata_cdi_check,
    kata_ordering_check,
    refresh_units_check,
    unread_units,
    watch_unit_check,
)
from podvm_gpu.config.fields import REQUIRED_MODULES
from podvm_gpu.config.load import DEFAULT_PATH as CONFIG_PATH
from podvm_gpu.config.load import config_location
from podvm_gpu.config.model import Config
from podvm_gpu.errors import ConfigError
from podvm_gpu.host import kmod
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner

_BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin")
IMAGE_TOOLS = ("nvidia-ctk", "nvidia-persistenced", "modprobe")


class Image:
    """An image root and what its rows read of it.

    Attributes:
        root, config, runner: the image's root, the config in force, the read-only runner.
        kernels: the image's kernel releases (:func:`image_kernels`).
        found: release -> module name -> :class:`kmod.Resolution`: what ``modprobe nvidia`` and
            ``modprobe nvidia_uvm`` load for each kernel (kmod.py).
    """

    def __init__(self, root: Root, config: Config, runner: Runner):
        self.root, self.config, self.runner = root, config, runner
        self.kernels = image_kernels(root)
        self.found = {k: {m: kmod.resolve(root, k, m, runner) for m in REQUIRED_MODULES}
                      for k in self.kernels}

    def tool(self, name: str) -> str | None:
        """Where boot would run tool ``name`` in this image (host/proc.py ``Runner.which``):
        the config's ``tools:`` path when it names one (there only), else the first of the
        usual program folders; None when it is not an executable there."""
        path = self.config.tools.get(name)
        if path:
            return path if _executable(self.root, path) else None
        return next((f"{d}/{name}" for d in _BIN_DIRS if _executable(self.root, f"{d}/{name}")),
                    None)


def image_kernels(root: Root) -> list[str]:
    """The image's kernels: releases of ``/boot/vmlinuz-*``, else the folders of /lib/modules."""
    boot = root.resolve("/boot")
    try:
        found = sorted(n[len("vmlinuz-"):] for n in os.listdir(boot) if n.startswith("vmlinuz-"))
    except OSError:
        found = []
    if found:
        return found
    try:
        return sorted(os.listdir(root.resolve("/lib/modules")))
    except OSError:
        return []


def unit_row(image: Image) -> Check:
    root = image.root
    unit = units.unit_file(root, units.AGENT_UNIT)
    wants = units.enabled_by(root, units.AGENT_UNIT)
    if unit is None:
        return Check("unit", FAIL, f"{units.AGENT_UNIT} is not installed",
                     "install systemd/podvm-gpu.service into the image")
    if not wants:
        return Check("unit", FAIL, f"{unit} installed but not enabled",
                     f"systemctl enable {units.AGENT_UNIT} in the image")
    late = units.budget_warning(root, image.config.budget_s)
    if late:  # issue 46: systemd would cut the boot before its budget ends
        return Check("unit", WARN, f"{unit}, enabled by {', '.join(wants)}; {late}",
                     "raise TimeoutStartSec in a drop-in of the unit, or lower budget_s")
    return Check("unit", PASS, f"{unit}, enabled by {', '.join(wants)}")


def kata_ordering_row(image: Image) -> Check:
    root = image.root
    if units.unit_file(root, units.KATA_UNIT) is None:
        ok, how = units.ordered_before_kata(root)
        unread = unread_units(root, units.AGENT_UNIT)
        said = f"; not read: {'; '.join(unread[:3])}" if unread else ""
        hints = [] if ok else [f"add Before={units.KATA_UNIT} or the kata-agent drop-in"]
        return Check("kata-agent-ordering", FAIL if not ok else WARN if unread else PASS,
                     f"{units.KATA_UNIT} not in the image yet; {how}{said}",
                     "; ".join(hints + ([UNREAD_HINT] if unread else [])))
    return kata_ordering_check(root)


def _executable(root: Root, host_path: str) -> bool:
    real = root.resolve(host_path)
    return os.path.isfile(real) and os.access(real, os.X_OK)


def tools_row(image: Image) -> Check:
    """The tools found as boot finds them (host/proc.py ``Runner.which``): where the config's
    ``tools:`` names a path, there and only there; otherwise in the usual program folders (an
    image has no ``PATH`` to ask)."""
    found, missing = [], []
    for tool in IMAGE_TOOLS:
        path = image.config.tools.get(tool)
        if image.tool(tool):
            found.append(f"{tool} at {path} (config)" if path else tool)
        else:
            missing.append(f"{tool}: {path} (set in the config) is not an executable" if path else tool)
    if missing:
        return Check("tools", FAIL, f"missing: {', '.join(missing)}",
                     "install nvidia-container-toolkit, the driver's persistenced and kmod, or fix "
                     "the config's tools: paths")
    return Check("tools", PASS, f"{', '.join(found)} present")


def compiled_config_row(image: Image) -> Check:
    """A config in the image should have its current compiled form: without it every CPU pod VM
    parses the YAML at boot (about 20 ms, PyYAML's import); a stale one is ignored (config.py)."""
    from podvm_gpu.config.load import compiled_state

    root = image.root
    try:
        path, present = config_location(root, None)
    except ConfigError as err:  # a link loop, or a link to nothing (config_location)
        return Check("config-compiled", FAIL, f"{err}: boot ends failed on it",
                     "fix the link, or remove it for the defaults")
    if not present:
        return Check("config-compiled", SKIP, f"no {CONFIG_PATH} in the image")
    # the compiled file is beside the config's real path (config --compile writes it there and
    # boot reads it there), which is not beside /etc/podvm-gpu/config.yaml when that is a link
    def inside(host_path: str) -> str:
        return host_path if root.is_host else host_path.replace(root.path, "", 1)

    why = compiled_state(path)
    if why:
        beside_link = root.resolve(CONFIG_PATH, follow_last=False) + ".compiled.json"
        if beside_link != path + ".compiled.json" and os.path.lexists(beside_link):
            why += (f"; {inside(beside_link)} is beside the link, where nothing reads it "
                    "(boot reads the one beside the link's target)")
        return Check("config-compiled", WARN, f"{inside(why)}: boot parses the YAML itself "
                     "(PyYAML, about 20 ms on every CPU pod VM)", "run podvm-gpu config "
                     "--compile in the image after changing the config (the installer does it)")
    return Check("config-compiled", PASS, f"{inside(path)}.compiled.json is current")


def trust_row(image: Image) -> Check:
    """The config file and the tool paths it names must be changeable by root alone: boot
    refuses them otherwise (it runs those tools as root). A file that group or others may
    write fails; one owned by another user only warns, since an image built by an unprivileged
    builder has the builder's files until it is packed (they must be root's in the image)."""
    from podvm_gpu.host.fs import trust_problems

    root, config = image.root, image.config
    paths = [CONFIG_PATH] + sorted(config.tools.values())
    owners = frozenset({0})
    mode, owner = [], []
    for host_path in paths:
        try:
            real = root.resolve(host_path)
        except OSError:
            continue
        if not os.path.lexists(real):
            continue
        for kind, text in trust_problems(real, owners=owners, stop_at=root.path):
            if not root.is_host:  # name the image's folders as the image has them
                text = text.replace(root.path + "/", "/").replace(root.path, "/")
            (mode if kind == "mode" else owner).append(f"{host_path}: {text}")
    if mode:
        return Check("trust", FAIL, "; ".join(mode[:3]), "chmod go-w them: boot refuses a config "
                     "or tool that someone other than root could change")
    if owner:
        return Check("trust", WARN, "; ".join(owner[:3]), "make them root's in the image (an "
                     "unprivileged build owns its files until they are packed): boot refuses "
                     "them otherwise")
    return Check("trust", PASS, "the config and the tools it names are root's alone")


HEAD_ROWS = {
    "unit": unit_row,
    "kata-agent-ordering": kata_ordering_row,
    "kata-agent-cdi": lambda image: kata_cdi_check(
        image.root, units.exec_start(image.root, units.KATA_UNIT), None, None),
    "tools": tools_row,
}
TAIL_ROWS = {
    "cdi-refresh-units": lambda image: refresh_units_check(image.root),
    "early-gpu-clients": lambda image: early_clients_check(
        image.root, image.config.confidential_computing.image_serves),
    "watch": lambda image: watch_unit_check(image.root, vm=False),
    "trust": trust_row,
    "config-compiled": compiled_config_row,
}


def rows() -> dict:
    """Every row of an image in its order: :data:`HEAD_ROWS`, the steps' ``IMAGE_ROWS``, then
    :data:`TAIL_ROWS`."""
    found: dict = dict(HEAD_ROWS)
    for step in steps.step_modules():
        found.update(getattr(step, "IMAGE_ROWS", {}))
    return {**found, **TAIL_ROWS}


def image_checks(root: Root, config: Config, runner: Runner) -> list[Check]:
    """Contract section 6: every row of an image, each on its own (one that raises is a
    ``fail`` row naming the error)."""
    image = Image(root, config, runner)
    return [isolated(name, lambda row=row: row(image)) for name, row in rows().items()]
