"""Who writes the binding's event, and the repair of the crash window (issue 43 items 3 and 5;
docs/interface.md 3.14).

Who writes: before CoCo's attestation-agent (AA) starts (the boot: AA's drop-in orders it after
podvm-gpu.service) nobody else writes AA's log or RTMR3, and bind.py appends and extends itself.
Once AA runs, a direct write races it: AA extends then logs, the agent logs then extends, and AA
from guest-components b74cb38d writes at an offset it remembered at its start, overwriting a
record appended behind its back (../shared/trustee-aa.md, section 2). So when AA's socket
answers, the event goes through AA's ``ExtendRuntimeMeasurement`` (podvm_gpu/host/aa.py):

* ``OK``: AA extended RTMR3 and logged the event: bound, nothing written here;
* ``NOT_ENABLED``: AA's event log is off, AA never writes the log or the register: the direct
  write is safe and is used;
* ``NOT_SUPPORTED``, another answer, or a ttrpc error: broken, the reason names AA (a direct
  write would race it).

The crash window: bind.py appends and fsyncs the record, then extends. A process killed
between the two (the budget's timer, ``TimeoutStartSec``) leaves a record RTMR3 never saw, and
every later attestation fails. :func:`repair` takes such records back: when the logs replayed
without the log's trailing podvm-gpu records give the register's value, exactly those records
were never extended; they are cut off (never a record of another domain) and the repair says
so. It runs at the end of every boot (bind.py's ``at_end``) and in AA's drop-in
(``ExecStartPre=podvm-gpu binding --repair``), and never while AA answers on its socket.
"""

from __future__ import annotations

from podvm_gpu.host import aa, rtmr


class AgentRefused(Exception):
    """AA was reached and did not extend (``NOT_SUPPORTED``, an unknown answer, a ttrpc error,
    no answer in time): nothing was written, the logs still replay, an earlier event stands.
    Broken; it fails a boot only with ``bind: required`` (bind.py's ``for_boot``)."""


def through_agent(root, domain: str, operation: str, body: str) -> bool:
    """Send the event through AA when AA's socket answers.

    Args:
        root: the :class:`~podvm_gpu.host.fs.Root` (AA's socket is taken under it).
        domain, operation, body: the event's three parts.

    Returns:
        True when AA answered OK (it extended and logged); False when the direct write is to
        be used (nobody listens on the socket, or AA's event log is off: ``NOT_ENABLED``).

    Raises:
        AgentRefused: AA answered ``NOT_SUPPORTED`` or something unknown, or the call failed.
    """
    try:
        answer = aa.extend(root.resolve(aa.SOCKET_PATH), domain, operation, body,
                           timeout_s=aa.TIMEOUT_S)
    except aa.Unreachable:
        return False  # AA is not running: nobody else writes the log or the register
    except aa.AAError as err:
        raise AgentRefused(f"{err}; nothing written (a direct write would race the "
                           "attestation-agent)") from None
    if answer == aa.NOT_ENABLED:
        return False
    if answer == aa.OK:
        return True
    name = aa.RESULTS.get(answer, f"unknown result {answer}")
    raise AgentRefused(f"the attestation-agent answered {aa.METHOD} with {name}: it cannot "
                       "extend RTMR3 here; nothing written (a direct write would race it)")


class RepairError(Exception):
    """The repair cannot run or cannot decide; the message says why."""


def repair(root, read_log, is_ours, register=None) -> str | None:
    """Cut off the log's trailing podvm-gpu records that RTMR3 never saw (module docstring).

    Args:
        root: the :class:`~podvm_gpu.host.fs.Root`.
        read_log: bind.py's ``_read_log(root, path, firmware)`` (raises its BindError);
            is_ours: whether a record is one of this agent's events.
        register: the register seam (:class:`~podvm_gpu.host.rtmr.Register` under the root by
            default; tests give a fake).

    Returns:
        What was repaired (one line naming the records and the log), or None when there was
        nothing to repair (no register, no log, the logs replay to the register).

    Raises:
        RepairError: AA answers on its socket (never repaired while it runs), a file cannot be
            read or cut, or the logs disagree with the register in a way trailing podvm-gpu
            records do not explain (named; nothing changed).
    """
    if register is None:
        if not rtmr.present(root):
            return None
        register = rtmr.Register(root.resolve(rtmr.RTMR3_PATH))
    try:
        value = register.read()
        firmware = read_log(root, rtmr.CCEL_PATH, True)
        ours = read_log(root, rtmr.EVENTLOG_PATH, False)
        if rtmr.replay(firmware + ours) == value:
            return None
    except OSError as err:
        raise RepairError(f"cannot read {rtmr.RTMR3_PATH}: {err.strerror or err}") from None
    except Exception as err:  # bind.py's BindError, a LogError: each names its file
        raise RepairError(str(err)) from None
    if aa.answers(root.resolve(aa.SOCKET_PATH)):
        raise RepairError(f"the attestation-agent answers on {aa.SOCKET_PATH}: the log is not "
                          "repaired while it runs")
    trailing = 0
    while trailing < len(ours) and is_ours(ours[len(ours) - 1 - trailing]):
        trailing += 1
        kept = ours[:len(ours) - trailing]
        if rtmr.replay(firmware + kept) == value:
            return _cut(root, ours[len(kept)].offset, trailing)
    raise RepairError(f"{rtmr.RTMR3_PATH} does not replay from {rtmr.CCEL_PATH} and "
                      f"{rtmr.EVENTLOG_PATH}, with or without the log's trailing podvm-gpu "
                      "records: something extended RTMR3 without logging it; nothing changed")


def _cut(root, offset: int, count: int) -> str:
    """Truncate AA's log to ``offset`` and fsync it; the line that says so."""
    path = root.resolve(rtmr.EVENTLOG_PATH)
    try:
        rtmr.cut_log(path, offset)
    except OSError as err:
        raise RepairError(f"cannot cut {rtmr.EVENTLOG_PATH} back to {offset} bytes: "
                          f"{err.strerror or err}") from None
    return (f"binding repaired: {count} podvm-gpu record(s) at the end of "
            f"{rtmr.EVENTLOG_PATH} were never extended into RTMR3 (a run killed between its "
            f"append and its extend): cut off at byte {offset}; the log replays to RTMR3 again")


def repair_said(root, read_log, is_ours, register=None) -> str | None:
    """:func:`repair` for a boot's end: the line to log (repaired, or why it could not be), or
    None when nothing needed it. Never raises."""
    try:
        return repair(root, read_log, is_ours, register)
    except RepairError as err:
        return f"binding not repaired: {err}"
    except Exception as err:  # a bug must not keep the boot from its end
        return f"binding not repaired: internal error: {type(err).__name__}: {err}"
