"""Step 3, ``modules``: load ``nvidia`` (with its parameters), ``nvidia_uvm``, then the optional
modules (``nvidia_modeset``), skipping loaded ones.

``modprobe nvidia`` loads whatever kmod resolves the name to: ``nvidia.ko`` of NVIDIA's packages,
or Debian's ``nvidia-current.ko`` through the ``install`` rules of ``/etc/modprobe.d/nvidia.conf``
(podvm_gpu/host/kmod.py). Either way the kernel lists the module as ``nvidia`` (its internal name),
which is what "loaded" is checked against.

A failure names the module and a cause read from evidence only: modprobe's own message (the
innermost ``could not insert`` line: Debian's install rule adds two lines about itself after it),
the kernel log, and the system's state. Causes of a refused load and their evidence, as the real
kmod 30 and kernel 6.1 of Debian 12 leave it (tests/data/nvidia-535.261.03/):

- kernel lockdown: ``/sys/kernel/security/lockdown`` not ``[none]`` and ``Lockdown: modprobe:
  unsigned module loading is restricted; see man kernel_lockdown.7`` (``Operation not permitted``);
- ``module.sig_enforce=1``: ``Loading of unsigned module is rejected`` (``Key was rejected by
  service``);
- ``module_blacklist=nvidia`` on the kernel command line: ``Module nvidia is blacklisted``
  (``Operation not permitted``); ``modprobe.blacklist=`` does not stop ``modprobe nvidia``;
- ``kernel.modules_disabled=1``: ``/proc/sys/kernel/modules_disabled`` is 1, nothing in the
  kernel log (``Operation not permitted``);
- an ``install nvidia /bin/false`` line: ``Error running install command '/bin/false' for
  module nvidia``;
- no capability to load modules (a container, a unit without ``CAP_SYS_MODULE``): bit 16 missing
  from ``CapEff`` in ``/proc/self/status``.

When none of them is there the reason says so instead of guessing. modprobe failures are
permanent, so nothing is retried, and the modules after a failed one are skipped.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time

from podvm_gpu import readers, steps
from podvm_gpu.config.fields import OPTIONAL_MODULES, REQUIRED_MODULES
from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.gpufacts import kernel
from podvm_gpu.host import kmod, kmsg
from podvm_gpu.host.fs import Root, file_kind
from podvm_gpu.readers import kernel_release, modprobe_overrides, module_kernels, module_loaded
from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, Check
from podvm_gpu.steps.context import BootContext
from podvm_gpu.steps.fabric.fabric_kind import ib_context as _ib_context
from podvm_gpu.steps.fabric.fabric_kind import ib_modules, module_parameters
from podvm_gpu.steps.fabric.fabric_kind import record_ib as _record_ib
from podvm_gpu.steps.modules.attach import attach_cause, cannot_attach
from podvm_gpu.steps.modules.firmware import firmware_image_row

REQUIRED = REQUIRED_MODULES
OPTIONAL = OPTIONAL_MODULES  # the config names which of them to load
CAP_SYS_MODULE = 16  # linux/capability.h
# "modprobe: ERROR: could not insert 'nvidia_current': No such device"
_COULD_NOT_INSERT = re.compile(r"could not insert '(?P<module>[^']+)': (?P<error>.+)$", re.M)
# "modprobe: ERROR: ../libkmod/libkmod-module.c:1047 command_do() Error running install command
# '/bin/false' for module nvidia: retcode 1"
_INSTALL_FAILED = re.compile(r"Error running install command '(?P<command>[^']*)' for module "
                             r"(?P<module>\S+): retcode (?P<rc>\d+)")
_REFUSED = ("operation not permitted", "key was rejected by service", "required key not available")


def modprobe_argv(module: str, parameters: dict[str, object]) -> list[str]:
    """``modprobe <module> KEY=VALUE...``; booleans as 1/0 (module parameters take integers)."""
    def value(v: object) -> str:
        return str(int(v)) if isinstance(v, bool) else str(v)

    return ["modprobe", module, *(f"{k}={value(v)}" for k, v in parameters.items())]


def lockdown_mode(text: str) -> str | None:
    """The active mode in ``/sys/kernel/security/lockdown`` (``none [integrity] confidentiality``)."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def modprobe_said(err: CommandError) -> str:
    """modprobe's own message, one line: the first ``could not insert`` line (the module the
    kernel refused; with Debian's install rules the later lines only report the rule's exit),
    else the last line."""
    text = f"{err.stderr}\n{err.stdout}"
    for line in text.splitlines():
        if _COULD_NOT_INSERT.search(line):
            return line.strip()
    said = err.said()  # its last line; a signal that ended it named first
    return said if said.startswith("modprobe:") else f"modprobe: {said}"


def refusal_evidence(root: Root, messages: list[str], module: str) -> list[str]:
    """What in the system refuses to load ``module`` (see the module docstring): the causes a
    kernel-log line confirms when there are any (the kernel names the one that refused), else
    the states that could refuse it. Empty when nothing is there.

    Args:
        messages: the kernel log (:func:`podvm_gpu.host.kmsg.read_kernel_log`).
        module: the module's name (``nvidia``); the blacklist is matched with ``-``/``_`` alike.
    """
    confirmed: list[str] = []
    alone: list[str] = []
    cmdline = root.read_text("/proc/cmdline") or ""
    lockdown = lockdown_mode(root.read_text("/sys/kernel/security/lockdown") or "")
    lockdown_line = next((f for f in reversed(kernel.findings(messages)) if f.kind == "lockdown"), None)
    if lockdown_line:
        confirmed.append(f"{kernel.describe(lockdown_line)}, lockdown={lockdown or '?'}")
    elif lockdown and lockdown != "none":
        alone.append(f"kernel lockdown={lockdown} (/sys/kernel/security/lockdown)")
    sig_line = next((m for m in reversed(messages) if re.match(r"Loading of .{1,80} is rejected", m)),
                    None)
    enforced = ((root.read_text("/sys/module/module/parameters/sig_enforce") or "").strip() == "Y"
                or re.search(r"(?:^|\s)module\.sig_enforce=(?:1|y|Y)\b", cmdline) is not None)
    if sig_line:
        confirmed.append(f"module signature enforcement rejects it (kernel: \"{sig_line}\")")
    elif enforced:
        alone.append("module.sig_enforce=1 (modules need a signature the kernel trusts)")
    wanted = kmod.norm(module)
    blacklist_line = next((m for m in reversed(messages)
                           if re.fullmatch(rf"Module {re.escape(wanted)} is blacklisted", kmod.norm(m))), None)
    listed = [name for value in re.findall(r"(?:^|\s)module_blacklist=(\S+)", cmdline)
              for name in value.split(",") if kmod.norm(name) == wanted]
    if blacklist_line:
        confirmed.append(f"module_blacklist= on the kernel command line (kernel: \"{blacklist_line}\")")
    elif listed:
        alone.append(f"module_blacklist={listed[0]} on the kernel command line")
    if (root.read_text("/proc/sys/kernel/modules_disabled") or "").strip() == "1":
        alone.append("kernel.modules_disabled=1 (no module can be loaded until reboot)")
    caps = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", root.read_text("/proc/self/status") or "", re.M)
    if caps and not int(caps.group(1), 16) >> CAP_SYS_MODULE & 1:
        alone.append("this process lacks CAP_SYS_MODULE (CapEff in /proc/self/status)")
    return confirmed or alone


def explain_failure(ctx: BootContext, module: str, err: CommandError) -> str:
    """The cause of a failed ``modprobe <module>``, one line, most specific first (see the module
    docstring for the evidence each cause needs)."""
    if err.timed_out:
        return f"modprobe {module} timed out after {err.timeout_s:g} s"
    if err.held_open:
        return str(err)
    if err.returncode is None:
        if ctx.runner.which("modprobe") is None:
            return missing_modprobe(ctx, module)
        return f"cannot load {module}: {err}"
    said = modprobe_said(err)
    text = f"{err.stderr}\n{err.stdout}"
    lower = text.lower()
    root = ctx.root
    release = kernel_release(root)
    if "not found in directory" in lower or "module " + module + " not found" in lower:
        return f"{not_found_cause(root, release, module)}; {said}"
    install = _INSTALL_FAILED.search(text)
    if install and not _COULD_NOT_INSERT.search(text.split(install.group(0))[0]):
        rule = kmod.read_resolve(root, release, module).blocked if release else None
        where = f" ({rule})" if rule else ""
        return (f"modprobe.d runs '{install.group('command').strip()}' instead of loading {module}"
                f"{where}; modprobe: {install.group(0)}")
    messages = kmsg.read_kernel_log(root)
    insert = _COULD_NOT_INSERT.search(text)
    if insert and insert.group("error").strip().lower() in _REFUSED:
        evidence = refusal_evidence(root, messages, module)
        if evidence:
            return f"{module} refused: {'; '.join(evidence)}; {said}"
        return (f"{module} refused, and none of kernel lockdown, module.sig_enforce, "
                f"module_blacklist=, kernel.modules_disabled or a missing CAP_SYS_MODULE shows why; "
                f"{said}")
    findings = kernel.findings(messages)
    decompress = next((f for f in reversed(findings) if f.kind == "decompress-failed"), None)
    if decompress:
        return f"{module}: {kernel.describe(decompress)}; {decompress_hint(decompress)}; {said}"
    for kind in ("unsupported-pci-id", "bound-elsewhere", "open-module-unsupported", "gsp-firmware",
                 "bar", "needs-reset", "fell-off-bus", "lockdown", "no-device"):
        for f in reversed(findings):
            if f.kind == kind:
                return f"{module}: {kernel.describe(f)}; {said}"
    return f"{module} failed to load: {said}"


def _optional(module: str, cause: str) -> str:
    """The warning for an optional module that did not load: named as optional, its cause, and
    the other fix, leaving it out ("modules: optional cannot load ...", issue 35 item 11)."""
    return (f"modules: optional module {module} not loaded ({cause}); if it is not needed, take "
            f"{module} out of modules.optional")


def missing_modprobe(ctx: BootContext, module: str) -> str:
    """Why ``modprobe <module>`` never ran: the tool is not where boot looks, with where that
    is and the fix. Boot looks only on its PATH (host/proc.py ``Runner.which``; under its unit
    systemd's default PATH, the folders ``check --image`` looks in: docs/interface.md 5.2),
    or at the config's ``tools.modprobe``."""
    why = ctx.runner.why_missing("modprobe")
    where = "" if ctx.runner.tool_paths.get("modprobe") else \
        f" (PATH={ctx.runner.env.get('PATH', os.defpath)})"
    return (f"cannot run modprobe {module}: {why}{where}: install kmod, or name modprobe in "
            "tools.modprobe")


# xz_dec's status codes (include/linux/xz.h): 6 is XZ_OPTIONS_ERROR, which the kernel's xz (built
# without XZ_DEC_ANY_CHECK) returns for a check type other than none or CRC32, e.g. the CRC64 that
# user-space xz writes by default (ublue-os/akmods#318, NixOS/nixpkgs#549398).
XZ_OPTIONS_ERROR = 6


def decompress_hint(finding) -> str:
    """What to do about a module the kernel could not decompress (``decompress-failed``)."""
    status = finding.what.rsplit("status ", 1)[-1].rstrip(")")
    if status == str(XZ_OPTIONS_ERROR) and not finding.evidence.lower().startswith(("zstd", "gzip")):
        return ("xz status 6 is XZ_OPTIONS_ERROR: the .ko.xz uses a check type the kernel's "
                "in-kernel decompressor does not take (user-space xz writes CRC64 by default); "
                "recompress it with xz --check=crc32, or use zstd")
    return "recompress the module with a format and options this kernel decompresses"


def not_found_cause(root: Root, release: str, module: str) -> str:
    """Why kmod finds no ``module``: a file that holds it but that modprobe does not reach
    (:func:`podvm_gpu.host.kmod.unreached`), or no module for this kernel at all (and the kernels
    that have one)."""
    why = kmod.unreached(root, release, module) if release else None
    if why:
        return f"no {module} module that modprobe can find for the running kernel {release}: {why}"
    have = [k for k in module_kernels(root, "nvidia") if k != release]
    elsewhere = f"; the image has nvidia modules for {', '.join(have)}" if have else ""
    return f"no {module} module for the running kernel {release or '(unknown)'}{elsewhere}"


def run(ctx: BootContext) -> str:
    """Load the modules; return which were loaded and which were already there.

    Raises:
        StepFailed: a required module failed to load or is not loaded after modprobe exit 0.
    """
    params, nvlink_note = module_parameters(ctx)
    optional = set(ctx.config.modules.optional)
    order = [*REQUIRED, *(m for m in OPTIONAL if m in optional), *ib_modules(ctx)]
    loaded, already = [], []
    ib_started = time.monotonic()
    for index, module in enumerate(order):
        if module_loaded(ctx.root, module):
            already.append(module)
            continue
        harmless = module in optional and module not in REQUIRED
        try:
            ctx.runner.run(modprobe_argv(module, params.get(module, {})),
                           timeout=ctx.harmless_timeout("modprobe") if harmless else None)
        except CommandError as err:
            cause = explain_failure(ctx, module, err)
            if harmless and not err.budget_spent:
                ctx.warn(_optional(module, cause))
                continue
            rest = order[index + 1:]
            skipped = f" ({', '.join(rest)} skipped)" if rest else ""
            _record_ib(ctx, module, "failed", cause, ib_started)
            raise StepFailed(_ib_context(ctx, module) + cause + skipped) from err
        if not module_loaded(ctx.root, module):
            overrides = modprobe_overrides(ctx.root, module)
            why = f"; modprobe.d overrides it: {'; '.join(overrides)}" if overrides else ""
            cause = f"{module} not loaded although modprobe {module} exited 0{why}"
            if harmless:
                ctx.warn(_optional(module, cause))
                continue
            _record_ib(ctx, module, "failed", cause, ib_started)
            raise StepFailed(_ib_context(ctx, module) + cause)
        loaded.append(module)
    if ib_modules(ctx):
        _record_ib(ctx, None, "ok", "loaded or already loaded: " + ", ".join(ib_modules(ctx)),
                   ib_started)
    fatal = [f for f in kernel.findings(kmsg.since_driver_load(kmsg.read_kernel_log(ctx.root)))
             if f.fatal]
    cause = attach_cause(ctx.root, kmsg.read_kernel_log(ctx.root))
    if fatal and "firmware loader" not in (cause or ""):  # issue 28: the loader is the cause
        # Every NVML client would stall or fail on such a GPU; stop before persistenced starts
        # and the waits begin (field case C26).
        if fatal[0].kind == "early-client":  # issue 46: no reset brings the lost GPUs back
            raise StepFailed(kernel.describe(fatal[0]))
        raise StepFailed(f"the kernel log reports a GPU error that needs a GPU reset: "
                         f"{kernel.describe(fatal[0])}")
    if cause:
        # Loaded, but it failed to attach a GPU (an earlier client, a udev autoload): every NVML
        # client after it fails with words of its own; the driver's are the cause.
        raise StepFailed(f"the driver loaded but cannot attach the GPU: {cause}")
    parts = [nvlink_note] if nvlink_note else []
    if loaded:
        parts.append("loaded " + ", ".join(loaded))
    if already:
        parts.append("already loaded " + ", ".join(already))
    if ctx.config.modules.lock_after_boot:
        parts.append(lock_module_loading(ctx.root))
    return "; ".join(parts)


MODULES_DISABLED = "/proc/sys/kernel/modules_disabled"


def lock_module_loading(root: Root) -> str:
    """Write 1 to ``kernel.modules_disabled`` (modules.lock_after_boot): after the last module
    the boot loads (this step's; no later step loads one), before kata-agent starts, so nothing
    in a container can load a module until reboot (as NVRC does). The kernel allows only 0 -> 1
    (Documentation/admin-guide/sysctl/kernel.rst).

    Raises:
        StepFailed: the write failed (the config asked for the lock: the boot fails closed).
    """
    if (root.read_text(MODULES_DISABLED) or "").strip() == "1":
        return f"module loading already locked ({MODULES_DISABLED} is 1)"
    try:  # never waits on a FIFO put there: what is not a regular file fails closed, by name
        path = root.resolve(MODULES_DISABLED)
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"it is {file_kind(mode)}, not a regular file")
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.write(fd, b"1\n")
        finally:
            os.close(fd)
    except OSError as err:
        raise StepFailed(f"cannot lock module loading (modules.lock_after_boot): writing 1 to "
                         f"{MODULES_DISABLED} failed: {err.strerror or err}") from err
    return f"module loading locked ({MODULES_DISABLED} = 1, modules.lock_after_boot)"


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the modprobe of every module wanted and not loaded."""
    cfg = ctx.config
    params = module_parameters(ctx)[0]
    wanted = [*REQUIRED, *(m for m in OPTIONAL if m in cfg.modules.optional), *ib_modules(ctx)]
    return [modprobe_argv(m, params.get(m, {})) for m in wanted
            if not module_loaded(ctx.root, m)]


# --- podvm-gpu check ----------------------------------------------------------------------

def modules_row(facts) -> Check:
    skip = facts.not_reached("modules")
    if skip:
        return skip
    if not facts.gpus:
        return Check("modules", SKIP, NO_GPU)
    root = facts.root
    missing = [m for m in REQUIRED if not readers.module_loaded(root, m)]
    if not missing:
        version = readers.kernel_module_version(root) or "unknown version"
        cause = cannot_attach(root, facts.messages)  # as the boot's modules step says it
        if cause:
            return Check("modules", FAIL, f"nvidia {version} and nvidia_uvm loaded, but the "
                         f"driver cannot attach the GPU: {cause}", "fix what the kernel log "
                         "names, then restart the VM (the GPU needs a reset)")
        return Check("modules", PASS, f"nvidia {version} and nvidia_uvm loaded")
    release = readers.kernel_release(root)
    detail = f"{', '.join(missing)} not loaded"
    resolved = [kmod.resolve(root, release, m, facts.runner) for m in missing] if release else []
    lost = [r for r in resolved if not r.found and not r.blocked]
    if release and lost:
        return Check("modules", FAIL, f"{detail}: "
                     f"{not_found_cause(root, release, lost[0].name)}",
                     f"install the nvidia modules for kernel {release} (DKMS or a prebuilt "
                     "package) and the modprobe.d rules of the driver package, or boot the "
                     "kernel the image has modules for")
    overrides = [o for m in missing for o in readers.modprobe_overrides(root, m)]
    if overrides:
        return Check("modules", FAIL, f"{detail}: modprobe.d overrides it: {'; '.join(overrides)}",
                     "remove that line from the image, then reboot")
    evidence = refusal_evidence(root, facts.messages, "nvidia")
    if evidence:
        return Check("modules", FAIL, f"{detail}: loading refused: {'; '.join(evidence)}",
                     "sign the nvidia modules with a key the kernel trusts (MOK), or boot "
                     "without what refuses them")
    found = kernel.findings(facts.messages)
    decompress = next((f for f in reversed(found) if f.kind == "decompress-failed"), None)
    if decompress:
        return Check("modules", FAIL, f"{detail}: {kernel.describe(decompress)}",
                     decompress_hint(decompress))
    for f in reversed(found):
        if f.kind in ("unsupported-pci-id", "open-module-unsupported", "gsp-firmware", "bar",
                      "needs-reset", "fell-off-bus", "bound-elsewhere", "no-device"):
            hint = ("install a driver branch that supports this GPU" if f.kind ==
                    "unsupported-pci-id" else "see the kernel message; fix the VM or image")
            return Check("modules", FAIL, f"{detail}: {kernel.describe(f)}", hint)
    return Check("modules", FAIL, detail, "run 'modprobe nvidia' and read the kernel log")


def module_lock_row(facts) -> Check:
    """Whether module loading is locked (``kernel.modules_disabled``), and whether the config
    asks for it (``modules.lock_after_boot``: the boot locks it after its last modprobe)."""
    asked = facts.config.modules.lock_after_boot
    value = (facts.root.read_text(MODULES_DISABLED) or "").strip()
    wants = f"modules.lock_after_boot is {'true' if asked else 'false'}"
    if value == "1":
        by = "" if asked else " (not by podvm-gpu): no module can load until reboot"
        return Check("module-lock", PASS, f"module loading locked ({MODULES_DISABLED} is 1){by}; "
                     f"{wants}")
    if not asked:
        said = f"module loading not locked ({MODULES_DISABLED} is 0)" if value == "0" else \
            f"{MODULES_DISABLED} is not readable"
        return Check("module-lock", PASS if value == "0" else SKIP, f"{said}; {wants} (the default)")
    order = steps.GPU_STEPS
    if not facts.gpus or facts.failed_at and order.index(facts.failed_at) <= order.index("modules"):
        why = NO_GPU if not facts.gpus else f"the last boot failed at {facts.failed_at}"
        return Check("module-lock", SKIP, f"not locked: {why}, and the boot locks module loading "
                     f"after it loads the GPU's modules; {wants}")
    return Check("module-lock", FAIL, f"{wants} but {MODULES_DISABLED} is {value or 'unreadable'}: "
                 "module loading is not locked", "see the modules step in podvm-gpu status; "
                 f"the unit must allow the write (ReadWritePaths={MODULES_DISABLED})")


VM_ROWS = {"modules": modules_row, "module-lock": module_lock_row}


def modules_image_row(image) -> Check:
    root, kernels, found = image.root, image.kernels, image.found
    if not kernels:
        return Check("modules", FAIL, "no kernel in the image (/boot/vmlinuz-*, /lib/modules)", "install a kernel")
    unread = sorted({why for k in kernels for res in found[k].values() for why in res.unread})
    if unread:  # a FIFO, a device or a folder named *.conf in a modprobe.d folder
        more = f" (and {len(unread) - 3} more)" if len(unread) > 3 else ""
        return Check("modules", FAIL, f"{'; '.join(unread[:3])}{more}: kmod reads every *.conf "
                     "file of the modprobe.d folders, so what modprobe nvidia does cannot be "
                     "judged", "make it a regular file or remove it from the image")
    for release in kernels:
        for name, res in found[release].items():
            if res.blocked:
                return Check("modules", FAIL, f"kernel {release}: modprobe {name} loads nothing: "
                             f"{res.blocked}", "remove that line from the image")
    for release in kernels:
        for name, res in found[release].items():
            gone = kmod.absent_file(root, res)
            if gone:
                return Check("modules", FAIL, f"kernel {release}: modprobe {name} reaches {gone}",
                             f"run depmod {release} in the image after removing or rebuilding "
                             "modules, or install the module again (dkms install, or the "
                             "driver package)")
    lacking = [(k, name) for k in kernels for name, res in found[k].items() if not res.found]
    if lacking:
        release, name = lacking[0]
        why = kmod.unreached(root, release, name)
        if why:
            return Check("modules", FAIL, f"kernel {release}: modprobe {name} finds no module: {why}",
                         f"run depmod {release} in the image" if "depmod" in why else
                         "install the driver package's modprobe.d rules (Debian: "
                         "/etc/modprobe.d/nvidia.conf, set up with libcuda1) or add "
                         f"'install {name} modprobe -i <file name> $CMDLINE_OPTS'")
        kernels_lacking = sorted({k for k, _ in lacking})
        # a DKMS build that failed (or never ran) says why: dkms.py reads its tree (imported
        # here: only check --image needs it, not the boot's import cost)
        from podvm_gpu.steps.modules import dkms

        reason, hint = dkms.why_not_built(root, kernels_lacking) or (
            "", "build the nvidia modules (DKMS) for every kernel in the image")
        return Check("modules", FAIL, f"no {name} module for kernel(s) {', '.join(kernels_lacking)} "
                     f"(/lib/modules/{release})" + (f": {reason}" if reason else ""), hint)
    if kmod.unindexed(root, kernels):  # an image is finished: no fallback (boot keeps its own)
        return Check("modules", FAIL, *kmod.unindexed(root, kernels))

    def shown(res: kmod.Resolution) -> str:
        via = f" via {res.rules[0].split(': ', 1)[-1]}" if res.rules else ""
        return f"{res.file}{via}" if res.file else "built in"

    return Check("modules", PASS, "; ".join(
        f"{k}: nvidia -> {shown(found[k]['nvidia'])}" for k in kernels) +
        f" ({next(iter(found[kernels[0]].values())).source})")


def compression_image_row(image) -> Check:
    """``module-compression``: what each kernel's decompressor takes (podvm_gpu/steps/modules/modcompress.py)."""
    from podvm_gpu.steps.modules import modcompress

    return modcompress.compression_image_row(image)


def flavour_image_row(image) -> Check:
    """``module-flavour``: open or proprietary (podvm_gpu/steps/modules/flavour.py, issue 46)."""
    from podvm_gpu.steps.modules import flavour

    return flavour.module_flavour_image_row(image)


IMAGE_ROWS = {"modules": modules_image_row, "module-flavour": flavour_image_row,
              "firmware": firmware_image_row, "module-compression": compression_image_row}
