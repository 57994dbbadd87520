"""PCI discovery under umockdev (podvm_gpu.host.sysfs, podvm_gpu.model.classify; contract section
3 step 1), held equal to pyudev's enumeration (libudev's view, the contract's "with pyudev") on
every tree, and boot on a GPU VM with an empty root.

The device trees are tests/umockdev/*.umockdev (README.md there). Each test runs the real code in
a subprocess under ``umockdev-run``, so libudev and plain reads of /sys both see only the tree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from podvm_gpu.model import classify

TREES = Path(__file__).resolve().parent / "umockdev"

DISCOVER = """
import json
import pyudev
from podvm_gpu.host.sysfs import discover, scan_nvidia
from podvm_gpu.model import classify
from podvm_gpu.pci_ids import device_name

def attr(dev, name):
    try:
        return dev.attributes.asstring(name).strip().lower().removeprefix("0x")
    except (KeyError, UnicodeDecodeError):
        return ""

def by_libudev():  # what pyudev (libudev) reports for the same functions
    out = {"gpus": [], "nvswitches": []}
    for dev in pyudev.Context().list_devices(subsystem="pci"):
        vendor, cls = attr(dev, "vendor").zfill(4), attr(dev, "class").zfill(6)
        kind = classify(vendor, cls)
        if kind is None:
            continue
        did = attr(dev, "device").zfill(4)
        out["gpus" if kind == "gpu" else "nvswitches"].append({
            "pci_address": dev.properties.get("PCI_SLOT_NAME") or dev.sys_name,
            "vendor_id": vendor, "device_id": did, "class_code": cls,
            "driver": dev.driver or None,
            "name": device_name(did, dev.properties.get("ID_MODEL_FROM_DATABASE"))})
    return {k: sorted(v, key=lambda d: d["pci_address"]) for k, v in out.items()}

scanned, nvidia = scan_nvidia()
gpus, switches = discover(nvidia)
print(json.dumps({"gpus": [g.to_dict() for g in gpus], "nvswitches": [s.to_dict() for s in switches],
                  "scanned": scanned, "nvidia": nvidia, "libudev": by_libudev()}))
"""


def umockdev_tree(name: str) -> Path:
    return TREES / f"{name}.umockdev"


def discover_in(tree: str, umockdev_run: str) -> dict:
    """What discover() and scan_nvidia() report under a device tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODVM_GPU_")}
    done = subprocess.run([umockdev_run, "-d", str(umockdev_tree(tree)), "--", sys.executable,
                           "-c", DISCOVER], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tree_functions(tree: str) -> list[dict]:
    """The PCI functions of a tree file: slot, vendor, class, driver (for expectations)."""
    out = []
    for block in umockdev_tree(tree).read_text().strip().split("\n\n"):
        props = dict(re.findall(r"^E: (\w+)=(.*)$", block, re.M))
        attrs = dict(re.findall(r"^A: (\w+)=(.*?)(?:\\n)?$", block, re.M))
        out.append({"slot": props["PCI_SLOT_NAME"], "vendor": attrs["vendor"],
                    "class": attrs["class"], "driver": props.get("DRIVER")})
    return out


@pytest.fixture(scope="module")
def discovered(umockdev_run):
    """discover_in() for every tree, computed once."""
    cache: dict[str, dict] = {}

    def get(tree: str) -> dict:
        if tree not in cache:
            cache[tree] = discover_in(tree, umockdev_run)
        return cache[tree]

    return get


# --- classification rule (pure) --------------------------------------------------------------------

@pytest.mark.parametrize("vendor, class_code, kind", [
    ("0x10de", "0x030200", "gpu"),        # 3D controller (data-center GPUs)
    ("0x10de", "0x030000", "gpu"),        # VGA compatible controller (consumer GPUs)
    ("10de", "030200", "gpu"),
    ("0x10DE", "0x0302FF", "gpu"),        # the low 8 bits (prog-if) do not matter
    ("0x10de", "0x068000", "nvswitch"),   # bridge, other
    ("0x10de", "0x040300", None),         # HDMI audio function of a consumer GPU
    ("0x10de", "0x030100", None),         # XGA controller: not in the contract's list
    ("0x10de", "0x060400", None),         # PCI bridge
    ("0x10de", "0x0380", None),           # a 16-bit class: the top 16 bits are 0x0003
    ("0x1234", "0x030000", None),         # QEMU's emulated VGA
    ("0x1af4", "0x030200", None),         # not NVIDIA
    ("0x1de0", "0x030200", None),         # a near miss of 10de
])
def test_classify_compares_vendor_and_the_top_16_class_bits_exactly(vendor, class_code, kind):
    assert classify(vendor, class_code) == kind


# --- discovery under umockdev ----------------------------------------------------------------------

def test_cpu_vm_has_no_gpu_and_no_nvswitch(discovered):
    found = discovered("cpu-vm")

    assert found["gpus"] == [] and found["nvswitches"] == []
    assert found["scanned"] == len(tree_functions("cpu-vm")) == 3
    assert found["nvidia"] == []


def test_one_h100_pcie_is_found_unbound(discovered):
    found = discovered("h100-pcie")

    assert found["gpus"] == [{"pci_address": "0000:00:04.0", "vendor_id": "10de",
                              "device_id": "2331", "class_code": "030200", "driver": None,
                              "name": "H100 PCIe"}]
    assert found["nvswitches"] == []


def test_hgx_h200_has_8_gpus_bound_to_nvidia_and_4_nvswitches(discovered):
    found = discovered("hgx-h200-8gpu-4nvswitch")

    gpus, switches = found["gpus"], found["nvswitches"]
    assert [g["pci_address"] for g in gpus] == [
        "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]
    assert {(g["device_id"], g["class_code"], g["driver"], g["name"]) for g in gpus} == \
        {("2335", "030200", "nvidia", "H200")}
    assert [s["pci_address"] for s in switches] == [
        "0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    assert {(s["device_id"], s["class_code"], s["driver"]) for s in switches} == \
        {("22a3", "068000", None)}
    assert all("NVSwitch" in s["name"] for s in switches)


def test_root_ports_and_emulated_devices_are_ignored(discovered):
    found = discovered("hgx-h200-8gpu-4nvswitch")

    listed = {d["pci_address"] for d in found["gpus"] + found["nvswitches"]}
    ignored = [f["slot"] for f in tree_functions("hgx-h200-8gpu-4nvswitch")
               if f["slot"] not in listed]
    assert len(ignored) == 15  # host bridge, VGA, virtio-net, 12 root ports
    assert found["scanned"] == 27


def test_gpu_bound_to_nouveau_reports_that_driver(discovered):
    (gpu,) = discovered("gpu-bound-to-nouveau")["gpus"]

    assert gpu["pci_address"] == "0000:00:05.0"
    assert gpu["driver"] == "nouveau"
    assert gpu["name"] == "T4"


def test_consumer_gpu_is_found_and_its_audio_function_ignored(discovered):
    found = discovered("consumer-gpu-with-audio")

    assert [(g["pci_address"], g["class_code"]) for g in found["gpus"]] == \
        [("0000:01:00.0", "030000")]
    assert found["gpus"][0]["name"] == "10de:2204"  # no udev hardware database in tests
    assert found["nvswitches"] == []


@pytest.mark.parametrize("tree", ["cpu-vm", "h100-pcie", "hgx-h200-8gpu-4nvswitch",
                                  "gpu-bound-to-nouveau", "consumer-gpu-with-audio"])
def test_sysfs_prescan_sees_the_same_nvidia_functions_as_the_tree(discovered, tree):
    found = discovered(tree)
    functions = tree_functions(tree)

    assert found["scanned"] == len(functions)
    assert found["nvidia"] == sorted(f["slot"] for f in functions if f["vendor"] == "0x10de")
    listed = {d["pci_address"] for d in found["gpus"] + found["nvswitches"]}
    assert listed <= set(found["nvidia"])


ALL_TREES = sorted(p.name.removesuffix(".umockdev") for p in TREES.glob("*.umockdev"))


@pytest.mark.parametrize("tree", ALL_TREES)
def test_sysfs_discovery_equals_pyudevs_enumeration(discovered, tree):
    found = discovered(tree)

    assert {"gpus": found["gpus"], "nvswitches": found["nvswitches"]} == found["libudev"]


def test_sysfs_discovery_reads_the_driver_link_and_udevs_model_name(tmp_path):
    from podvm_gpu.host.sysfs import discover

    pci, data = tmp_path / "sys/bus/pci/devices", tmp_path / "run/udev/data"
    for address, cls, driver in (("0000:00:04.0", "0x030200", "vfio-pci"),
                                 ("0000:00:05.0", "0x030200", None),
                                 ("0000:00:06.0", "0x040300", None)):  # an audio function
        dev = pci / address
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "device").write_text("0x2999\n")  # not in pci_ids.py
        (dev / "class").write_text(cls + "\n")
        if driver:
            (tmp_path / "sys/bus/pci/drivers" / driver).mkdir(parents=True)
            (dev / "driver").symlink_to(tmp_path / "sys/bus/pci/drivers" / driver)
    data.mkdir(parents=True)
    (data / "+pci:0000:00:04.0").write_text("I:123\nE:ID_MODEL_FROM_DATABASE=GA100 [A100 "
                                           "SXM4 80GB]\nE:ID_VENDOR_FROM_DATABASE=NVIDIA\n")

    gpus, switches = discover(sys_pci=str(pci), udev_data=str(data))

    assert [(g.pci_address, g.driver, g.name) for g in gpus] == [
        ("0000:00:04.0", "vfio-pci", "GA100 [A100 SXM4 80GB]"),
        ("0000:00:05.0", None, "10de:2999")]
    assert switches == []


# --- boot on a GPU VM under umockdev ----------------------------------------------------------------

def boot(podvm, tree: str, root, empty_path: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = podvm(["boot", "--root", str(root)], tree=tree, env={"PATH": empty_path})
    status = json.loads((root / "run" / "podvm-gpu" / "status.json").read_text())
    return done, status


def test_h100_with_an_empty_root_fails_at_a_named_step_and_writes_the_unavailable_spec(
        tmp_path, podvm, empty_path):
    """The issue's acceptance test: no NVIDIA tools and nothing under the root, so the modules
    step cannot run modprobe. Boot must end failed (exit 1), never ready, and say why."""
    root = tmp_path / "root"
    root.mkdir()

    done, status = boot(podvm, "h100-pcie", root, empty_path)

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert status["state"] == "failed"
    assert not done.stdout.startswith("ready")
    assert status["reason"].startswith("modules: ")
    assert status["gpus"][0]["pci_address"] == "0000:00:04.0"
    results = {s["name"]: s["result"] for s in status["steps"]}
    assert results["detect"] == "ok" and results["drivers"] == "ok"
    assert results["modules"] == "failed"
    assert "versions" not in results and "cdi" not in results
    spec = yaml.safe_load((root / "var" / "run" / "cdi" / "nvidia.yaml").read_text())
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert "PODVM_GPU_STATE=failed" in spec["devices"][0]["containerEdits"]["env"]


def test_h100_boot_reason_says_that_modprobe_is_missing(tmp_path, podvm, empty_path):
    """A modprobe that is not on PATH never ran: the reason must say so, not "exit None"."""
    root = tmp_path / "root"
    root.mkdir()

    _, status = boot(podvm, "h100-pcie", root, empty_path)

    assert "modprobe" in status["reason"]
    assert "not found" in status["reason"]
    assert "None" not in status["reason"]


def test_boot_stops_at_drivers_when_nouveau_owns_the_gpu(tmp_path, podvm, empty_path):
    root = tmp_path / "root"
    root.mkdir()

    done, status = boot(podvm, "gpu-bound-to-nouveau", root, empty_path)

    assert done.returncode == 1
    assert status["state"] == "failed"
    assert status["reason"].startswith("drivers: ")
    assert "nouveau" in status["reason"] and "0000:00:05.0" in status["reason"]
    assert [s["name"] for s in status["steps"]] == ["detect", "drivers"]


def test_cpu_vm_boot_ends_no_gpu_with_the_unavailable_spec(tmp_path, podvm, empty_path):
    root = tmp_path / "root"
    root.mkdir()

    done, status = boot(podvm, "cpu-vm", root, empty_path)

    assert done.returncode == 0
    assert status["state"] == "no-gpu"
    assert status["reason"] == "detect: no NVIDIA GPU on PCI (3 devices scanned)"
    spec = yaml.safe_load((root / "var" / "run" / "cdi" / "nvidia.yaml").read_text())
    assert "PODVM_GPU_STATE=no-gpu" in spec["devices"][0]["containerEdits"]["env"]


def test_consumer_gpu_boot_lists_the_gpu_but_not_its_audio_function(tmp_path, podvm, empty_path):
    """The audio function has NVIDIA's vendor id, so the pre-scan sends boot down the pyudev
    path; there the GPU at .0 is found and the audio function at .1 is not listed."""
    root = tmp_path / "root"
    root.mkdir()

    _, status = boot(podvm, "consumer-gpu-with-audio", root, empty_path)

    assert [g["pci_address"] for g in status["gpus"]] == ["0000:01:00.0"]


def test_the_status_lists_nvswitches_even_when_boot_fails(tmp_path, podvm, empty_path):
    root = tmp_path / "root"
    root.mkdir()

    done, status = boot(podvm, "hgx-h200-8gpu-4nvswitch", root, empty_path)

    assert done.returncode == 1
    assert len(status["gpus"]) == 8 and len(status["nvswitches"]) == 4


def test_a_pyudev_object_a_signal_left_half_built_is_dropped_without_a_traceback():
    """A SIGHUP during ``pyudev.Context()`` (it runs ``ldconfig -p``) left a Context with its
    library and no handle; dropping it printed ``Exception ignored in ... ArgumentError`` on
    boot's stderr (seen once in a full run of test_boot_signals.py, 2026-12-02)."""
    import pyudev

    from podvm_gpu.host import udev

    library = pyudev.Context()._libudev
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        for kind in (pyudev.Context, udev._Context, udev._Monitor):
            half = kind.__new__(kind)
            half._libudev = library  # what a signal after the library's load leaves
            del half
    finally:
        sys.unraisablehook = hook
    # pyudev's own class fails as the boot did; the boot's do not
    assert [type(u.exc_value).__name__ for u in unraisable] == ["ArgumentError"], unraisable
