"""How a daemon's transient unit ended, read from ``systemctl show`` (host/daemons.py).

The property texts are shaped as systemctl 252 prints them (its exec-status printer:
``code=exited ; status=1`` for an exit, ``code=killed ; status=9/KILL`` for a signal;
``ExecMainCode`` is the waitid() si_code, 1 exited, 2 killed, 3 dumped). The real systemd's
answer for a daemon killed by a signal is in tests/test_boot_nspawn.py
(``test_a_daemon_killed_by_a_signal_is_named_so``).
"""

from __future__ import annotations

import pytest

from podvm_gpu.errors import ended_text
from podvm_gpu.host.daemons import exit_status_of, main_process_gone


def record(code: str, status: str) -> str:
    return ("{ path=/usr/bin/nvidia-persistenced ; argv[]=/usr/bin/nvidia-persistenced "
            "--persistence-mode ; ignore_errors=no ; start_time=[Tue 2026-12-01 13:00:00 UTC] ; "
            "stop_time=[Tue 2026-12-01 13:00:01 UTC] ; pid=312 ; "
            f"code={code} ; status={status} }}")


def props(first: tuple[str, str] | None, main: tuple[str, str] = ("0", "0"),
          state: str = "failed", sub: str = "failed") -> dict[str, str]:
    p = {"ActiveState": state, "SubState": sub, "ExecMainCode": main[0],
         "ExecMainStatus": main[1], "InactiveExitTimestampMonotonic": "5000000"}
    if first is not None:
        p["ExecStart"] = record(*first)
    return p


@pytest.mark.parametrize("first, main, expected, text", [
    # the first process failed: persistenced's parent when its child could not initialise
    (("exited", "1"), ("0", "0"), 1, "exited with status 1"),
    # the first process was killed mid-initialisation (OOM killer, an operator's kill -9)
    (("killed", "9/KILL"), ("0", "0"), -9, "was killed by SIGKILL"),
    (("dumped", "11/SEGV"), ("0", "0"), -11, "was killed by SIGSEGV"),
    # the hand-over happened (first exited 0); the daemon itself died later
    (("exited", "0"), ("2", "6"), -6, "was killed by SIGABRT"),
    (("exited", "0"), ("3", "11"), -11, "was killed by SIGSEGV"),
    (("exited", "0"), ("1", "4"), 4, "exited with status 4"),
])
def test_how_a_daemon_unit_ended_names_an_exit_or_a_signal(first, main, expected, text):
    p = props(first, main)
    assert main_process_gone(p)
    assert exit_status_of(p) == expected
    assert ended_text(exit_status_of(p)) == text


def test_a_signal_is_never_read_as_an_exit_status():
    """Before, ``status=9/KILL`` was read as "exited with status 9"."""
    assert exit_status_of(props(("killed", "15/TERM"))) == -15


def test_a_hand_over_with_nothing_failed_is_0():
    """A forking daemon's first process exits 0 once the daemon runs; the unit active."""
    assert exit_status_of(props(("exited", "0"), ("0", "0"), "active", "running")) == 0


def test_without_any_record_a_failed_unit_is_1_and_an_exited_one_0():
    assert exit_status_of(props(None)) == 1
    assert exit_status_of(props(None, state="active", sub="exited")) == 0


def test_systemds_own_notes_before_the_daemon_ran_are_not_its_last_words():
    """Seen under nspawn: the unit's process, before it runs the daemon, logs as "(istenced)"
    that it cannot set up PrivateNetwork='s loopback; a daemon killed by SIGKILL then says
    nothing of its own, and the reason must not quote systemd's note as the daemon's words.
    An error from that process (a sandbox it could not set up) is still quoted."""
    import json

    from podvm_gpu.host.daemons import summarize_journal

    note = {"MESSAGE": "Failed to configure loopback network device, ignoring: Operation not "
            "permitted", "PRIORITY": "4", "SYSLOG_IDENTIFIER": "(istenced)"}
    said = {"MESSAGE": "Started (41)", "PRIORITY": "5", "SYSLOG_IDENTIFIER": "nvidia-persistenced"}
    failed = {"MESSAGE": "Failed to set up mount namespacing: /run/nvidia-persistenced: No such "
              "file or directory", "PRIORITY": "3", "SYSLOG_IDENTIFIER": "(istenced)"}
    assert summarize_journal(json.dumps(note)) == ""
    assert summarize_journal("\n".join(map(json.dumps, (note, said)))) == "Started (41)"
    assert summarize_journal("\n".join(map(json.dumps, (note, failed)))) == failed["MESSAGE"]
