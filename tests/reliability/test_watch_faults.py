"""The watcher's cells of the fault matrix (issue 34): its reads and writes fail and it keeps
running and says so; a fault never becomes a finding (no false alarm of its own), and a real
finding still gets through.

- every nvidia-smi query of the interval poll x {exit non-zero, hang, killed by a signal, garbage
  output, empty output} (the matrix's faults, tests/reliability/faults.py): a warning that the
  fact was not read, the state stays ready; a hung query is ended by its timeout and the next
  poll waits for it (never two at once), while the kernel log is still read;
- the kernel log: missing (unreadable) and garbled records;
- the spec folder refuses the write: status.json says so, the watcher tries again until it can.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from scenarios.world import World
from test_watch import (
    XID_79,
    append_kmsg,
    case,
    next_seq,
    spec_env,
    start_watch,
    status,
    stderr_of,
    stop,
    wait_until,
    watching,
)

from reliability.faults import FAULTS, SCENARIOS, Cell, install_fault

FAST = "watch:\n  interval_s: 0.3\ntimeouts:\n  nvidia-smi: 1\n"


def _hung(world: World) -> int:
    """nvidia-smi stand-ins of the hang fault alive now (their argv names the world's marker)."""
    marker = os.path.join(world.layout.dir, "hung").encode()
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    count += 1
        except OSError:
            pass
    return count


@pytest.mark.parametrize("fault", FAULTS)
def test_a_poll_query_that_fails_is_a_warning_and_the_kernel_log_still_decides(fault):
    scenario = next(s for s in SCENARIOS if s.name == "P02")
    with World(case("P02", FAST)) as world:
        world.run("boot")
        assert status(world)["state"] == "ready"
        install_fault(world, Cell(scenario, ("nvidia-smi",), fault))  # every call, from now on
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            warned = wait_until(lambda: any("not read" in w for w in status(world)["warnings"]),
                                15, proc)
            most = 0
            if fault == "hang":
                end = time.monotonic() + 3
                while time.monotonic() < end:
                    most = max(most, _hung(world))
                    time.sleep(0.05)
            assert proc.poll() is None, stderr_of(world)
            assert warned, (fault, status(world)["warnings"], stderr_of(world))
            assert status(world)["state"] == "ready"
            assert json.loads(Path(world.path("/run/podvm-gpu/watch.json")).read_text())[
                "finding"] is None
            assert most <= 1, f"{most} hung polls at once"
            injected = Path(world.layout.dir, "faults.log").read_text().split()
            assert fault in injected, "the fault never reached a poll"
            append_kmsg(world, XID_79)
            assert wait_until(lambda: status(world)["state"] == "failed", 10, proc), \
                stderr_of(world)
        finally:
            stop(proc)
        assert status(world)["reason"].startswith("watch: GPU 0000:00:04.0: Xid 79")


def test_a_kernel_log_that_cannot_be_read_is_a_warning_and_the_polls_go_on():
    with World(case("P02", FAST)) as world:
        world.run("boot")
        os.unlink(world.path("/dev/kmsg"))
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            assert wait_until(lambda: any("kernel log cannot be read" in w
                                          for w in status(world)["warnings"]), 10, proc)
            time.sleep(1)  # polls run meanwhile (healthy answers)
            assert proc.poll() is None and status(world)["state"] == "ready"
        finally:
            stop(proc)
        assert proc.returncode == 0


def test_garbled_kernel_log_records_are_no_finding():
    with World(case("P02", FAST)) as world:
        world.run("boot")
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            seq = next_seq(Path(world.path("/dev/kmsg")))
            with open(world.path("/dev/kmsg"), "ab") as f:
                f.write(b"\xff\xfe garbage without a prefix Xid (PCI:0000:00:04): 79\n"
                        b"3,notanumber,1,-;NVRM: Xid (PCI:0000:00:04): 79, fallen off\n"
                        b" SUBSYSTEM=pci Xid (PCI:0000:00:04): 79\n"
                        + f"27,{seq},1,-;NVRM: Xid (PCI:0000:00:04): 79 (a program wrote "
                          "it)\n".encode()
                        + f"6,{seq + 1},1,-;".encode() + b"x" * 200000 + b"\n")
            time.sleep(1.5)
            assert proc.poll() is None and status(world)["state"] == "ready", stderr_of(world)
            append_kmsg(world, XID_79)
            assert wait_until(lambda: status(world)["state"] == "failed", 10, proc)
        finally:
            stop(proc)


def test_a_spec_folder_that_refuses_the_write_is_said_and_tried_again():
    with World(case("P02", "watch:\n  interval_s: 3600\n")) as world:
        world.run("boot")
        proc = start_watch(world)
        folder = Path(world.path("/var/run/cdi"))
        aside = folder.with_name("cdi.aside")
        try:
            assert watching(world, proc), stderr_of(world)
            folder.rename(aside)
            folder.write_text("not a folder\n")  # every write under it fails: ENOTDIR
            append_kmsg(world, XID_79)
            said = wait_until(lambda: "cdi: cannot write /var/run/cdi/nvidia.yaml" in
                              (status(world)["reason"] or ""), 10, proc)
            assert said, stderr_of(world)
            assert status(world)["state"] == "failed" and status(world)["cdi"] is None
            time.sleep(1)
            assert proc.poll() is None, "the watcher keeps running until the spec is written"
            assert "trying again" in stderr_of(world)
            folder.unlink()
            aside.rename(folder)
            assert proc.wait(15) == 0, stderr_of(world)
        finally:
            stop(proc)
            if aside.exists() and not folder.exists():
                aside.rename(folder)
        assert "PODVM_GPU_STATE=failed" in spec_env(world)
        assert "cdi: cannot write" not in status(world)["reason"]
        shutil.rmtree(aside, ignore_errors=True)
