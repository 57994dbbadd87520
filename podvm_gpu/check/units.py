"""The rows about units in the VM or image that belong to no boot step: the toolkit's CDI
refresh units, kata-agent's ordering after the agent, and what kata-agent does with a GPU request
on a CPU or failed VM (its ``cdi_timeout`` and version, :mod:`podvm_gpu.kata`)."""

from __future__ import annotations

from podvm_gpu import kata, units, watchfile
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


def watch_unit_check(root: Root, vm: bool) -> Check:
    """podvm-gpu-watch.service (issue 34) installed and enabled; on a VM also what the watcher
    says (watch.json): watching, a finding, or not started after a ready boot with GPUs."""
    from podvm_gpu.model import State
    from podvm_gpu.status import read_status

    name, unit = "watch", watchfile.WATCH_UNIT
    install = f"install and enable {unit} (systemd/install-podvm-gpu.sh does)"
    doc = watchfile.load(root) if vm else None
    finding = doc.get("finding") if doc else None
    if finding:  # whatever ran the watcher (the unit, or an engineer by hand)
        return Check(name, FAIL, f"finding: {finding['reason']}", "the GPU failed after boot: "
                     f"replace the VM; once the cause is gone, {watchfile.CLEAR_COMMAND} then "
                     "systemctl restart podvm-gpu podvm-gpu-watch")
    status = (read_status(root) or {}) if vm else {}
    if vm and (status.get("state") != State.READY or not status.get("gpus")):
        return Check(name, SKIP, "nothing to watch: the boot did not end ready with GPUs")
    if units.unit_file(root, unit) is None:
        return Check(name, WARN, f"{unit} is not installed: a GPU that fails after boot stays "
                     "in the spec for every container created after", install)
    if not units.enabled_by(root, unit):
        return Check(name, WARN, f"{unit} installed but not enabled: a GPU that fails after "
                     "boot stays in the spec", f"systemctl enable {unit}")
    if not vm:
        return Check(name, PASS, f"{unit} installed and enabled")
    if doc is None:
        return Check(name, WARN, f"no {watchfile.WATCH_PATH}: the watcher has not started "
                     "after this ready boot", f"systemctl status {unit}")
    warned = doc.get("warnings") or []
    seq = doc.get("kmsg_seq")
    # -1 (or none yet): the watcher's position in a log that held no record when it started
    said = f"watching since {doc.get('started_at')}, " + (
        f"kernel log record {seq}" if isinstance(seq, int) and seq >= 0 else
        "kernel log from its start (no record read yet)")
    hung = doc.get("nvml_hung")
    if hung:  # a warning: a hang is never a finding (interface.md 4.5)
        return Check(name, WARN, f"{said}; NVML clients refused since {hung.get('since')}: an "
                     f"earlier one {hung['what']} (tried again after "
                     f"{hung.get('retry_after_s')} s; one that exits 0 ends it)",
                     "the GPU may be stuck in the driver: dmesg | grep -i nvrm; if it stays, "
                     "replace the VM")
    if warned:
        return Check(name, WARN, f"{said}; {len(warned)} warning(s): {warned[0]['text']}",
                     f"{watchfile.WATCH_PATH} lists them")
    return Check(name, PASS, said)


UNREAD_HINT = ("make each a regular file (or remove it): what it sets cannot be judged, and "
               "systemd reads a unit's files when it loads the unit")


def unread_units(root: Root, *unit_names: str) -> list[str]:
    """Why each file of these units (their files and drop-ins) could not be read, naming it
    (:func:`podvm_gpu.units.unread_files`)."""
    return [why for unit in unit_names for why in units.unread_files(root, unit)]


def _shown(root: Root, texts: list[str]) -> str:
    """At most three of ``texts`` joined, with how many more, the root's path left out."""
    shown = "; ".join(texts[:3]) + (f" (and {len(texts) - 3} more)" if len(texts) > 3 else "")
    return shown if root.is_host else shown.replace(root.path, "")


def kata_ordering_check(root: Root) -> Check:
    """kata-agent.service must start after podvm-gpu.service (ordering, not just a target). A
    file of either unit that cannot be read (a FIFO, a folder, unreadable) is named: ``warn``
    when the ordering is set anyway, in the ``fail`` otherwise (it may be what sets it)."""
    if units.unit_file(root, units.KATA_UNIT) is None:
        return Check("kata-agent-ordering", SKIP, f"no {units.KATA_UNIT} installed")
    ok, how = units.ordered_before_kata(root)
    unread = unread_units(root, units.AGENT_UNIT, units.KATA_UNIT)
    said = f"; not read: {_shown(root, unread)}" if unread else ""
    if not ok:
        return Check("kata-agent-ordering", FAIL, how + said, f"install the drop-in {units.KATA_UNIT}.d/"
                     f"10-podvm-gpu.conf (After= and Wants={units.AGENT_UNIT})"
                     + (f"; {UNREAD_HINT}" if unread else ""))
    if unread:
        return Check("kata-agent-ordering", WARN, how + said, UNREAD_HINT)
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
    unread = unread_units(root, units.KATA_UNIT)
    ignored = kata.ignored_config_arguments(argv or [])
    wait = kata.cdi_wait(root, argv, cmdline)
    if wait.error:
        # the user's own number of seconds where they wrote one (cdi_timeout = 30), not the
        # default in its place (issue 35 item 15)
        secs = wait.written if isinstance(wait.written, int) and not isinstance(wait.written, bool) \
            and 0 <= wait.written <= kata.TOML_INT_MAX else None
        hint = (f"write it as cdi_timeout = {{ secs = {secs if secs is not None else 'N'}, "
                "nanos = 0 }" + ("" if secs is not None else " (N whole seconds; the default is "
                                 f"{kata.DEFAULT_CDI_TIMEOUT_S:g})")
                if "Duration" in wait.error else f"fix {wait.source}")
        return Check(name, FAIL, f"kata-agent will not start: {wait.error}", hint)
    timeout = (f"cdi_timeout {wait.seconds:g} s ({wait.source})" if wait.seconds is not None
               else f"cdi_timeout from {wait.source}")
    if ignored or unread:
        # where its settings come from is said once, in the cdi_timeout part (issue 35 item 15)
        notes = [f"kata-agent does not read {arg} (it reads only --config FILE or -c FILE)"
                 for arg in ignored[:1]]
        notes += [f"not read here: {_shown(root, unread)}; kata-agent's ExecStart= may be "
                  "set there"] if unread else []
        hints = [f"write --config {ignored[0].split('=', 1)[1]} (a space, not =)"] if ignored else []
        hints += [UNREAD_HINT] if unread else []
        return Check(name, WARN, f"{'; '.join(notes)}; {timeout}", "; ".join(hints))
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
