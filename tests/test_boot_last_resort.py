"""Every end of a boot is a final state, even when the ending itself is hit (docs/interface.md
3.3 and 3.5): a second signal, the budget's timer or an error raised inside the ending (the
unavailable spec's write, the status write) never lets ``run_boot`` return or raise with
status.json still ``running``. A real-systemd boot once exited 1 after TimeoutStartSec='s SIGTERM
with ``finished_at`` null (tests/test_boot_nspawn.py, start_timeout).

``run_boot`` runs in this process with its real signal handlers; its detection and steps are
replaced by a stand-in (``_boot``) that records a step in flight and waits in it, as a step's
tool call or wait does, so the signal or the fault lands where the test puts it. The real
program's two quick SIGTERMs are in the scenario world's test at the end.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from scenarios.world import World
from schemas import assert_status_conforms
from test_boot_ends import p02, product_pid, wait_for_call, with_slow_call

import podvm_gpu.boot as boot
from podvm_gpu.boot.run import BudgetExpired
from podvm_gpu.cdi import unavailable
from podvm_gpu.model import Step, StepResult

STATUS = "run/podvm-gpu/status.json"
SPEC = "var/run/cdi/nvidia.yaml"


def in_a_step(then):
    """A stand-in for the boot's detection and steps: ``detect`` ok and ``modules`` in flight,
    recorded as a boot records them (lock held, status written), then ``then(run)``; a step that
    would wait 10 s, as a hung tool does, after it."""
    def fake(run, config):
        run.locked = True
        run.status.steps += [Step("detect", StepResult.OK), Step("modules")]
        run.status_file.write(run.status)
        then(run)
        time.sleep(10)
        raise AssertionError("nothing ended the step")
    return fake


def final(root: Path) -> dict:
    doc = json.loads((root / STATUS).read_text())
    assert doc["state"] == "failed" and doc["finished_at"], doc
    assert "running" not in [s["result"] for s in doc["steps"]], doc["steps"]
    assert_status_conforms(doc)
    spec = yaml.safe_load((root / SPEC).read_text())
    assert [d["name"] for d in spec["devices"]] == ["unavailable"], spec
    assert "PODVM_GPU_STATE=failed" in spec["devices"][0]["containerEdits"]["env"]
    return doc


def spec_write(monkeypatch, before=None, faults=0, fault=None):
    """Replace the unavailable spec's write: ``before()`` first on every call, ``fault`` raised
    by the first ``faults`` calls, the real write after. Returns the list of calls' times."""
    real, calls = unavailable.write_unavailable_spec, []
    fault = fault or ValueError("a bug in the spec")

    def write(root, state, reason):
        calls.append(time.monotonic())
        if before:
            before()
        if len(calls) <= faults:
            raise fault
        return real(root, state, reason)
    monkeypatch.setattr(unavailable, "write_unavailable_spec", write)
    return calls


def sigterm(delay_s: float = 0.0) -> None:
    if delay_s:
        time.sleep(delay_s)
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def handlers():
    """The process's own handlers, checked back in place after each boot."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)}
    yield
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_budgets_timer_due_during_a_sigterms_ending_does_not_cut_it_short(
        tmp_path, monkeypatch, handlers):
    """SIGTERM in a step, the budget's timer due 50 ms later, while the ending still writes the
    spec (300 ms): the timer is cancelled when the ending begins, so the end is SIGTERM's."""
    def arm_then_sigterm(run):
        run.signals.arm(0.05)
        sigterm()
    monkeypatch.setattr(boot, "_boot", in_a_step(arm_then_sigterm))
    spec_write(monkeypatch, before=lambda: time.sleep(0.3))

    assert boot.run_boot(str(tmp_path)) == 1

    doc = final(tmp_path)
    assert doc["reason"].startswith("modules: interrupted by SIGTERM (the unit was stopped"), doc
    assert "budget" not in doc["reason"]


def test_budget_expired_raised_during_the_interrupted_ending_still_ends_failed(
        tmp_path, monkeypatch, handlers):
    """BudgetExpired (the SIGALRM handler's) raised inside SIGTERM's ending, at the spec's
    write: it escaped run_boot before (exit 1, status ``running``); the last resort writes the
    failed status and the spec, naming both."""
    monkeypatch.setattr(boot, "_boot", in_a_step(lambda run: sigterm()))
    calls = spec_write(monkeypatch, faults=1, fault=BudgetExpired())

    assert boot.run_boot(str(tmp_path)) == 1

    doc = final(tmp_path)
    assert doc["reason"].startswith("modules: interrupted by SIGTERM"), doc
    assert doc["reason"].endswith("; ending: the boot budget is spent"), doc
    assert len(calls) == 2  # the ending's write, then the last resort's


@pytest.mark.parametrize("faults", [1, 2], ids=["once", "every-time"])
def test_an_error_from_the_unavailable_spec_write_still_ends_failed_naming_it(
        tmp_path, monkeypatch, handlers, capsys, faults):
    """A step failed and the ending's spec write raises (not an OSError: a bug, a broken
    install): the final status is still written, naming the step's reason and the error; the
    spec is written by the last resort where that write works."""
    monkeypatch.setattr(boot, "_boot", in_a_step(lambda run: run.fail("modules: modprobe failed")))
    spec_write(monkeypatch, faults=faults)

    assert boot.run_boot(str(tmp_path)) == 1

    reason = "modules: modprobe failed; ending: internal error: ValueError: a bug in the spec"
    if faults == 1:
        doc = final(tmp_path)
    else:  # no spec can be written at all: the status still says failed, and why
        doc = json.loads((tmp_path / STATUS).read_text())
        assert doc["state"] == "failed" and doc["finished_at"], doc
        assert not (tmp_path / SPEC).exists()
        assert "cdi: cannot write /var/run/cdi/nvidia.yaml: ValueError: a bug in the spec" in \
            capsys.readouterr().err
    assert doc["reason"] == reason, doc
    assert doc["steps"][-1]["result"] == "failed", doc["steps"]


def test_an_error_from_the_final_status_write_still_writes_a_final_status(
        tmp_path, monkeypatch, handlers):
    """The status write itself raises once (not an OSError): the last resort writes it again."""
    from podvm_gpu.status import StatusFile

    real, calls = StatusFile.finish, []

    def finish(self, status, state, reason):
        calls.append(state)
        if len(calls) == 1:
            raise RecursionError("a bug in the status")
        return real(self, status, state, reason)
    monkeypatch.setattr(StatusFile, "finish", finish)
    monkeypatch.setattr(boot, "_boot", in_a_step(lambda run: sigterm()))

    assert boot.run_boot(str(tmp_path)) == 1

    doc = final(tmp_path)
    assert doc["reason"].startswith("modules: interrupted by SIGTERM"), doc
    assert doc["reason"].endswith("; ending: internal error: RecursionError: a bug in the status")


def test_two_sigterms_in_quick_succession_during_a_step_end_it_once(tmp_path, monkeypatch,
                                                                    handlers):
    """Two SIGTERMs 1 ms apart while a step waits, and a third while the ending writes the spec:
    the first ends the boot, the others are only noted."""
    def two_sigterms(run):
        sender = threading.Thread(target=lambda: (sigterm(0.01), sigterm(0.001)))
        sender.start()
        try:
            time.sleep(10)
        finally:
            sender.join()
    monkeypatch.setattr(boot, "_boot", in_a_step(two_sigterms))
    calls = spec_write(monkeypatch, before=lambda: (sigterm(), time.sleep(0.05)))

    assert boot.run_boot(str(tmp_path)) == 1

    doc = final(tmp_path)
    assert doc["reason"] == "modules: interrupted by SIGTERM (the unit was stopped, the VM is " \
                            "shutting down, or TimeoutStartSec= passed)", doc
    assert len(calls) == 1  # the ending ran once, to its end


def test_the_real_program_ends_failed_after_two_quick_sigterms_in_a_step():
    """The real boot (scenario world P02, modprobe hanging): SIGTERM twice, 1 ms apart."""
    argv = ["modprobe", "nvidia"]
    case = with_slow_call(p02(), argv, "hang")

    def interrupt(process):
        wait_for_call(world, argv)
        pid = product_pid(process)
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.001)
        os.kill(pid, signal.SIGTERM)
        process.wait(timeout=10)

    with World(case) as world:
        run = world.run("boot", during=interrupt)
        assert run.rc == 1, run.stderr
        assert "Traceback" not in run.stderr
        status = run.status
        assert status["state"] == "failed" and status["finished_at"], status
        assert status["reason"].startswith("modules: interrupted by SIGTERM"), status["reason"]
        spec = yaml.safe_load(Path(world.path("/var/run/cdi/nvidia.yaml")).read_text())
        assert [d["name"] for d in spec["devices"]] == ["unavailable"]


def test_the_leftovers_boot_removes_are_those_of_the_spec_and_status_it_writes():
    """status.py names the spec's file itself (cdi is a sibling layer it may not import)."""
    from podvm_gpu.cdi import IMEX_SPEC_PATH, SPEC_PATH
    from podvm_gpu.status import OWN_FILES, STATUS_PATH
    from podvm_gpu.steps.cc.attest.gate import output_path

    for path in (SPEC_PATH, IMEX_SPEC_PATH, STATUS_PATH, output_path("gpu"),
                 output_path("nvswitch")):
        assert os.path.basename(path) in OWN_FILES[os.path.dirname(path)], path
