"""Floods bounded (issue 46 item 4): Blackwell's Xid 62/45 -> 119 -> 154 loop repeats a line
every 5 s, up to 16,879 times a boot. Identical records are one warning with a count and first
and last times (watch.json), said a few times in the watcher's log, one entry in status.json,
and counted in ``podvm_gpu_watch_warnings_repeated``; nvidia-smi's ``[GPU requires reset]``
value is the recovery action GPU Reset (open-gpu-kernel-modules#1045)."""

from __future__ import annotations

import json
import os

from smi_facts import smi_facts
from test_check_units import _watch_root
from test_gpufacts_agreement import BUS, FACTS, Runner

from podvm_gpu import watchfile
from podvm_gpu.gpufacts import judge, smi, words
from podvm_gpu.status import read_status

XID_45 = "NVRM: Xid (PCI:0000:00:04): 45, pid=1818990, name=python3, Ch 00000001"


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_20000_identical_warning_records_are_one_entry_and_memory_stays_bounded(tmp_path):
    from podvm_gpu.config.model import Config
    from podvm_gpu.host.kmsg_follow import KernelLog
    from podvm_gpu.watch.command import Watcher

    root = _watch_root(tmp_path, "ready")
    doc = read_status(root)
    gpu = doc["gpus"][0]["pci_address"]
    xid = XID_45.replace("0000:00:04", gpu.rsplit(".", 1)[0])
    kmsg = os.path.join(root.path, "dev", "kmsg")
    os.makedirs(os.path.dirname(kmsg), exist_ok=True)
    with open(kmsg, "w") as f:
        f.writelines(f"4,{seq},{seq * 5_000_000},-;{xid}\n" for seq in range(1, 20001))
    said = []
    log = lambda priority, text: said.append(text)  # noqa: E731
    log.ERR, log.WARNING, log.INFO = 3, 4, 6
    watcher = Watcher(root, Config(), doc, log)
    watcher.state["kmsg_seq"] = 0
    klog = KernelLog(root)
    before = _rss_kib()
    try:
        while True:
            batch = klog.read()
            if not batch:
                break
            watcher._records(batch)
    finally:
        klog.close()
    watcher._save()
    grown = _rss_kib() - before
    assert grown < 8 * 1024, f"RSS grew {grown} KiB"
    assert watcher.finding is None  # a warning stays a warning however often
    saved = watchfile.load(root)
    [entry] = saved["warnings"]
    assert entry["count"] == 20000 and "Xid 45" in entry["text"]
    assert entry["first_at"] and entry["last_at"] and entry["first_at"] <= entry["last_at"]
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert len([w for w in status["warnings"] if w.startswith("watch: ")]) == 1
    # the log: the first one, then at 10, 100, 1000 and 10000 repeats, not 20,000 lines
    xid_lines = [line for line in said if "Xid 45" in line]
    assert len(xid_lines) == 5, xid_lines
    assert "repeated: 10000 times since" in xid_lines[-1]
    from podvm_gpu.metrics.families import watch_families

    values = {f.name: f.samples[0].value for f in watch_families(saved) if f.samples}
    assert values["podvm_gpu_watch_warnings_repeated"] == 19999
    assert values["podvm_gpu_watch_warnings"] == 20000


def test_gpu_requires_reset_as_a_value_is_the_recovery_action_gpu_reset():
    action = judge.action_of(words.GPU_REQUIRES_RESET)
    assert action is not None and action.name == judge.GPU_RESET and action.kind == judge.RESET


def test_gpu_requires_reset_in_any_column_asks_for_a_reset_at_boot_check_and_metrics():
    from podvm_gpu.gpufacts import health

    runner = Runner(FACTS["healthy"])
    runner.answers[tuple(smi.ecc_argv())] = (0, f"{BUS}, [GPU requires reset], "
                                                f"[GPU requires reset]\n")
    for argv in (smi.fabric_argv(), smi.fabric_health_argv()):  # not offered: no fabric
        runner.answers[tuple(argv)] = (2, 'Field "fabric.state" is not a valid field to query.')
    facts = smi_facts(runner, 5)[words.bus_id(BUS)]
    assert judge.facts_verdicts(facts, False)["recovery-action"] == words.FAIL
    assert judge.facts_verdicts(facts, True)["recovery-action"] == words.WARN
    found = []
    kept = health.judge_lost([[BUS, "[GPU requires reset]", "[GPU requires reset]"]], False, found)
    assert kept == [] and [(f.level, f.action) for f in found] == [(words.FAIL, "reset")]
    assert "GPU reset needed" in found[0].what
