"""Running ``nvattest attest`` once, bounded, with the network it needs (../shared/nvattest.md).

The agent's own unit denies IP (``RestrictAddressFamilies=AF_UNIX AF_NETLINK``,
``IPAddressDeny=any``) and the local verifier needs OCSP always, RIMs unless they are in a
directory (nvattest.md 7). So under systemd (host/daemons.py's ``under_systemd``) nvattest runs
in a transient unit of its own, ``podvm-gpu-nvattest-<device>-<pid>.service``, started with
``systemd-run --wait --pipe --collect``: its stdout and stderr come back through systemd-run,
and so does its exit status. The unit wants and is ordered after ``network-online.target``, so
its start waits for the network; that wait counts in the same limit as the run itself. The
unit's sandbox (:data:`UNIT_PROPERTIES`) allows IPv4/IPv6 sockets and nothing the verifier does
not need; ``RuntimeMaxSec=`` kills it at the limit even if the agent is gone, and on the
agent's own time-out the unit is stopped (``systemctl stop``: systemd-run killed alone would
leave it running). Outside systemd (the scenario tests, a chroot) it runs as a child, its
process group killed at the limit.

``nvattest`` has no time-out of its own (nvattest.md 8): the limit is the config's
``attestation_timeout_s + attestation_per_device_s * devices``, cut to the boot budget.
"""

from __future__ import annotations

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


def run(runner: Runner, argv: list[str], limit: float, under_systemd: bool) -> Ran:
    """Run nvattest (``argv[0] == "nvattest"``) at most ``limit`` seconds, cut to the budget.

    Raises:
        CommandError: nvattest (or systemd-run) is missing or refused (``tools:`` and the trust
            rules of host/proc.py), or cannot start.
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
    unit = f"podvm-gpu-nvattest-{argv[argv.index('--device') + 1]}-{os.getpid()}.service"
    secs = max(int(budget + 0.999), 1)
    wrapped = ["systemd-run", "--wait", "--pipe", "--quiet", "--collect", f"--unit={unit}",
               f"--description={DESCRIPTION}",
               *(f"--property={p}" for p in UNIT_PROPERTIES), f"--property=RuntimeMaxSec={secs}",
               "--", path, *argv[1:]]
    started = time.monotonic()
    try:
        done = runner.run(wrapped, timeout=budget, check=False)
    except CommandError as err:
        if not err.timed_out:
            raise
        runner.run(["systemctl", "stop", unit], check=False, timeout=5.0) \
            if not runner.cancelled else None
        return Ran(argv, None, err.stdout or "", err.stderr or "", time.monotonic() - started,
                   f"unit {unit}", _ended(err, limit, budget, unit))
    return Ran(argv, done.returncode, done.stdout, done.stderr, done.duration_s, f"unit {unit}")


def _as_child(runner: Runner, argv: list[str], limit: float, budget: float) -> Ran:
    started = time.monotonic()
    try:
        done = runner.run(argv, timeout=budget, check=False)
    except CommandError as err:
        if not err.timed_out:
            raise
        return Ran(argv, None, err.stdout or "", err.stderr or "", time.monotonic() - started,
                   "child", _ended(err, limit, budget, ""))
    return Ran(argv, done.returncode, done.stdout, done.stderr, done.duration_s, "child")


def _ended(err: CommandError, limit: float, budget: float, unit: str) -> str:
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
