"""Running ``nvattest attest`` once, bounded, with the network it needs (../shared/nvattest.md).

The agent's own unit denies IP (``RestrictAddressFamilies=AF_UNIX AF_NETLINK``,
``IPAddressDeny=any``) and the local verifier needs OCSP always, RIMs unless they are in a
directory (nvattest.md 7). So under systemd (host/daemons.py's ``under_systemd``) nvattest runs
in a transient unit of its own, ``podvm-gpu-nvattest-<device>-<pid>.service``, started with
``systemd-run --no-block`` (as the daemons: systemd's private socket, no D-Bus broker needed);
its stdout and stderr go to files systemd opens for it under /run/podvm-gpu, and its exit
status is read with ``systemctl show`` (``RemainAfterExit=yes`` keeps it until the agent has
read it and stopped the unit). The unit wants and is ordered after ``network-online.target``, so
its start waits for the network; that wait counts in the same limit as the run itself. The
unit's sandbox (:data:`UNIT_PROPERTIES`) allows IPv4/IPv6 sockets and nothing the verifier does
not need; ``RuntimeMaxSec=`` kills it at the limit even if the agent is gone, and on the
agent's own time-out the unit is stopped (``systemctl stop``). Outside systemd (the scenario
tests, a chroot) it runs as a child, its process group killed at the limit.

``nvattest`` has no time-out of its own (nvattest.md 8): the limit is the config's
``attestation_timeout_s + attestation_per_device_s * devices``, cut to the boot budget.
"""

from __future__ import annotations

import contextlib
import os
import time

from podvm_gpu.errors import CommandError, one_line
from podvm_gpu.host.proc import Runner

# Why each: docs/install.md, "The nvattest unit". NVML needs /dev/nvidia* (no PrivateDevices=)
# and the driver's attestation-report control (root; the caps the driver checks are kept);
# libcurl needs IPv4/IPv6 to the OCSP and RIM services (AF_UNIX for the resolver via nss).
UNIT_PROPERTIES = (
    "Type=exec", "Wants=network-online.target", "After=network-online.target",
    "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
    "ProtectKernelModules=yes", "ProtectKernelLogs=yes", "ProtectKernelTunables=yes",
    "ProtectControlGroups=yes", "ProtectHostname=yes", "ProtectClock=no", "RestrictNamespaces=yes",
    "RestrictRealtime=yes", "RestrictSUIDSGID=yes", "LockPersonality=yes",
    "SystemCallArchitectures=native",
    "SystemCallFilter=~@clock @cpu-emulation @debug @obsolete @reboot @swap @mount @module "
    "@raw-io @privileged",
    "SystemCallErrorNumber=EPERM",
    "CapabilityBoundingSet=CAP_SYS_ADMIN",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
    "MemoryDenyWriteExecute=yes", "UMask=0077",
)


DESCRIPTION = "NVIDIA attestation (nvattest, started by podvm-gpu)"
_UNIT_KEYS = ("Wants=", "After=")  # [Unit] settings; the rest are [Service]


def unit_file(argv: list[str], runtime_max_s: int) -> str:
    """The transient unit as a unit file (what ``systemctl cat`` shows while it runs), for
    ``systemd-analyze verify/security`` in the tests and for docs/install.md."""
    from shlex import quote

    unit = "\n".join(p for p in UNIT_PROPERTIES if p.startswith(_UNIT_KEYS))
    service = "\n".join(p for p in UNIT_PROPERTIES if not p.startswith(_UNIT_KEYS))
    return (f"[Unit]\nDescription={DESCRIPTION}\n{unit}\n\n[Service]\n"
            f"ExecStart={' '.join(quote(a) for a in argv)}\n{service}\n"
            f"RuntimeMaxSec={runtime_max_s}\n")


POLL_S = 0.1  # one systemctl show each: the unit's end is seen within that
OUTPUT_MAX = 16 << 20  # nvattest's JSON for 8 GPUs is about 100 KB


class Ran:
    """One finished (or ended) nvattest run.

    Attributes:
        argv: nvattest's command line as given (``nvattest attest ...``).
        returncode: its exit status; None when it was ended at the limit or never ran.
        stdout, stderr: what it printed (partial when it was ended).
        duration_s: seconds from start to end.
        where: ``unit <name>`` or ``child``.
        ended: why it was ended or did not run (``timed out after 60 s``), or ``""``.
    """

    __slots__ = ("argv", "returncode", "stdout", "stderr", "duration_s", "where", "ended")

    def __init__(self, argv, returncode, stdout, stderr, duration_s, where, ended=""):
        self.argv, self.returncode, self.stdout, self.stderr = argv, returncode, stdout, stderr
        self.duration_s, self.where, self.ended = duration_s, where, ended


def command(device: str, nonce: str, cc, root=None) -> list[str]:
    """``nvattest attest`` for ``device`` (``gpu``/``nvswitch``) with the nonce (64 hex digits)
    and the config's options (``cc``: the confidential_computing section); the policy file
    and the RIM folder are host paths taken under ``root`` (a :class:`~podvm_gpu.host.fs.Root`,
    ``/`` on a VM)."""
    def under(path: str) -> str:
        return root / path if root is not None else path

    argv = ["nvattest", "attest", "--device", device, "--verifier", "local", "--nonce", nonce,
            "--format", "json"]
    if cc.relying_party_policy:
        argv += ["--relying-party-policy", under(cc.relying_party_policy)]
    if cc.rim_dir:
        argv += ["--rim-store", "dir", "--rim-dir", under(cc.rim_dir)]
    if cc.rim_url:
        argv += ["--rim-url", cc.rim_url]
    if cc.ocsp_url:
        argv += ["--ocsp-url", cc.ocsp_url]
    return argv


def limit_s(cc, devices: int) -> float:
    """The time limit of one run: ``attestation_timeout_s + attestation_per_device_s * devices``."""
    return cc.attestation_timeout_s + cc.attestation_per_device_s * devices


def run(runner: Runner, argv: list[str], limit: float, under_systemd: bool,
        out_dir: str | None = None, check_stop=None) -> Ran:
    """Run nvattest (``argv[0] == "nvattest"``) at most ``limit`` seconds, cut to the budget.

    Args:
        runner: the boot's (or check's) runner.
        argv: ``nvattest attest ...`` (:func:`command`).
        limit: seconds (:func:`limit_s`).
        under_systemd: run it in a transient unit of its own (host/daemons.py's
            ``under_systemd``), else as a child.
        out_dir: the real path of a root-only folder for the unit's stdout and stderr files
            (``/run/podvm-gpu`` under the root); required under systemd.
        check_stop: called between polls of the unit; raises when the boot is ending.

    Raises:
        CommandError: nvattest (or systemd-run) is missing or refused (``tools:`` and the trust
            rules of host/proc.py), cannot start, or systemd-run refused the unit.
        Cancelled: the boot is ending.
    """
    path = runner.which("nvattest")
    if path is None:
        raise CommandError(argv, None, message=runner.why_missing("nvattest"))
    budget = runner.timeout_for("nvattest", limit)
    if budget <= 0:
        return Ran(argv, None, "", "", 0.0, "", "not run: the boot budget is spent (timed out)")
    if not under_systemd:
        return _as_child(runner, argv, limit, budget)
    if runner.which("systemd-run") is None:
        raise CommandError(["systemd-run"], None, message=runner.why_missing("systemd-run") +
                           " (nvattest needs a unit of its own with network)")
    return _in_unit(runner, path, argv, limit, budget, out_dir, check_stop)


def _in_unit(runner: Runner, path: str, argv: list[str], limit: float, budget: float,
             out_dir: str, check_stop) -> Ran:
    """The unit (module docstring): started with ``systemd-run --no-block``, which needs only
    systemd's private socket (``--wait`` and ``--pipe`` need a D-Bus broker, which a minimal
    pod VM image may lack), its stdout and stderr in files systemd opens for it, its end read
    with ``systemctl show`` every :data:`POLL_S`, then the unit stopped (unloaded)."""
    from podvm_gpu.host.daemons import exit_status_of, main_process_gone, unit_properties

    device = argv[argv.index("--device") + 1]
    unit = f"podvm-gpu-nvattest-{device}-{os.getpid()}.service"
    out, err = (os.path.join(out_dir, f".nvattest-{device}.{s}") for s in ("stdout", "stderr"))
    for name in (out, err):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    secs = max(int(budget + 0.999), 1)
    started, since_us = time.monotonic(), time.monotonic_ns() // 1000
    runner.run(["systemd-run", "--no-block", "--quiet", f"--unit={unit}",
                f"--description={DESCRIPTION}",
                *(f"--property={p}" for p in UNIT_PROPERTIES), f"--property=RuntimeMaxSec={secs}",
                "--property=RemainAfterExit=yes", f"--property=StandardOutput=file:{out}",
                f"--property=StandardError=file:{err}", "--", path, *argv[1:]],
               timeout=min(budget, 10.0))
    from podvm_gpu.host.wait import until

    def gone():
        props = unit_properties(runner, unit)
        return props if main_process_gone(props, since_us) else None

    try:
        waited = until(gone, budget - (time.monotonic() - started), POLL_S, check_stop)
    finally:
        if not runner.cancelled:  # stopped (killed at once if it runs), unloaded, forgotten
            runner.run(["systemctl", "stop", unit], check=False, timeout=5.0)
            runner.run(["systemctl", "reset-failed", unit], check=False, timeout=5.0)
    returncode = exit_status_of(waited.value) if waited.held else None
    ended = "" if waited.held else _ended(limit, budget, unit)
    return Ran(argv, returncode, _read(out), _read(err), time.monotonic() - started,
               f"unit {unit}", ended)


def _read(path: str) -> str:
    from podvm_gpu.host.fs import read_bounded

    try:
        text = read_bounded(path, OUTPUT_MAX).decode("utf-8", "replace")
    except OSError:
        return ""
    with contextlib.suppress(OSError):
        os.unlink(path)
    return text


def _as_child(runner: Runner, argv: list[str], limit: float, budget: float) -> Ran:
    started = time.monotonic()
    try:
        done = runner.run(argv, timeout=budget, check=False)
    except CommandError as err:
        if not err.timed_out:
            raise
        return Ran(argv, None, err.stdout or "", err.stderr or "", time.monotonic() - started,
                   "child", _ended(limit, budget, ""))
    return Ran(argv, done.returncode, done.stdout, done.stderr, done.duration_s, "child")


def _ended(limit: float, budget: float, unit: str) -> str:
    where = f" (unit {unit}, waiting for network-online.target counts)" if unit else ""
    if budget < limit:
        return f"timed out after {budget:g} s, killed: the boot budget is spent{where}"
    return f"timed out after {limit:g} s, killed{where}"


def version(runner: Runner, timeout: float = 5.0) -> str | None:
    """nvattest's version (``1.2.2``) from ``nvattest version``, which logs it to stderr at info
    level (nvattest.md 2.1); None when it cannot be read."""
    try:
        done = runner.run(["nvattest", "--log-level", "info", "version"], timeout=timeout,
                          check=False)
    except CommandError:
        return None
    for line in (done.stderr + "\n" + done.stdout).splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nvattest":
            return one_line(words[1], 60)
    return None
