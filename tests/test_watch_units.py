"""The watcher's pieces without a world (issue 34): what a kernel record means (the boot's
table, through podvm_gpu/watch/verdicts.py), the kernel log followed from a position, and the
position a first start takes."""

from __future__ import annotations

import os
import time

import pytest

from podvm_gpu.gpufacts import finding as F
from podvm_gpu.gpufacts import xids
from podvm_gpu.gpufacts.words import FAIL, WARN
from podvm_gpu.host.fs import Root
from podvm_gpu.host.kmsg import parse_line
from podvm_gpu.host.kmsg_follow import BOOT_READY, KernelLog
from podvm_gpu.watch import verdicts


@pytest.mark.parametrize("code", sorted(xids.FATAL_XIDS))
def test_every_xid_the_boot_calls_fatal_is_fatal_for_the_watcher_naming_the_gpu(code):
    [v] = verdicts.judge_record(f"NVRM: Xid (PCI:0000:01:00): {code}, pid=1, name=x, ...")
    assert (v.level, v.gpu) == (FAIL, "00000000:01:00.0")
    assert f"Xid {code}" in v.what


@pytest.mark.parametrize("code", sorted(xids.WARN_XIDS))
def test_an_application_xid_only_warns(code):
    [v] = verdicts.judge_record(f"NVRM: Xid (PCI:0000:01:00): {code}, pid=1, name=python3")
    assert v.level == WARN and v.gpu == "00000000:01:00.0"


@pytest.mark.parametrize("label, level", [
    ("0x1 (PF FLR)", (FAIL, F.RESET)),  # 610's label for NVML's GPU Reset
    ("0x1 (GPU Reset)", (FAIL, F.RESET)),
    ("0x2 (Node Reboot)", (FAIL, F.REPLACE)),
    ("0x4 (Drain and Reset)", (FAIL, F.RESET)),
    ("0x3 (Drain P2P)", (WARN, F.NONE)),
    # 5-7 from the one table boot judges by (gpufacts/judge.py, issue 33): before the merge
    # the watcher's own table knew 0-4 and called these "a code this agent does not know"
    ("0x5 (Recover IMEX Domain)", (WARN, F.NONE)),
    ("0x6 (Bus Reset)", (FAIL, F.RESET)),
    ("0x7 (System Reboot)", (FAIL, F.REPLACE)),
    ("0x9 (Something New)", (WARN, F.NONE))])
def test_xid_154_is_read_over_its_hex_code_not_its_label(label, level):
    [v] = verdicts.judge_record(f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed "
                                f"from 0x0 (None) to {label}")
    assert (v.level, v.action) == level, v


def test_xid_154_back_to_none_says_nothing():
    assert verdicts.judge_record("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed "
                                 "from 0x1 (PF FLR) to 0x0 (None)") == []


def test_a_gpu_fallen_off_the_bus_without_an_xid_is_fatal():
    [v] = verdicts.judge_record("NVRM: GPU at PCI:0000:01:00: GPU-abc has fallen off the bus.")
    assert v.level == FAIL and v.gpu == "00000000:01:00.0"


def test_ordinary_records_say_nothing():
    assert verdicts.judge_record("virtio_net virtio0 eth0: link up") == []


@pytest.mark.parametrize("named, address, same", [
    ("0000:01:00", "0000:01:00.0", True), ("00000000:01:00.0", "0000:01:00.0", True),
    ("0000:02:00", "0000:01:00.0", False), ("0001:01:00", "0000:01:00.0", False)])
def test_a_source_names_a_gpu_in_its_own_spelling(named, address, same):
    assert verdicts.same_gpu(named, address) is same


def test_records_are_parsed_with_facility_and_sequence():
    kernel = parse_line("3,42,123456,-;NVRM: Xid (PCI:0000:01:00): 79, ...")
    assert (kernel.seq, kernel.level, kernel.usec, kernel.kernel) == (42, 3, 123456, True)
    own = parse_line("29,43,123457,-;podvm-gpu[12]: ready: 1 GPU(s)")
    assert own.kernel is False and BOOT_READY.search(own.message)
    assert parse_line(" SUBSYSTEM=pci") is None and parse_line("no prefix") is None
    # CONFIG_PRINTK_CALLER's field after the flags, a 7-digit pid: the watcher's own parser (up
    # to 16 characters after the third comma) dropped it before issue 44 gave it kmsg's
    far = parse_line("4,44,123458,-,caller=T4194304;NVRM: Xid (PCI:0000:01:00): 79, ...")
    assert (far.seq, far.level, far.kernel) == (44, 4, True) and far.message.startswith("NVRM")


def test_a_growing_file_is_followed_by_inotify_without_busy_polling(tmp_path):
    log = tmp_path / "dev/kmsg"
    log.parent.mkdir()
    log.write_text("6,0,1,-;first\n")
    klog = KernelLog(Root(str(tmp_path)))
    try:
        assert klog.event_driven
        assert [r.message for r in klog.read()] == ["first"]
        cpu = time.process_time()
        started = time.monotonic()
        assert klog.wait(0.5) is False  # nothing came: the wait ran out, no record read
        assert time.monotonic() - started >= 0.45
        assert time.process_time() - cpu < 0.05
        with log.open("a") as f:
            f.write("3,1,2,-;NVRM: half a rec")
            f.flush()
            assert klog.wait(5) is True
            assert klog.read() == []  # the record is not whole yet
            f.write("ord\n")
        assert klog.wait(5) is True
        assert [(r.seq, r.message) for r in klog.read()] == [(1, "NVRM: half a record")]
    finally:
        klog.close()


def test_a_fifo_is_read_as_records_arrive(tmp_path):
    fifo = tmp_path / "dev/kmsg"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    klog = KernelLog(Root(str(tmp_path)))
    try:
        assert klog.kind == "fifo" and klog.read() == []
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"3,7,1,-;NVRM: Xid (PCI:0000:01:00): 79, x\n")
        assert klog.wait(5) is True
        assert [r.seq for r in klog.read()] == [7]
        os.close(fd)
        assert klog.wait(0.2) is False  # no writer left: no end-of-file busy loop
    finally:
        klog.close()


def test_records_left_by_a_bounded_read_are_read_without_waiting_for_another_event(tmp_path):
    """A read takes at most ``most`` records (memory bounded); what is left must not wait for
    an inotify event that will never come (bench/watch.py found 10,000 records half read)."""
    log = tmp_path / "dev/kmsg"
    log.parent.mkdir()
    log.write_text("")
    klog = KernelLog(Root(str(tmp_path)))
    try:
        log.write_text("".join(f"6,{n},{n},-;record {n}\n" for n in range(5000)))
        seen = []
        while klog.wait(2):
            batch = klog.read()
            if not batch:
                break
            assert len(batch) < 3000
            seen += [r.seq for r in batch]
        assert seen == list(range(5000))
    finally:
        klog.close()


def test_a_watch_json_of_the_wrong_shapes_is_read_as_ours_or_not_at_all(tmp_path):
    import json

    from podvm_gpu import watchfile

    path = tmp_path / watchfile.WATCH_PATH.lstrip("/")
    path.parent.mkdir(parents=True)
    root = Root(str(tmp_path))
    path.write_text(json.dumps({"version": 1, "warnings": ["x", 3], "kmsg_seq": True,
                                "warnings_dropped": "many", "finding": None}))
    doc = watchfile.load(root)
    assert (doc["warnings"], doc["kmsg_seq"], doc["warnings_dropped"]) == ([], None, 0)
    assert watchfile.add_warning(doc, "new") is True
    path.write_text(json.dumps({"version": 1, "finding": {"reason": 7}}))
    assert watchfile.load(root) is None and watchfile.standing_finding(root) is None
    path.write_text("[not json")
    assert watchfile.load(root) is None


@pytest.mark.parametrize("message", [
    "usb 1-1: reset required, device not accepting address",
    "mlx5_core 0000:3b:00.0: firmware: failed to load mellanox/mlx5.bin",
    "pcieport 0000:00:1c.0: BAR 14: no space for [mem size 0x00200000]"])
def test_another_devices_reset_or_firmware_words_are_no_finding_after_boot(message):
    assert verdicts.judge_record(message) == []


def test_the_drivers_own_reset_record_is_a_finding():
    [v] = verdicts.judge_record("NVRM: GPU 0000:01:00.0: GPU requires reset")
    assert v.level == FAIL and v.gpu == "00000000:01:00.0"


def test_boot_on_a_vm_whose_gpu_left_pci_fails_while_a_finding_stands(tmp_path):
    """A newcomer's finding: the standing-finding rule lived on the GPU path only, so a boot run
    again after an Xid 79 whose GPU then left PCI ended no-gpu (exit 0) while check's watch row
    failed. This machine's PCI has no NVIDIA GPU: the CPU path."""
    import json
    import subprocess
    import sys

    from podvm_gpu import boot
    from podvm_gpu.watchfile import WATCH_PATH, new_state

    assert boot.WATCH_PATH == WATCH_PATH  # the fast path's copy of the constant
    path = tmp_path / WATCH_PATH.lstrip("/")
    path.parent.mkdir(parents=True)
    finding = {"reason": "watch: GPU 0000:00:04.0: Xid 79 (fallen off the bus)",
               "gpu": "0000:00:04.0"}
    path.write_text(json.dumps({**new_state("t"), "finding": finding}))
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert done.returncode == 1 and status["state"] == "failed", (done.stdout, done.stderr)
    assert status["reason"].startswith("watch: a finding of the watcher stands: GPU "
                                       "0000:00:04.0: Xid 79"), status["reason"]
    path.unlink()  # cleared (watch --clear removes it): no-gpu again
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(
        (tmp_path / "run/podvm-gpu/status.json").read_text())["state"] == "no-gpu", done.stderr


# --- NVLink 5 Xids by their word, follow-ons (issue 46 item 3; the records' shapes from
# NVSentinel#748, gpud PRs #1160/#1174, open-gpu-kernel-modules#1150) ---------------------------

NETIR_NONFATAL = ("NVRM: Xid (PCI:0019:01:00): 149, NETIR_LINK_EVT Nonfatal XC0 i0 Link 00 "
                  "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
RLW_FATAL = ("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Fatal XC0 i0 Link 13 "
             "(0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")


def test_an_nvlink5_xid_that_says_nonfatal_is_a_warning_whatever_its_code():
    [v] = verdicts.judge_record(NETIR_NONFATAL)
    assert (v.level, v.gpu) == (WARN, "00000019:01:00.0")
    assert "Xid 149 (NVLink NETIR_LINK_EVT Nonfatal)" in v.what


def test_an_nvlink5_xid_that_says_fatal_is_a_finding_whatever_its_code():
    [v] = verdicts.judge_record(RLW_FATAL)
    assert (v.level, v.gpu) == (FAIL, "00000018:01:00.0")
    assert "Xid 145 (NVLink RLW_RXPIPE Fatal)" in v.what


@pytest.mark.parametrize("code", range(144, 151))
def test_the_word_decides_for_every_code_144_to_150(code):
    fatal = NETIR_NONFATAL.replace("149,", f"{code},").replace("Nonfatal", "Fatal")
    assert [v.level for v in verdicts.judge_record(fatal)] == [FAIL]
    nonfatal = NETIR_NONFATAL.replace("149,", f"{code},")
    assert [v.level for v in verdicts.judge_record(nonfatal)] == [WARN]
    neither = f"NVRM: Xid (PCI:0019:01:00): {code}, NETIR_LINK_EVT XC0 i0 Link 00 (0x0)"
    assert [v.level for v in verdicts.judge_record(neither)] == [WARN]


def test_fatal_only_counts_as_the_word_after_the_code():
    # a word elsewhere (a process name) is not the driver's severity
    message = "NVRM: Xid (PCI:0019:01:00): 149, pid=1, name=Fatal, Ch 00000001"
    assert [v.level for v in verdicts.judge_record(message)] == [WARN]
    # another code's record saying Fatal keeps its code's verdict
    assert [v.level for v in verdicts.judge_record(
        "NVRM: Xid (PCI:0019:01:00): 31, RLW_RXPIPE Fatal XC0")] == [WARN]


FOLLOW_ON = ("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by "
             "previous Xid 149")


def test_a_follow_on_of_an_xid_seen_is_no_verdict_of_its_own():
    seen: set[int] = set()
    [first] = verdicts.judge_record(NETIR_NONFATAL, seen)
    assert first.level == WARN and seen == {149}
    assert verdicts.judge_record(FOLLOW_ON, seen) == []
    assert seen == {149}  # counted as 149's follow-on: not as 45, not again as 149


def test_a_follow_on_of_an_xid_never_seen_is_its_own_code():
    seen: set[int] = set()
    [v] = verdicts.judge_record(FOLLOW_ON, seen)
    assert v.level == WARN and "Xid 45 on GPU 0000:dc:00" in v.what
    assert seen == {45}


def test_the_watcher_carries_the_codes_it_has_read_from_record_to_record():
    from podvm_gpu.config.model import Config
    from podvm_gpu.host.kmsg import Record
    from podvm_gpu.watch.command import Watcher

    warned = []
    watcher = Watcher.__new__(Watcher)
    watcher.finding, watcher.state, watcher.xids_seen = None, {"kmsg_seq": 0}, set()
    watcher.config = Config()
    watcher._verdicts = lambda found, unread, **kw: warned.extend(v.what for v in found)
    watcher._records([Record(1, 4, NETIR_NONFATAL, 10, True), Record(2, 4, FOLLOW_ON, 11, True),
                      Record(3, 4, FOLLOW_ON.replace("149", "79"), 12, True)])
    assert len(warned) == 2 and "Xid 149" in warned[0] and "Xid 45" in warned[1], warned
