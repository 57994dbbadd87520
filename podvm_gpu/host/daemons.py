"""Starting nvidia-persistenced and nv-fabricmanager so that they outlive the boot, whatever its
outcome, and telling how they are doing.

Under systemd (PID 1: ``/run/systemd/system`` exists, sd_booted(3)) each daemon runs in a
transient unit of its own, started with ``systemd-run --no-block``: systemd supervises it, stops
it cleanly at shutdown (a transient unit has the default dependencies, ``Conflicts=`` and
``Before=shutdown.target``), keeps its stdout, stderr and syslog lines in its own journal, and
gives it a sandbox that fits it (:data:`DAEMONS`) rather than the agent's. The agent's unit can
then fail, be stopped or restarted without touching it: before, the daemons lived in
podvm-gpu.service's cgroup, and systemd sent them SIGTERM when a failed boot left the unit
failed, killing a persistenced still attaching confidential-computing GPUs (which then need a
GPU reset). Both daemons fork and their parent exits when initialisation is done (nvidia-
persistenced waits on a pipe for its child to finish attaching the GPUs), so the units are
``Type=forking`` with ``TimeoutStartSec=infinity``: no systemd start time-out may ever kill a
daemon mid-attach; the agent's own bounded wait decides how long the boot waits.

The decision is made by whether systemd runs the machine, not by ``--root``: the boot tests
run the agent on a fake root under a real systemd. Without systemd (the scenario tests, image
builds in a chroot) a daemon is spawned detached in a session of its own, as before; so it is
when systemd is PID 1 but ``systemd-run`` is missing (with a warning: it then lives and dies
with the agent's unit). ``PODVM_GPU_SUPERVISOR=spawn|systemd`` forces one way (tests).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

from podvm_gpu.errors import CommandError, one_line
from podvm_gpu.host.proc import Runner
from podvm_gpu.record import REQUIRED, Record

SD_BOOTED_DIR = "/run/systemd/system"


class DaemonUnit(Record):
    """How one daemon runs under systemd.

    Attributes:
        tool: the daemon's command name (``nvidia-persistenced``).
        unit: the transient unit's name.
        description: the unit's Description=.
        properties: unit settings (``Key=value``) beyond Type= and the time-outs: the
            sandbox, chosen for what the real daemon does (docs/install.md, "The daemons' units").
        unit_type: ``forking`` (a daemon whose parent exits once it is initialised) or
            ``exec`` (one that stays in the foreground, NVLSM with ``-f stdout``: systemd
            reports the start once the program is executed; its readiness is the agent's own
            check, podvm_gpu/steps/fabric/nvl5.py).
    """

    FIELDS = (("tool", REQUIRED), ("unit", REQUIRED), ("description", REQUIRED),
              ("properties", REQUIRED), ("unit_type", "forking"))

    def settings(self) -> list[str]:
        """Every setting the unit gets, in order."""
        # RemainAfterExit: a daemon whose first process exits 0 without leaving a daemon (an
        # option it does not know) leaves its unit "active (exited)" to be read, instead of
        # an inactive unit that systemd unloads at once
        return [f"Type={self.unit_type}", "TimeoutStartSec=infinity", "TimeoutStopSec=30",
                "Restart=no", "RemainAfterExit=yes", *self.properties]

    def unit_file(self, argv: list[str]) -> str:
        """The unit as a unit file (what ``systemctl cat`` shows for the transient unit), for
        ``systemd-analyze verify/security`` in the tests and for docs/install.md."""
        from shlex import quote

        service = "\n".join(self.settings())
        return (f"[Unit]\nDescription={self.description}\n\n[Service]\n"
                f"ExecStart={' '.join(quote(a) for a in argv)}\n{service}\n")


# Settings both daemons need the same way. Why each: docs/install.md, "The daemons' units".
_COMMON = (
    "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes", "ProtectControlGroups=yes", "ProtectHostname=yes",
    "RestrictNamespaces=yes", "RestrictRealtime=yes", "RestrictSUIDSGID=yes",
    "LockPersonality=yes", "SystemCallArchitectures=native",
    "SystemCallFilter=~@clock @cpu-emulation @debug @obsolete @reboot @swap @mount @module "
    "@raw-io",
    "SystemCallErrorNumber=EPERM",
)
PERSISTENCED = DaemonUnit(
    tool="nvidia-persistenced", unit="podvm-gpu-persistenced.service",
    description="NVIDIA Persistence Daemon (started by podvm-gpu)",
    properties=(*_COMMON,
                # --user drops to its own user: chown of its run directory, setuid/setgid;
                # the driver's privileged controls check CAP_SYS_ADMIN
                "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER "
                "CAP_SETUID CAP_SETGID",
                # its socket and pid file live in /var/run/nvidia-persistenced (/run); on
                # Grace-based GPUs it onlines GPU memory through memory hotplug in sysfs, which
                # ProtectKernelTunables= makes read-only with the rest of /sys: that one
                # folder is opened again (the qemu boot test writes there from the unit)
                "ProtectKernelTunables=yes",
                "ReadWritePaths=/run -/sys/devices/system/memory",
                # RPC over its unix socket and syslog only
                "PrivateNetwork=yes", "RestrictAddressFamilies=AF_UNIX AF_NETLINK",
                "PrivateTmp=yes"))
FABRICMANAGER = DaemonUnit(
    tool="nv-fabricmanager", unit="podvm-gpu-fabricmanager.service",
    description="NVIDIA Fabric Manager (started by podvm-gpu)",
    properties=(*_COMMON,
                "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_DAC_OVERRIDE CAP_FOWNER CAP_IPC_LOCK",
                # its log (/var/log/fabricmanager.log), its state and pid files; its default
                # state file is in /tmp, which must survive a restart of the daemon: no
                # PrivateTmp= (a private /tmp is deleted with the unit)
                "ReadWritePaths=/run -/var/log -/tmp", "StateDirectory=nvidia-fabricmanager",
                "ProtectKernelTunables=yes", "PrivateTmp=no",
                # its clients (nvidia-smi, NVML) reach it on 127.0.0.1:6666
                "RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6",
                "IPAddressDeny=any", "IPAddressAllow=localhost"))
# NVLSM, the NVLink subnet manager of NVLink 5 boards: an OpenSM derivative (the FM user guide,
# "What is NVLink Subnet Manager?"). What such a daemon opens and writes, from Debian's opensm
# 3.3.23 (its opensm@.service runs it Type=simple; its paths): the management datagram nodes
# /dev/infiniband/umad* and issm* (read-write), its config (read), its log and cache under
# /var/log and /var/cache/opensm, here also its pid file and the fm_sm_ipc.socket it serves the
# fabric manager on under /run. No network address family: it speaks MADs through umad, and to
# the fabric manager over the unix socket. The unit is Type=exec: NVLSM stays in the foreground.
NVLSM = DaemonUnit(
    tool="nvlsm", unit="podvm-gpu-nvlsm.service",
    description="NVIDIA NVLink Subnet Manager (started by podvm-gpu)", unit_type="exec",
    properties=(*_COMMON,
                "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_DAC_OVERRIDE CAP_IPC_LOCK CAP_NET_ADMIN",
                "ReadWritePaths=/run -/var/log -/var/cache", "ProtectKernelTunables=yes",
                "DevicePolicy=closed", "DeviceAllow=char-infiniband_mad rw",
                "DeviceAllow=char-infiniband_verbs rw",
                "PrivateNetwork=yes", "RestrictAddressFamilies=AF_UNIX AF_NETLINK",
                "PrivateTmp=yes"))
DAEMONS = {d.tool: d for d in (PERSISTENCED, FABRICMANAGER, NVLSM)}


def under_systemd() -> bool:
    """True when systemd is PID 1 (sd_booted(3): ``/run/systemd/system`` exists on the real
    file system, never under ``--root``), unless ``PODVM_GPU_SUPERVISOR`` says otherwise."""
    forced = os.environ.get("PODVM_GPU_SUPERVISOR", "")
    if forced in ("spawn", "systemd"):
        return forced == "systemd"
    return os.path.isdir(SD_BOOTED_DIR)


# A forking daemon's first process exits 0 once the daemon has started (nvidia-persistenced's
# waits for its child's initialisation); a daemon whose child writes its pid file a moment after
# gets this long before an exit 0 with no daemon counts as a refusal to start (boot's
# persistenced step and the watcher's restart).
STARTED_GRACE_S = 0.5


class Daemon:
    """A started (or found) daemon the boot waits on: has it exited, and what did it say."""

    where = ""
    _exited_0: float | None = None  # when exited_0_for first saw an exit 0 (monotonic)

    def exit_status(self) -> int | None:
        """None while it runs or initialises; its exit status once it has exited (0 for a daemon
        whose first process handed over to the daemon and left, as a forking daemon does)."""
        raise NotImplementedError

    def last_words(self) -> str:
        """Its last messages, one line (``""`` when there are none)."""
        raise NotImplementedError

    def exited_0_for(self) -> float:
        """Seconds since this was first asked while the daemon's first process had exited 0
        (a forking daemon's hands over so, and one that refuses to start exits 0 too); 0.0
        while it runs or when it exited otherwise. The caller asks only while no daemon names
        itself, and reads :data:`STARTED_GRACE_S` of them as a refusal to start."""
        if self.exit_status() != 0:
            return 0.0
        self._exited_0 = self._exited_0 or time.monotonic()
        return time.monotonic() - self._exited_0


class SpawnedDaemon(Daemon):
    """A daemon spawned detached (no systemd), its output in a log file under /run/podvm-gpu."""

    def __init__(self, proc: subprocess.Popen, log_path: str):
        self.proc, self.log_path = proc, log_path
        self.where = f"pid {proc.pid}, output in {os.path.basename(log_path)}"

    def exit_status(self) -> int | None:
        return self.proc.poll()

    def last_words(self) -> str:
        from podvm_gpu.host.fs import open_regular

        try:  # its last 64 KiB; a FIFO put in its place is not waited on
            with open_regular(self.log_path) as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
                text = f.read(65536).decode("utf-8", errors="replace")
        except OSError:
            return ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        # as summarize_journal: the last 3, each one bounded line
        return "; ".join(dict.fromkeys(one_line(line) for line in lines[-3:]))


class UnitDaemon(Daemon):
    """A daemon in its transient unit; its state from ``systemctl show``, its messages from
    its journal, since the moment the boot started it."""

    _POLL_S = 0.5  # systemctl costs a process; the readiness check itself is cheaper

    def __init__(self, runner: Runner, spec: DaemonUnit, since: float, since_us: int = 0):
        self.runner, self.spec, self.since, self.since_us = runner, spec, since, since_us
        self.where = f"unit {spec.unit}"
        self._checked = 0.0
        self._status: int | None = None

    def exit_status(self) -> int | None:
        if self._status is not None or time.monotonic() - self._checked < self._POLL_S:
            return self._status
        self._checked = time.monotonic()
        props = unit_properties(self.runner, self.spec.unit)
        if main_process_gone(props, self.since_us):
            self._status = exit_status_of(props)
        return self._status

    def last_words(self) -> str:
        return journal_lines(self.runner, self.spec.unit, self.spec.tool, self.since)


def main_process_gone(props: dict[str, str], since_us: int = 0) -> bool:
    """Whether a daemon's unit (its ``systemctl show``) has no daemon any more: failed, stopped
    after it ran, or active with only RemainAfterExit's record left ("exited"), for a run whose
    main process started at ``since_us`` (CLOCK_MONOTONIC, microseconds, as systemd counts) or
    later. A unit whose start job is still queued (systemd-run --no-block) has not run yet, and
    the record of an earlier run of the same name is not this one's."""
    # InactiveExit, not ExecMainStart: a forking daemon's first process is the unit's control
    # process (the ExecMain* fields stay 0 when no daemon remained)
    started = props.get("InactiveExitTimestampMonotonic", "0")
    if not started.isdigit() or int(started) == 0 or int(started) < since_us:
        return False
    state, sub = props.get("ActiveState"), props.get("SubState")
    return state in ("failed", "inactive") or state == "active" and sub == "exited"


# ``systemctl show``'s ExecStart record ends ``code=exited ; status=1 }`` or, for a process a
# signal ended, ``code=killed ; status=9/KILL }`` (systemctl's exec-status printer, systemd
# 245-257); ExecMainCode is the waitid() si_code: 1 exited, 2 killed, 3 dumped core.
_EXEC_RECORD = re.compile(r"\bcode=(\w+) ; status=(\d+)")
_SIGNALLED = ("killed", "dumped")
_MAIN_CODES = {"1": "exited", "2": "killed", "3": "dumped"}


def _returncode(code: str, status: str) -> int:
    """Popen's convention: the exit status, or minus the signal number."""
    return -int(status) if code in _SIGNALLED else int(status)


def exit_status_of(props: dict[str, str]) -> int:
    """How a daemon unit's processes ended, in Popen's convention (``-9``: killed by SIGKILL).

    The first process (``ExecStart``'s record: a forking daemon's control process) decides when
    it failed or a signal ended it; then the main process (``ExecMainCode``/``ExecMainStatus``:
    the daemon after the hand-over, which may die during the wait); 0 when neither failed (the
    hand-over happened and nothing says the daemon failed), 1 for a failed unit with no record.

    Args:
        props: :func:`unit_properties` of the unit.
    """
    m = _EXEC_RECORD.search(props.get("ExecStart", ""))
    if m and _returncode(*m.groups()):
        return _returncode(*m.groups())
    main_code = _MAIN_CODES.get(props.get("ExecMainCode", ""))
    main_status = props.get("ExecMainStatus", "")
    if main_code and main_status.isdigit() and _returncode(main_code, main_status):
        return _returncode(main_code, main_status)
    if m:
        return 0
    return 1 if props.get("ActiveState") == "failed" else 0


def unit_properties(runner: Runner, unit: str) -> dict[str, str]:
    """``systemctl show`` of a unit: ActiveState, SubState, Result, ExecMainCode,
    ExecMainStatus, MainPID, LoadState, InactiveExitTimestampMonotonic (0 before it first
    started), ExecStart (with the first process's ``code=`` and ``status=``); ``{}`` when
    systemctl cannot tell."""
    try:
        done = runner.run(["systemctl", "show", unit, "-p",
                           "ActiveState,SubState,Result,ExecMainCode,ExecMainStatus,MainPID,"
                           "LoadState,InactiveExitTimestampMonotonic,ExecStart"], check=False)
    except CommandError:
        return {}
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def journal_lines(runner: Runner, unit: str, identifier: str, since: float) -> str:
    """The daemon's messages since ``since`` (a ``time.time()`` value) from the journal, as
    :func:`summarize_journal` gives them: its unit's stdout and stderr and its syslog lines. A
    message of a process that exited before journald read its cgroup lacks the unit's name, so
    the syslog identifier is matched too."""
    argv = ["journalctl", "--no-pager", "-q", "-o", "json", "-n", "50",
            f"--since=@{since - 1:.0f}", f"_SYSTEMD_UNIT={unit}", "+",
            f"SYSLOG_IDENTIFIER={identifier}"]
    said = ""
    for attempt in range(2):  # journald may not have stored the last line yet
        try:
            done = runner.run(argv, check=False)
        except CommandError:
            return ""
        said = summarize_journal(done.stdout)
        if said or attempt:
            break
        time.sleep(0.2)
    return said


def summarize_journal(journal_json: str, most: int = 3) -> str:
    """A daemon's last words from ``journalctl -o json`` output (one JSON object a line): its
    messages at error priority or worse first (nvidia-persistenced says why it failed only to
    syslog, at err: "Failed to query NVIDIA devices. ..."; stderr says "Check syslog for more
    details"), else every message but systemd's own notes from the unit's process before the
    daemon ran; the last ``most``, without repeats, joined by ``; ``.
    Lines that are not JSON objects with a text message are skipped."""
    entries = []
    for line in journal_json.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("MESSAGE"), str):
            entries.append(entry)
    errors = [e["MESSAGE"] for e in entries
              if str(e.get("PRIORITY", "6")).isdigit() and int(str(e.get("PRIORITY"))) <= 3]
    # systemd's own lines from the unit's process before it runs the daemon carry the
    # process's name in parentheses ("(istenced)": "Failed to configure loopback network
    # device, ignoring"); they are the daemon's words only when they are errors
    chosen = errors or [e["MESSAGE"] for e in entries
                        if not str(e.get("SYSLOG_IDENTIFIER", "")).startswith("(")]
    unique = list(dict.fromkeys(one_line(m) for m in chosen if m.strip()))
    return "; ".join(unique[-most:])


def start_daemon(runner: Runner, argv: list[str], log_path: str,
                 warn=lambda text: None) -> Daemon:
    """Start ``argv`` (``argv[0]`` a tool basename) so that it outlives the boot.

    Args:
        runner: the boot's runner (tool paths, time-outs, the budget).
        argv: the daemon's command line.
        log_path: where a spawned daemon's output goes (without systemd).
        warn: called with a warning line when systemd runs the machine but the daemon cannot
            get a unit of its own.

    Raises:
        CommandError: the daemon or systemd-run is missing or cannot start, or systemd-run
            refused the unit (its message).
        OSError: the log file of a spawned daemon cannot be made.
    """
    spec = DAEMONS[argv[0]]
    if not under_systemd():
        return SpawnedDaemon(runner.spawn(argv, log_path), log_path)
    if runner.which("systemd-run") is None:
        warn(f"{argv[0]}: systemd-run not found; the daemon runs in podvm-gpu.service's cgroup "
             "and a failed boot stops it")
        return SpawnedDaemon(runner.spawn(argv, log_path), log_path)
    path = runner.which(argv[0])
    if path is None:
        raise CommandError(argv, None, message=runner.why_missing(argv[0]))
    state = unit_properties(runner, spec.unit)
    if state.get("ActiveState") in ("active", "activating", "reloading") and \
            not main_process_gone(state):
        return UnitDaemon(runner, spec, time.time())  # an earlier boot's daemon: wait on it
    if state.get("ActiveState") == "failed":
        runner.run(["systemctl", "reset-failed", spec.unit], check=False)
    elif main_process_gone(state):  # "active (exited)": its daemon is gone, the record stays
        runner.run(["systemctl", "stop", spec.unit], check=False)
    since, since_us = time.time(), time.monotonic_ns() // 1000
    runner.run(["systemd-run", "--no-block", "--quiet", f"--unit={spec.unit}",
                f"--description={spec.description}",
                *(f"--property={setting}" for setting in spec.settings()),
                "--", path, *argv[1:]])
    return UnitDaemon(runner, spec, since, since_us)


# What nvidia-persistenced prints for an option it does not offer.
_UNRECOGNIZED = re.compile(r'unrecognized option: "(-[^"\s]+)"')


def unrecognized_option(said: str) -> str | None:
    """The option an installed ``nvidia-persistenced`` refused, from what it printed, or None.

    nvidia-persistenced 535.171.04 (Debian 12) does not offer ``--uvm-persistence-mode``: given
    it, the daemon prints ``nvidia-persistenced: unrecognized option: "--uvm-persistence-mode"``
    and ``ERROR: Invalid commandline, ...`` on stderr and exits 0 without starting
    (tests/data/nvidia-535.261.03/plain/nvidia-persistenced-agent-default-args).
    """
    m = _UNRECOGNIZED.search(said or "")
    return m.group(1) if m else None


class RefusedStart(Exception):
    """A daemon's first process exited 0 and no daemon runs: it refused to start (an option it
    does not know, with nvidia-persistenced 535.171.04). ``said`` is its last words."""

    def __init__(self, message: str, said: str = ""):
        super().__init__(message)
        self.said = said


def start_persistenced(start, args: list[str], settle, warn) -> tuple[object, list[str]]:
    """Start nvidia-persistenced with the config's ``args``; when the installed daemon refuses
    an option of them (it names it and exits 0: :func:`unrecognized_option`),
    start it again without that one, once per option. The one start of boot's persistenced step
    and the watcher's restart (issue 44 item 4).

    Args:
        start: ``argv -> Daemon`` (:func:`start_daemon` with the caller's runner and log).
        args: ``persistenced.args`` of the config (not changed).
        settle: ``Daemon -> result``: waits for the started daemon; raises
            :class:`RefusedStart` when it exited 0 without starting.
        warn: called with one line for each option dropped.

    Returns:
        ``(settle's result, [options dropped])``.

    Raises:
        RefusedStart: a refusal that names no option of ``args`` (or one already dropped).
        Whatever ``start`` and ``settle`` raise.
    """
    args, dropped = list(args), []
    while True:
        daemon = start(["nvidia-persistenced", *args])
        try:
            return settle(daemon), dropped
        except RefusedStart as err:
            option = unrecognized_option(err.said)
            if option is None or option not in args:
                raise
            args.remove(option)
            dropped.append(option)
            warn(f"persistenced: the installed nvidia-persistenced does not offer {option} "
                 f"(it said: {err.said}); started without it")


def socket_answers(path: str, timeout_s: float = 0.2) -> bool:
    """True when the UNIX stream socket at ``path`` (a host path) accepts a connection within
    ``timeout_s`` seconds: a daemon that serves it is up (NVLSM's fm_sm_ipc.socket); a socket
    file alone may be left from an earlier run. The connection is closed at once."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True
