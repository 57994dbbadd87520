"""The kernel log read once per boot (issue 38): podvm_gpu.host.kmsg_once.SharedLog, and a
boot's reads of ``<root>/dev/kmsg`` counted from outside the product (strace), no timing
involved."""

from __future__ import annotations

import os
import re
import shutil
import sys

import pytest
from conftest import _missing_tool
from scenarios.world import DATA, World, load_case

from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root
from podvm_gpu.host.kmsg_once import SharedLog


def record(seq: int, message: str, prio: int = 6) -> str:
    return f"{prio},{seq},{1000 + seq},-;{message}\n"


@pytest.fixture
def root(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(record(1, "Linux version 6.1") +
                                           record(2, "NVRM: loading NVIDIA UNIX x86_64 Kernel "
                                                     "Module  580.159.04"))
    return Root(str(tmp_path))


def test_every_reader_goes_through_one_open(root, monkeypatch):
    opened = []
    real_open = os.open
    monkeypatch.setattr(kmsg.os, "open", lambda path, *a: opened.append(path) or real_open(path, *a))
    alone = kmsg.read_timed_records(root)
    assert len(opened) == 1
    with SharedLog(root) as log:
        for _ in range(3):
            assert kmsg.read_timed_records(root) == alone
            assert kmsg.read_kernel_log(root) == [m for _l, m, _u in alone]
            assert kmsg.read_kernel_records(root) == [(lvl, m) for lvl, m, _u in alone]
    assert log.opens == 1 and len(opened) == 2  # the shared reader's one open
    kmsg.read_kernel_log(root)  # closed: a reader reads alone again
    assert len(opened) == 3


def test_records_added_later_are_read_and_only_they(root):
    path = os.path.join(root.path, "dev", "kmsg")
    with SharedLog(root) as log:
        first = kmsg.read_kernel_log(root)
        with open(path, "a") as f:  # the driver's records after the modprobe
            f.write(record(3, "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
                           3))
            f.write("4,4,1004,-;half a rec")  # a record still being written: no newline yet
        later = kmsg.read_kernel_log(root)
        assert later[:2] == first and later[2].startswith("NVRM: Xid")
        assert later[3] == "half a rec"  # as a reader alone would see it
        with open(path, "a") as f:
            f.write("ord\n")
        assert kmsg.read_kernel_log(root)[3:] == ["half a record"]
        alone = [m for _level, m, _usec in kmsg._read_all(root)]
        assert kmsg.read_kernel_log(root) == alone and log.opens == 1


def test_a_replaced_or_shortened_file_is_read_from_its_start(root):
    path = os.path.join(root.path, "dev", "kmsg")
    with SharedLog(root) as log:
        kmsg.read_kernel_log(root)
        with open(path + ".new", "w") as f:
            f.write(record(1, "another boot"))
        os.replace(path + ".new", path)
        assert kmsg.read_kernel_log(root) == ["another boot"]
        with open(path, "w") as f:
            f.write(record(1, "x"))
        assert kmsg.read_kernel_log(root) == ["x"]  # the same file, shorter
        assert log.opens == 3


def test_a_live_log_is_read_on_from_where_it_ended(tmp_path):
    # /dev/kmsg is no plain file: a reader that stays open gets the next records, then EAGAIN;
    # a FIFO held open by its writer behaves alike
    (tmp_path / "dev").mkdir()
    fifo = tmp_path / "dev" / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        root = Root(str(tmp_path))
        with SharedLog(root) as log:
            os.write(writer, record(1, "one").encode())
            assert kmsg.read_kernel_log(root) == ["one"]
            os.write(writer, record(2, "two").encode())
            assert kmsg.read_kernel_log(root) == ["one", "two"]
            assert log.opens == 1
    finally:
        os.close(writer)


def test_the_newest_4_mib_are_kept(root, monkeypatch):
    monkeypatch.setattr(kmsg, "_MAX_BYTES", 200)
    path = os.path.join(root.path, "dev", "kmsg")
    with open(path, "w") as f:
        f.writelines(record(i, f"message {i:04d}") for i in range(40))
    with SharedLog(root):
        shared = kmsg.read_kernel_log(root)
    assert shared[-1] == "message 0039" and sum(len(m) + 12 for m in shared) <= 400
    assert shared == [m for _level, m, _usec in kmsg._read_all(root)]


@pytest.mark.parametrize("name, state", [("P02-one-h100-pcie-ready.yaml", "ready"),
                                         ("C26-xid-119-gsp-timeout.yaml", "failed")])
def test_a_boot_opens_the_kernel_log_once(umockdev_run, tmp_path, monkeypatch, name, state):
    # strace counts the product's opens of <root>/dev/kmsg: the modules step, the CC step's
    # guest hint, the final warnings and a failure's reason all read it (seven reads before)
    strace = shutil.which("strace")
    if strace is None:
        _missing_tool("strace")
    trace = tmp_path / "trace"
    monkeypatch.setenv("PODVM_GPU_CMD", f"{strace} -f -qq -e trace=open,openat -o {trace} "
                                        f"{sys.executable} -m podvm_gpu")
    with World(load_case(DATA / "cases" / name)) as world:
        run = world.run("boot")
        kmsg_path = os.path.join(world.layout.root, "dev", "kmsg")
    assert (run.status or {}).get("state") == state, run.stderr[-2000:]
    opens = [line for line in trace.read_text().splitlines()
             if re.search(rf'open(at)?\(.*"{re.escape(kmsg_path)}", O_RDONLY', line)]
    assert len(opens) == 1, opens
