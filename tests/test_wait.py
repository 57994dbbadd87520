"""The one bounded wait (podvm_gpu/host/wait.py) and a step's use of it (BootContext.wait):
every wait of a boot polls through it, so its edges are held here once."""

from __future__ import annotations

import threading
import time

import pytest

from podvm_gpu.config.model import Config
from podvm_gpu.errors import Cancelled, StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.host.wait import until
from podvm_gpu.model import Status
from podvm_gpu.steps.context import BootContext


def test_a_condition_that_holds_at_once_is_looked_at_once_and_its_value_returned():
    calls = []

    waited = until(lambda: calls.append(1) or "port", 5.0, 0.01)

    assert (waited.held, waited.value, len(calls)) == (True, "port", 1)
    assert waited.waited_s < 1.0


def test_a_condition_that_never_holds_is_looked_at_until_the_limit_and_once_at_it():
    times = []
    started = time.monotonic()

    waited = until(lambda: times.append(time.monotonic()) and False, 0.2, 0.05)

    assert not waited.held
    assert waited.limit_s == 0.2
    assert 3 <= len(times) <= 6
    assert times[-1] - started >= 0.2, "the last look is at the limit, not a pause before it"


def test_a_zero_limit_looks_once():
    calls = []

    waited = until(lambda: calls.append(1), 0.0, 1.0)

    assert not waited.held and len(calls) == 1


def test_what_the_condition_raises_ends_the_wait():
    with pytest.raises(StepFailed, match="exited"):
        until(lambda: (_ for _ in ()).throw(StepFailed("daemon exited")), 5.0, 0.01)


def test_the_pause_is_the_given_sleep_cut_to_the_time_left():
    pauses = []

    until(lambda: False, 0.3, 10.0, sleep=lambda s: (pauses.append(s), time.sleep(s)))

    assert pauses and all(p <= 0.3 for p in pauses)


def context(tmp_path, budget_left_s: float) -> BootContext:
    return BootContext(Root(str(tmp_path)), Config(), runner=None, status=Status(),
                       deadline=time.monotonic() + budget_left_s)


def test_a_steps_wait_is_cut_to_the_budget(tmp_path):
    ctx = context(tmp_path, 0.2)

    waited = ctx.wait(lambda: False, 30.0, 0.05)

    assert not waited.held and waited.limit_s <= 0.2


def test_a_steps_wait_with_the_budget_spent_times_out_before_looking(tmp_path):
    ctx = context(tmp_path, -1.0)

    with pytest.raises(StepFailed, match="timed out: the boot budget"):
        ctx.wait(lambda: pytest.fail("looked"), 30.0, 0.05)


def test_a_wait_of_0_s_looks_once_even_with_the_budget_spent(tmp_path):
    ctx = context(tmp_path, -1.0)

    assert ctx.wait(lambda: "dev", 0, 0.05).value == "dev"


def test_the_stop_event_ends_a_steps_wait(tmp_path):
    ctx = context(tmp_path, 30.0)
    ctx.stopping = threading.Event()
    ctx.stopped_because = "fabricmanager failed"
    threading.Timer(0.1, ctx.stopping.set).start()

    with pytest.raises(Cancelled, match="fabricmanager failed"):
        ctx.wait(lambda: False, 30.0, 0.02)
