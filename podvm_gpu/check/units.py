"""The rows about units in the VM or image that belong to no boot step: the toolkit's CDI
refresh units, kata-agent's ordering after the agent, and what kata-agent does with a GPU request
on a CPU or failed VM (its ``cdi_timeout`` and version, :mod:`podvm_gpu.kata`)."""

from __future__ import annotations

from podvm_gpu import kata, units
from podvm_gpu.check import FAIL, PASS, SKIP, WARN, Check
from podvm_gpu.errors import CommandError
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner


def refresh_units_check(root: Root) -> Check:
    """The toolkit's nvidia-cdi-refresh units must not be enabled beside the agent: they rewrite
    /var/run/cdi/nvidia.yaml with nvidia-ctk's output, unvalidated, whenever the driver changes."""
    enabled = [u for u in units.REFRESH_UNITS
               if units.enabled_by(root, u) and not units.masked(root, u)]
    if enabled:
        return Check("cdi-refresh-units", FAIL, f"enabled: {', '.join(enabled)}",
                     "mask them in the image: systemctl mask " + " ".join(units.REFRESH_UNITS))
    masked = [u for u in units.REFRESH_UNITS if units.masked(root, u)]
    return Check("cdi-refresh-units", PASS,
                 f"masked: {', '.join(masked)}" if masked else "not enabled")


def kata_ordering_check(root: Root) -> Check:
    """kata-agent.service must start after podvm-gpu.service (ordering, not just a target)."""
    if units.unit_file(root, units.KATA_UNIT) is None:
        return Check("kata-agent-ordering", SKIP, f"no {units.KATA_UNIT} installed")
    ok, how = units.ordered_before_kata(root)
    if not ok:
        return Check("kata-agent-ordering", FAIL, how, f"install the drop-in {units.KATA_UNIT}.d/"
                     f"10-podvm-gpu.conf (After= and Wants={units.AGENT_UNIT})")
    return Check("kata-agent-ordering", PASS, how)


def kata_agent_version(path: str) -> str | None:
    """``kata-agent --version`` of the VM's kata-agent (it prints and exits before reading any
    setting, main.rs), or None when it cannot say within the harmless-call limit."""
    from podvm_gpu.steps.context import HARMLESS_CALL_S

    runner = Runner({"kata-agent": path}, {"kata-agent": HARMLESS_CALL_S}, read_only=True,
                    trust_tool_paths=True)
    try:
        return runner.run(["kata-agent", "--version"]).stdout
    except CommandError:
        return None


def kata_cdi_check(root: Root, argv: list[str] | None, cmdline: str | None,
                   version_text: str | None) -> Check:
    """What a GPU request meets on a CPU or failed VM, whose spec is the unavailable one
    (kata.py): kata-agent's ``cdi_timeout`` read from where that kata-agent reads it, and
    whether its version fails at once.

    Args:
        root: the VM's or image's root.
        argv: kata-agent's ``ExecStart`` argv (None: none found).
        cmdline: the VM's kernel command line; None for an image (it has none).
        version_text: what ``kata-agent --version`` printed, or None when not run.
    """
    name = "kata-agent-cdi"
    if units.unit_file(root, units.KATA_UNIT) is None:
        return Check(name, SKIP, f"no {units.KATA_UNIT} installed")
    wait = kata.cdi_wait(root, argv, cmdline)
    if wait.error:
        hint = ("write it as cdi_timeout = { secs = 100, nanos = 0 }" if "Duration" in wait.error
                else f"fix {wait.source}")
        return Check(name, FAIL, f"kata-agent will not start: {wait.error}", hint)
    timeout = (f"cdi_timeout {wait.seconds:g} s ({wait.source})" if wait.seconds is not None
               else f"cdi_timeout from {wait.source}")
    found = kata.version(version_text or "")
    if found is None:
        return Check(name, PASS, f"{timeout}; kata-agent's version not known here: 3.32.0 and "
                     "later fail a GPU request on a CPU or failed VM at once, older ones after "
                     "cdi_timeout")
    shown = ".".join(map(str, found))
    if found >= kata.FAILS_AT_ONCE_FROM:
        return Check(name, PASS, f"kata-agent {shown} fails a GPU request on a CPU or failed VM "
                     f"at once (the spec's kind lacks the device); {timeout}")
    return Check(name, WARN, f"kata-agent {shown} waits {timeout} before it fails a GPU request "
                 "on a CPU or failed VM, and its error lacks podvm-gpu's reason",
                 "kata-agent 3.32.0 and later fail at once; podvm-gpu status on the VM says why")
