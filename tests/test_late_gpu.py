"""GPUs that appear late (issue 10): VMBus PCI pass-through channels read from sysfs
(podvm_gpu.host.sysfs), the wait detect plans and how it tells it (podvm_gpu.boot.late), the wait on
udev events under umockdev (podvm_gpu.host.udev.wait_for_pci), and boot and check on Hyper-V
device trees (tests/umockdev/hyperv-*.umockdev). The whole boots are the scenarios S13-S17.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from scenarios import testbed
from scenarios.world import OWN_CASES, World, load_case
from test_boot_ends import product_pid
from test_cli import imported_modules

from podvm_gpu.boot.late import LateWait, plan_wait
from podvm_gpu.host import sysfs

PCIE = "{44c4f61d-4444-4400-9d52-802e27ede19f}"
NET = "{f8615163-df3e-46c5-913f-f2d2f965ed0e}"
GPU_CHANNEL = "47505500-0001-0000-3130-444532333331"
UNBOUND_CHANNEL = "47505500-0002-0000-3130-444532333331"
# generation 1 guests: where a 5.15 Azure kernel put it (lore.kernel.org report, sysfs warning)
GEN1_VMBUS = "/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00/device:07/VMBUS:01"


# --- reading sysfs: folders laid out as the kernel lays them out -----------------------------

def add_channel(sys_dir: Path, instance: str, class_id: str, driver: str | None = "hv_pci",
                parent: str = testbed.VMBUS_PARENT) -> str:
    devpath = f"{parent}/{instance}"
    folder = sys_dir / devpath.lstrip("/")
    folder.mkdir(parents=True)
    (folder / "class_id").write_text(class_id + "\n")
    if driver:
        (folder / "driver").symlink_to(f"{testbed.up_to_sys(devpath)}bus/vmbus/drivers/{driver}")
    bus = sys_dir / "bus" / "vmbus" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / instance).symlink_to(f"../../..{devpath}")
    return devpath


def add_function(sys_dir: Path, parent: str, address: str, vendor: str = "0x10de",
                 cls: str = "0x030200") -> None:
    domain, bus_number = address.split(":")[:2]
    devpath = f"{parent}/pci{domain}:{bus_number}/{address}" if "VMBUS" in parent else \
        f"{parent}/{address}"
    folder = sys_dir / devpath.lstrip("/")
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "class").write_text(cls + "\n")
    bus = sys_dir / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / address).symlink_to(f"../../..{devpath}")


def coming(sys_dir: Path) -> list[sysfs.PciChannel]:
    return sysfs.channels_without_pci(str(sys_dir / "bus/vmbus/devices"),
                                      str(sys_dir / "bus/pci/devices"))


def test_a_pass_through_channel_without_its_pci_function_is_a_device_on_its_way(tmp_path):
    add_channel(tmp_path, GPU_CHANNEL, PCIE)
    add_channel(tmp_path, "000d3a6e-b4c2-000d-3a6e-b4c2000d3a6e", NET, "hv_netvsc")

    assert coming(tmp_path) == [sysfs.PciChannel(GPU_CHANNEL, "hv_pci")]
    assert coming(tmp_path)[0].describe() == (
        f"VMBus PCI pass-through channel {GPU_CHANNEL} (hv_pci, PCI domain 0001 asked for)")


def test_a_function_below_its_channel_counts_whatever_domain_the_kernel_gave_it(tmp_path):
    """hv_pci takes another domain when the one it asks for is taken: match by sysfs path."""
    channel = add_channel(tmp_path, GPU_CHANNEL, PCIE)
    other = add_channel(tmp_path, UNBOUND_CHANNEL, PCIE)
    add_function(tmp_path, channel, "0003:00:00.0")  # a collision moved it from 0001

    assert [c.instance for c in coming(tmp_path)] == [UNBOUND_CHANNEL]
    add_function(tmp_path, other, "0002:00:00.0")
    assert coming(tmp_path) == []


def test_on_a_generation_1_guest_vmbus_sits_elsewhere_and_functions_still_match(tmp_path):
    channel = add_channel(tmp_path, "47505500-0001-0000-3130-444531454238", PCIE,
                          parent=GEN1_VMBUS)
    assert len(coming(tmp_path)) == 1
    add_function(tmp_path, channel, "0001:00:00.0")
    assert coming(tmp_path) == []


def test_synthetic_channels_and_a_vm_without_vmbus_announce_nothing(tmp_path):
    assert coming(tmp_path) == []  # no /sys/bus/vmbus at all: not a Hyper-V guest
    add_channel(tmp_path, "000d3a6e-b4c2-000d-3a6e-b4c2000d3a6e", NET, "hv_netvsc")
    add_channel(tmp_path, "f8b3781b-1e82-4818-a1c3-63d806ec15bb",
                "{ba6163d9-04a1-4d29-b605-72e2ffb1dc7f}", "hv_storvsc")
    assert sysfs.pci_channels(str(tmp_path / "bus/vmbus/devices")) == []


def test_class_id_is_read_as_hv_vmbus_prints_it_and_an_unbound_channel_says_so(tmp_path):
    add_channel(tmp_path, GPU_CHANNEL, PCIE.upper(), driver=None)

    [channel] = coming(tmp_path)
    assert channel.driver is None
    assert "(no driver bound, PCI domain 0001 asked for)" in channel.describe()


# --- what detect plans and says ---------------------------------------------------------------

def test_nothing_coming_plans_no_wait():
    assert plan_wait([], 0, 0, 60, 240) is None
    assert plan_wait([], 1, 1, 60, 240) is None  # the expected GPU is there
    assert plan_wait([], 2, 1, 60, 240).expected_gpus == 2


def test_the_wait_is_cut_to_what_the_boot_budget_has_left():
    channel = sysfs.PciChannel(GPU_CHANNEL, "hv_pci")
    assert plan_wait([channel], 0, 0, 60, 240).limit() == "60 s (detect.late_gpu_wait_s)"
    assert plan_wait([channel], 0, 0, 60, 12.34).limit() == "12.3 s (what the boot budget had left)"


def test_a_wait_that_ends_short_names_each_channel_the_count_and_the_limit():
    late = LateWait([sysfs.PciChannel(GPU_CHANNEL, "hv_pci")], 2, 5, "detect.late_gpu_wait_s")
    late.run(lambda ready, timeout_s: (False, "udev events watched"))

    assert late.failure() == (
        f"timed out after 5 s: VMBus PCI pass-through channel {GPU_CHANNEL} (hv_pci, PCI domain "
        "0001 asked for) announced a PCI device that did not appear; only 0 of the 2 GPU(s) the "
        "image expects (detect.expected_gpus) appeared on PCI (detect.late_gpu_wait_s; udev "
        "events watched)")


# --- the wait itself, under umockdev ----------------------------------------------------------

WAIT = """
import json, os, sys, time
import pyudev
if sys.argv[1] == "no-monitor":
    def refuse(*args, **kwargs):
        raise OSError("Could not create udev monitor")
    pyudev.Monitor.from_netlink = refuse
from podvm_gpu.host.udev import wait_for_pci
started = time.monotonic()
done, how = wait_for_pci(lambda: os.path.exists("/sys/bus/pci/devices/0001:00:00.0"), 20,
                         recheck_s=30)
print(json.dumps([done, how, time.monotonic() - started]))
"""
LATE_GPU = {"address": "0001:00:00.0", "vendor": "0x10de", "device": "0x2331",
            "class": "0x030200", "vmbus": GPU_CHANNEL}


def wait_in_testbed(tmp_path: Path, umockdev_run: str, mode: str, send: bool) -> tuple:
    """Run wait_for_pci under umockdev (tree hyperv-vpci-empty), add the GPU to the live
    testbed 0.5 s after the wait's monitor is up (or after start, without one), with or without
    its add uevent; return (done, how, waited_s, seconds from the add to the return)."""
    tree = Path(__file__).parent / "umockdev" / "hyperv-vpci-empty.umockdev"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[1])}
    process = subprocess.Popen([umockdev_run, "-d", str(tree), "--", sys.executable, "-c", WAIT,
                                mode], stdout=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            beds = testbed.live_testbeds(str(tmp_path))
            if beds and (mode == "no-monitor" or list(Path(beds[0]).glob("event*"))):
                break
            time.sleep(0.02)
        time.sleep(0.5)
        record = testbed.pci_record(LATE_GPU, None)
        devpath = testbed.add_live_device(beds[0], record)
        added = time.monotonic()
        if send:
            message = testbed.uevent_message(devpath, "add", testbed.parse_record(record)[1], 1)
            assert testbed.send_uevent(beds[0], message) == 1
        out, _ = process.communicate(timeout=40)
    finally:
        process.kill()
    done, how, waited = json.loads(out)
    return done, how, waited, time.monotonic() - added


def test_an_add_uevent_wakes_the_wait_at_once(tmp_path, umockdev_run):
    done, how, waited, after_add = wait_in_testbed(tmp_path, umockdev_run, "monitor", send=True)

    assert done and how == "udev events watched"
    assert after_add < 2, f"returned {after_add:.2f} s after the add (re-check every 30 s)"


def test_without_a_udev_monitor_the_wait_polls_sysfs(tmp_path, umockdev_run):
    done, how, waited, after_add = wait_in_testbed(tmp_path, umockdev_run, "no-monitor",
                                                   send=False)

    assert done
    assert how == "sysfs polled every 0.25 s: no udev monitor (Could not create udev monitor)"
    assert after_add < 2


# --- boot and check on Hyper-V trees ----------------------------------------------------------

def write_config(root: Path, text: str) -> None:
    (root / "etc" / "podvm-gpu").mkdir(parents=True)
    (root / "etc" / "podvm-gpu" / "config.yaml").write_text(text)


def status_of(root: Path) -> dict:
    return json.loads((root / "run" / "podvm-gpu" / "status.json").read_text())


def test_a_hyperv_cpu_vm_ends_no_gpu_without_importing_pyudev_the_config_or_the_wait(
        tmp_path, podvm, empty_path):
    """Synthetic channels and a NIC VF on PCI below its pass-through channel: nothing coming."""
    done = podvm(["boot", "--root", str(tmp_path)], tree="hyperv-cpu-vm",
                 python_args=["-X", "importtime"], env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    assert "pyudev" not in imported_modules(done.stderr)
    assert "podvm_gpu.boot.late" not in done.stderr and "podvm_gpu.config" not in done.stderr
    status = status_of(tmp_path)
    assert status["state"] == "no-gpu"
    assert status["steps"][0]["message"] == "no NVIDIA GPU on PCI (1 devices scanned)"


def test_channels_that_stay_empty_fail_the_boot_within_the_wait_naming_each(
        tmp_path, podvm, empty_path):
    write_config(tmp_path, "detect: {late_gpu_wait_s: 1}\n")
    started = time.monotonic()
    done = podvm(["boot", "--root", str(tmp_path)], tree="hyperv-vpci-empty",
                 env={"PATH": empty_path})
    took = time.monotonic() - started

    assert done.returncode == 1, done.stderr
    assert 1 <= took < 5, took
    reason = status_of(tmp_path)["reason"]
    assert reason.startswith(f"detect: timed out after 1 s: VMBus PCI pass-through channel {GPU_CHANNEL} (hv_pci, ")
    assert f"{UNBOUND_CHANNEL} (no driver bound, PCI domain 0002 asked for) announced" in reason
    assert " (detect.late_gpu_wait_s; udev events watched)" in reason
    assert "waiting up to 1 s (detect.late_gpu_wait_s) for the PCI device of " in done.stderr


def test_fewer_gpus_than_the_image_expects_fail_the_boot_after_the_wait(tmp_path, podvm,
                                                                        empty_path):
    write_config(tmp_path, "detect: {expected_gpus: 2, late_gpu_wait_s: 1}\n")
    done = podvm(["boot", "--root", str(tmp_path)], tree="h100-pcie", env={"PATH": empty_path})

    assert done.returncode == 1, done.stderr
    status = status_of(tmp_path)
    assert status["reason"] == ("detect: timed out after 1 s: only 1 of the 2 GPU(s) the image "
                                "expects (detect.expected_gpus) appeared on PCI "
                                "(detect.late_gpu_wait_s; udev events watched)")
    assert len(status["gpus"]) == 1 and len(status["steps"]) == 1  # no GPU step ran


def test_dry_run_names_the_wait_a_boot_would_make_and_does_not_wait(tmp_path, podvm,
                                                                    empty_path):
    started = time.monotonic()
    done = podvm(["boot", "--root", str(tmp_path), "--dry-run"], tree="hyperv-vpci-empty",
                 env={"PATH": empty_path})

    assert time.monotonic() - started < 5  # the default wait is 60 s
    assert "a boot would wait up to 60 s (detect.late_gpu_wait_s) for the PCI device of " \
           f"VMBus PCI pass-through channel {GPU_CHANNEL}" in done.stdout
    assert not (tmp_path / "run").exists()


def test_check_pci_names_the_empty_channel_and_the_missing_driver_first(tmp_path, podvm,
                                                                         empty_path):
    done = podvm(["check", "--root", str(tmp_path), "--json"], tree="hyperv-vpci-empty",
                 env={"PATH": empty_path})

    pci = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "pci")
    assert done.returncode == 1
    assert pci["result"] == "fail"
    assert pci["detail"].startswith(f"VMBus PCI pass-through channel {UNBOUND_CHANNEL} (no "
                                    "driver bound, PCI domain 0002 asked for) has no PCI device "
                                    "(and 1 more such channel(s))")
    assert "modprobe pci-hyperv" in pci["hint"]


def test_check_pci_fails_with_fewer_gpus_than_expected(tmp_path, podvm, empty_path):
    write_config(tmp_path, "detect: {expected_gpus: 2}\n")
    done = podvm(["check", "--root", str(tmp_path), "--json"], tree="h100-pcie",
                 env={"PATH": empty_path})

    pci = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "pci")
    assert (pci["result"], pci["detail"]) == (
        "fail", "1 of the 2 GPU(s) the image expects (detect.expected_gpus) are on PCI")


def test_sigterm_during_the_wait_ends_the_boot_failed_naming_detect():
    case = load_case(OWN_CASES / "S14-hyperv-gpu-never-arrives.yaml")
    case.files["etc/podvm-gpu/config.yaml"] = "detect: {late_gpu_wait_s: 60}\n"
    took = {}

    def interrupt(process):
        status = Path(world.path("/run/podvm-gpu/status.json"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "waiting up to" not in (
                status.read_text() if status.exists() else ""):
            time.sleep(0.02)
        started = time.monotonic()
        os.kill(product_pid(process), signal.SIGTERM)
        process.wait(timeout=10)
        took["s"] = time.monotonic() - started

    with World(case) as world:
        run = world.run("boot", during=interrupt)

    assert took["s"] < 2
    assert run.rc == 1 and "Traceback" not in run.stderr
    assert run.status["state"] == "failed"
    assert run.status["reason"].startswith("detect: interrupted by SIGTERM"), run.status["reason"]
