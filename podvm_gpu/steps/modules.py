"""Step 3, ``modules``: load ``nvidia`` (with its parameters), ``nvidia_uvm``, then the optional
modules (``nvidia_modeset``), skipping loaded ones.

A failure names the module and the cause read from modprobe's message, the kernel log and the
system's state: signature/lockdown rejection, a PCI id the driver branch does not support, no
module for the running kernel, another driver owning the device, or modprobe exiting 0 without
the module being loaded (an ``install <module> /bin/true`` line). modprobe failures are
permanent, so nothing is retried, and the modules after a failed one are skipped.
"""

from __future__ import annotations

from podvm_gpu.context import BootContext
from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.host import kmsg
from podvm_gpu.readers import kernel_release, modprobe_overrides, module_kernels, module_loaded

REQUIRED = ("nvidia", "nvidia_uvm")
OPTIONAL = ("nvidia_modeset",)


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


def explain_failure(ctx: BootContext, module: str, err: CommandError) -> str:
    """The cause of a failed ``modprobe <module>``, one line, most specific first."""
    if err.timed_out:
        return f"modprobe {module} timed out after {err.timeout_s:g} s"
    if err.returncode is None:
        return f"cannot load {module}: {err}"
    said = err.said()
    said = said if said.startswith("modprobe:") else f"modprobe: {said}"
    text = f"{err.stderr}\n{err.stdout}"
    lower = text.lower()
    root = ctx.root
    if "operation not permitted" in lower or "key was rejected" in lower \
            or "required key not available" in lower:
        lockdown = lockdown_mode(root.read_text("/sys/kernel/security/lockdown") or "")
        cmdline = root.read_text("/proc/cmdline") or ""
        if lockdown and lockdown != "none":
            policy = f"module signature policy (lockdown={lockdown})"
        elif "sig_enforce=1" in cmdline or "key was rejected" in lower:
            policy = "module signature policy (module.sig_enforce=1)"
        else:
            policy = "the kernel (permission denied)"
        return (f"{module} rejected by {policy}: the module is unsigned or signed with a key the "
                f"kernel does not trust; sign it (MOK/DKMS) or boot without lockdown; {said}")
    release = kernel_release(root)
    if "not found in directory" in lower or "module " + module + " not found" in lower:
        have = [k for k in module_kernels(root, "nvidia") if k != release]
        elsewhere = f"; the image has nvidia modules for {', '.join(have)}" if have else ""
        return (f"no {module} module for the running kernel {release or '(unknown)'}{elsewhere}; "
                f"{said}")
    findings = kmsg.findings(kmsg.read_kernel_log(root))
    for kind in ("unsupported-pci-id", "bound-elsewhere", "open-module-unsupported",
                 "gsp-firmware", "bar", "needs-reset", "fell-off-bus", "lockdown"):
        for f in findings:
            if f.kind == kind:
                return f"{module}: {f.describe()}; {said}"
    return f"{module} failed to load: {said}"


def run(ctx: BootContext) -> str:
    """Load the modules; return which were loaded and which were already there.

    Raises:
        StepFailed: a required module failed to load or is not loaded after modprobe exit 0.
    """
    params = ctx.config.modules.parameters
    optional = set(ctx.config.modules.optional)
    order = [*REQUIRED, *(m for m in OPTIONAL if m in optional)]
    loaded, already = [], []
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
                ctx.warn(f"modules: optional {cause}")
                continue
            rest = order[index + 1:]
            skipped = f" ({', '.join(rest)} skipped)" if rest else ""
            raise StepFailed(cause + skipped) from err
        if not module_loaded(ctx.root, module):
            overrides = modprobe_overrides(ctx.root, module)
            why = f"; modprobe.d overrides it: {'; '.join(overrides)}" if overrides else ""
            cause = f"{module} not loaded although modprobe {module} exited 0{why}"
            if harmless:
                ctx.warn(f"modules: optional {cause}")
                continue
            raise StepFailed(cause)
        loaded.append(module)
    fatal = [f for f in kmsg.findings(kmsg.since_driver_load(kmsg.read_kernel_log(ctx.root)))
             if f.fatal]
    if fatal:
        # Every NVML client would stall or fail on such a GPU; stop before persistenced starts
        # and the waits begin (field case C26).
        raise StepFailed(f"the kernel log reports a GPU error that needs a GPU reset: "
                         f"{fatal[0].describe()}")
    parts = []
    if loaded:
        parts.append("loaded " + ", ".join(loaded))
    if already:
        parts.append("already loaded " + ", ".join(already))
    return "; ".join(parts)
