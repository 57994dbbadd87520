"""The scenario harness's own tricky parts: rule matching, spec output paths, kmsg records, the
nvidia-smi Fabric merge, effects on a real temporary root, the umockdev tree under umockdev-run,
and VMBus channels and late PCI devices (a device added to the live testbed, its uevent)."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scenarios import effects as fx
from scenarios import testbed
from scenarios.fake_tool import argv_matches, find_rule, merge_fabric, owned_query
from scenarios.world import (
    DATA,
    OWN_CASES,
    SHARED,
    CaseError,
    World,
    kmsg_priority,
    kmsg_records,
    load_case,
    umockdev_tree,
)

GPU = {"address": "0000:00:05.0", "vendor": "0x10de", "device": "0x2331", "class": "0x030200",
       "driver": None, "subsystem_vendor": "0x10de", "subsystem_device": "0x1626"}
VGA = {"address": "0000:00:02.0", "vendor": "0x1234", "device": "0x1111", "class": "0x030000",
       "driver": "bochs-drm", "subsystem_vendor": "0x1af4", "subsystem_device": "0x1100"}


def rule(argv, **extra):
    return {"argv": argv, "rc": 0, "stdout": "", "stderr": "", "delay_s": 0, "effects": [], **extra}


def test_rule_argv_is_a_prefix_and_star_matches_any_one_argument():
    assert argv_matches(["nvidia-ctk", "cdi"], ["nvidia-ctk", "cdi", "generate", "--output="])
    assert argv_matches(["modprobe", "*"], ["modprobe", "nvidia_uvm"])
    assert not argv_matches(["modprobe", "*"], ["modprobe"])
    assert not argv_matches(["modprobe", "nvidia"], ["modprobe", "nvidia_uvm"])


def test_first_matching_rule_wins_and_only_before_skips_once_the_effect_applied():
    rules = [rule(["nvidia-smi"], delay_s=12, only_before={"daemon_ready": "persistenced"}),
             rule(["nvidia-smi", "-L"]), rule(["nvidia-smi"])]
    assert find_rule(rules, ["nvidia-smi", "-L"], []) == 0
    assert find_rule(rules, ["nvidia-smi", "-L"], ["daemon_ready=persistenced"]) == 1
    assert find_rule(rules, ["nvidia-smi", "-q"], ["daemon_ready=persistenced"]) == 2
    assert find_rule(rules, ["modprobe", "nvidia"], []) is None


@pytest.mark.parametrize("argv, path", [
    (["--output=/w/spec/nvidia.yaml"], "/w/spec/nvidia.yaml"),
    (["--output", "/w/spec/nvidia.json"], "/w/spec/nvidia.json"),
    (["--output=/w/run/cdi/.nvidia.tmp"], "/w/run/cdi/.nvidia.tmp.yaml"),
    (["--output="], None),
    (["--format=yaml"], None),
])
def test_spec_goes_where_nvidia_ctk_would_write_it(argv, path):
    assert fx.spec_output_path(["nvidia-ctk", "cdi", "generate", *argv]) == path


def test_format_json_prints_the_captured_yaml_spec_exactly_as_the_real_nvidia_ctk_did():
    fixtures = DATA / "fixtures" / "nvidia-ctk"

    text = fx.yaml_spec_as_json((fixtures / "spec-1gpu.yaml").read_text())

    assert text == (fixtures / "spec-1gpu.json").read_text()  # real 1.20.0 --format=json


def test_host_paths_get_the_dev_root_or_driver_root_nvidia_ctk_got():
    yaml_text = "    - path: /dev/nvidia0\n      hostPath: /dev/nvidia0\n  - hostPath: /usr/lib/libcuda.so\n"
    assert fx.prefix_host_paths(yaml_text, "/d", "/r") == (
        "    - path: /dev/nvidia0\n      hostPath: /d/dev/nvidia0\n  - hostPath: /r/usr/lib/libcuda.so\n")
    json_text = '{"hostPath":"/dev/nvidiactl","path":"/dev/nvidiactl"}'
    assert fx.prefix_host_paths(json_text, None, "/r/") == '{"hostPath":"/r/dev/nvidiactl","path":"/dev/nvidiactl"}'
    assert fx.prefix_host_paths(yaml_text, None, "/") == yaml_text


def test_kernel_log_is_written_as_kmsg_records():
    text = kmsg_records(["nvidia: loading out-of-tree module taints kernel.",
                         "NVRM: Xid (PCI:0000:01:00): 119, pid=812, name=nvidia-smi, Timeout",
                         "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15"])
    records = [re.fullmatch(r"(\d+),(\d+),(\d+),-;(.*)", line) for line in text.splitlines()]
    assert all(records)
    assert [int(r.group(1)) for r in records] == [4, 3, 6]
    assert [int(r.group(2)) for r in records] == [0, 1, 2]
    assert int(records[0].group(3)) < int(records[1].group(3)) < int(records[2].group(3))
    assert kmsg_priority("nvidia: module verification failed: signature and/or required key missing"
                         " - tainting kernel") == 4
    assert kmsg_priority("NVRM: failed to allocate memory") == 3


def test_fabric_block_is_merged_into_gpu_sections_that_lack_one():
    text = ("\n==============NVSMI LOG==============\n\nAttached GPUs : 2\n"
            "GPU 00000000:00:05.0\n    Product Name : A\n\n"
            "GPU 00000000:00:06.0\n    Product Name : B\n    Fabric\n        State : Completed\n")
    merged = merge_fabric(text, ["    Fabric", "        State : X"]).splitlines()
    assert merged[merged.index("    Product Name : A") + 1:][:2] == ["    Fabric", "        State : X"]
    assert merged.count("    Fabric") == 2


def test_which_nvidia_smi_calls_the_harness_answers():
    state = {"cc_ready_state": None}
    assert owned_query(["nvidia-smi", "-q"], state) == "full"
    assert owned_query(["nvidia-smi", "-q", "-d", "FABRIC", "-i", "0"], state) is None
    assert owned_query(["nvidia-smi", "-q", "-d", "MEMORY"], state) is None
    assert owned_query(["nvidia-smi", "--query-gpu=index,fabric.state", "--format=csv"], state) == "csv"
    assert owned_query(["nvidia-smi", "--query-gpu=mig.mode.current", "--format=csv"], state) is None
    assert owned_query(["nvidia-smi", "conf-compute", "-grs"], state) is None
    assert owned_query(["nvidia-smi", "conf-compute", "-grs"], {"cc_ready_state": "ready"}) == "cc"


def test_the_harness_refuses_what_every_real_nvidia_smi_refuses():
    from scenarios.fake_tool import refusal
    assert refusal(["nvidia-smi", "-q", "-d", "FABRIC"]) == (2, "Failed to parse --display/-d flags\n")
    assert refusal(["nvidia-smi", "-q", "-d", "MEMORY,ECC"]) is None
    assert refusal(["nvidia-smi", "--query-gpu=index,fabric.clique_id", "--format=csv"]) == (
        2, 'Field "fabric.clique_id" is not a valid field to query.\n\n')
    assert refusal(["nvidia-smi", "--query-gpu=pci.bus_id,fabric.state,fabric.status",
                    "--format=csv,noheader"]) is None


def test_chroot_resolve_keeps_absolute_links_inside_the_root(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("/run")
    assert fx.chroot_resolve(str(tmp_path), "/var/run/cdi/x") == str(tmp_path / "run" / "cdi" / "x")
    assert fx.chroot_resolve(str(tmp_path), "/../../etc") == str(tmp_path / "etc")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of character devices needs root")
def test_load_module_then_create_nodes_registers_majors_binds_gpus_and_makes_nodes(tmp_path):
    layout = fx.Layout(str(tmp_path))
    os.makedirs(layout.root)
    Path(layout.root, "proc").mkdir()
    Path(layout.root, "proc", "devices").write_text(
        "Character devices:\n  1 mem\n254 rtc\n\nBlock devices:\n  7 loop\n")
    Path(layout.state).write_text(json.dumps(fx.initial_state([VGA, GPU])))
    world = {"pci": [VGA, GPU], "fixture_dirs": [], "python": sys.executable}
    with fx.locked_state(layout) as state:
        effects = fx.Effects(layout, world, state, ["/w/bin/modprobe", "nvidia"])
        effects.apply({"load_module": "nvidia", "version": "550.54.15"})
        effects.apply({"load_module": "nvidia_uvm", "major": 508})
        effects.apply({"create_nodes": "control"})
        effects.apply({"create_nodes": "gpus"})
    state = json.loads(Path(layout.state).read_text())
    assert state["bindings"] == {VGA["address"]: "bochs-drm", GPU["address"]: "nvidia"}
    assert state["applied"] == ["load_module=nvidia", "load_module=nvidia_uvm",
                                "create_nodes=control", "create_nodes=gpus"]
    devices = Path(layout.root, "proc", "devices").read_text()
    assert devices.startswith("Character devices:\n  1 mem\n195 nvidia\n254 rtc\n508 nvidia-uvm\n\n")
    assert Path(layout.root, "sys/module/nvidia/version").read_text() == "550.54.15\n"
    assert "Device Minor: \t 0" in Path(
        layout.root, "proc/driver/nvidia/gpus", GPU["address"], "information").read_text()
    for node, numbers in {"nvidiactl": (195, 255), "nvidia-uvm-tools": (508, 1), "nvidia0": (195, 0)}.items():
        info = os.stat(Path(layout.root, "dev", node))
        assert stat.S_ISCHR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o666
        assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == numbers


def test_umockdev_tree_is_seen_by_pyudev_and_by_plain_sysfs_reads(tmp_path):
    tree = tmp_path / "tree"
    tree.write_text(umockdev_tree([VGA, GPU], {VGA["address"]: "bochs-drm", GPU["address"]: "nvidia"}))
    probe = ("import json, os, pyudev\n"
             "sysfs = {a: [open(f'/sys/bus/pci/devices/{a}/{k}').read() for k in ('vendor', 'class')]\n"
             "         for a in os.listdir('/sys/bus/pci/devices')}\n"
             "udev = {d.sys_name: [d.driver, d.attributes.asstring('class')]\n"
             "        for d in pyudev.Context().list_devices(subsystem='pci')}\n"
             "print(json.dumps([sysfs, udev]))\n")
    result = subprocess.run(["umockdev-run", "-d", str(tree), "--", sys.executable, "-c", probe],
                            capture_output=True, text=True, timeout=30, check=True)
    sysfs, udev = json.loads(result.stdout)
    assert sysfs == {VGA["address"]: ["0x1234\n", "0x030000\n"], GPU["address"]: ["0x10de\n", "0x030200\n"]}
    assert udev == {VGA["address"]: ["bochs-drm", "0x030000"], GPU["address"]: ["nvidia", "0x030200"]}


@pytest.mark.skipif(not (SHARED / "cases").is_dir(), reason="no ../shared checkout next to the repository")
def test_project_copy_of_shared_cases_and_fixtures_is_unchanged():
    for folder in ("cases", "fixtures/nvidia-ctk", "cdi-schema"):
        for copy in (DATA / folder).iterdir():
            original = SHARED / folder / copy.name
            if original.exists():
                assert copy.read_bytes() == original.read_bytes(), f"{copy} differs from {original}"


# --- VMBus channels and late PCI devices (EFFECTS.md "vmbus:", "pci_late:") ----------------------

CHANNEL = {"instance": "47505500-0001-0000-3130-444532333331",
           "class_id": "{44c4f61d-4444-4400-9d52-802e27ede19f}", "driver": "hv_pci"}
LATE_GPU = {**GPU, "address": "0001:00:00.0", "vmbus": CHANNEL["instance"], "after_s": 1}
UNDER_UMOCKDEV = """
import json, os, pyudev, sys
out = {}
if sys.argv[1] == "listen":
    monitor = pyudev.Monitor.from_netlink(pyudev.Context())
    monitor.filter_by("pci")
    monitor.start()
    print("listening", flush=True)
    first = monitor.poll(timeout=10)
    out["event"] = first and [first.action, first.subsystem, first.sys_name,
                              first.properties.get("PCI_SLOT_NAME")]
    out["second"] = (lambda d: d and d.sys_name)(monitor.poll(timeout=1))
out["sysfs"] = {n: os.readlink(f"/sys/bus/pci/devices/{n}") for n in os.listdir("/sys/bus/pci/devices")}
out["udev"] = {d.sys_name: [d.parent.subsystem, d.parent.sys_name, d.parent.driver, d.driver,
                            d.attributes.asstring("class")]
               for d in pyudev.Context().list_devices(subsystem="pci")}
out["class_id"] = open(f"/sys/bus/vmbus/devices/{sys.argv[2]}/class_id").read()
print(json.dumps(out))
"""


def test_a_function_behind_its_vmbus_channel_sits_below_it_as_the_kernel_puts_it(tmp_path):
    tree = tmp_path / "tree"
    tree.write_text(umockdev_tree([{**LATE_GPU, "driver": None}], {LATE_GPU["address"]: "nvidia"},
                                  [CHANNEL]))
    done = subprocess.run(["umockdev-run", "-d", str(tree), "--", sys.executable, "-c",
                           UNDER_UMOCKDEV, "look", CHANNEL["instance"]], capture_output=True,
                          text=True, timeout=30, check=True)
    out = json.loads(done.stdout.splitlines()[-1])
    devpath = testbed.pci_devpath(LATE_GPU)

    assert devpath == (f"/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/{CHANNEL['instance']}"
                       "/pci0001:00/0001:00:00.0")
    assert out["sysfs"] == {"0001:00:00.0": f"../../..{devpath}"}
    assert out["udev"] == {"0001:00:00.0": ["vmbus", CHANNEL["instance"], "hv_pci", "nvidia",
                                            "0x030200"]}
    assert out["class_id"] == "{44c4f61d-4444-4400-9d52-802e27ede19f}\n"
    driver = os.path.normpath(os.path.join("/sys" + devpath, testbed.pci_record(
        LATE_GPU, "nvidia").split("L: driver=")[1].strip()))
    assert driver == "/sys/bus/pci/drivers/nvidia"


def test_a_device_added_to_the_live_testbed_reaches_a_pci_monitor_and_another_subsystem_not(
        tmp_path):
    """The monitor's socket filter drops a message whose subsystem hash is not pci's: the hash
    is libudev's MurmurHash2, or no event would pass the filter at all."""
    tree = tmp_path / "tree"
    tree.write_text(umockdev_tree([], {}, [CHANNEL]))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    process = subprocess.Popen(["umockdev-run", "-d", str(tree), "--", sys.executable, "-c",
                                UNDER_UMOCKDEV, "listen", CHANNEL["instance"]],
                               stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout.readline() == "listening\n"
        [bed] = testbed.live_testbeds(str(tmp_path))
        record = testbed.pci_record(LATE_GPU, None)
        devpath = testbed.add_live_device(bed, record)  # no PCI device before: bus/pci is made
        properties = testbed.parse_record(record)[1]
        other = [p if not p.startswith("SUBSYSTEM=") else "SUBSYSTEM=usb" for p in properties]
        assert testbed.send_uevent(bed, testbed.uevent_message(devpath, "add", other, 1)) == 1
        assert testbed.send_uevent(bed, testbed.uevent_message(devpath, "add", properties, 2)) == 1
        out = json.loads(process.communicate(timeout=30)[0])
    finally:
        process.kill()

    assert out["event"] == ["add", "pci", "0001:00:00.0", "0001:00:00.0"]
    assert out["second"] is None  # the usb one never came
    assert out["udev"] == {"0001:00:00.0": ["vmbus", CHANNEL["instance"], "hv_pci", None,
                                            "0x030200"]}


def test_a_gpu_that_arrives_after_the_driver_loaded_is_bound_with_the_next_free_minor(tmp_path):
    early = {**GPU, "address": "0000:00:05.0"}
    late = {**GPU, "address": "0000:00:03.0"}  # sorts first, but the driver probes it later
    layout = fx.Layout(str(tmp_path))
    os.makedirs(layout.root)
    Path(layout.state).write_text(json.dumps(fx.initial_state([early], [late])))
    world = {"pci": [early], "pci_late": [late], "fixture_dirs": [], "python": sys.executable}
    with fx.locked_state(layout) as state:
        fx.Effects(layout, world, state, ["/w/bin/modprobe", "nvidia"]).apply(
            {"load_module": "nvidia", "version": "550.54.15"})
        state["arrived"].append(late["address"])
        fx.Effects(layout, world, state, []).bind_arrival()
    state = json.loads(Path(layout.state).read_text())
    gpus = Path(layout.root, "proc/driver/nvidia/gpus")

    assert state["bindings"] == {early["address"]: "nvidia", late["address"]: "nvidia"}
    assert "Device Minor: \t 0" in (gpus / early["address"] / "information").read_text()
    assert "Device Minor: \t 1" in (gpus / late["address"] / "information").read_text()


@pytest.mark.parametrize("extra, problem", [
    ({"vmbus": [{"instance": "x", "class_id": "{y}", "speed": 1}]}, "vmbus entry"),
    ({"pci_late": [{**LATE_GPU, "vmbus": "nowhere"}]}, "which the case's vmbus list lacks"),
    ({"pci_late": [{**LATE_GPU, "vmbus": None, "after_s": "soon"}]}, "after_s must be a number"),
    ({"pci": [GPU], "pci_late": [{**GPU, "after_s": 1}]}, "listed twice"),
    ({"pci": [{**GPU, "after_s": 1}]}, "pci entry"),
])
def test_a_case_with_bad_vmbus_or_pci_late_entries_is_refused(tmp_path, extra, problem):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({"id": "X1", "vmbus": [CHANNEL], **extra}))

    with pytest.raises(CaseError, match=problem):
        load_case(path)


def test_a_late_device_comes_only_while_boot_runs_and_later_phases_have_it_from_the_start():
    """S16 without its config: the product ends no-gpu before after_s, so nothing arrives during
    the boot; check then has the GPU on PCI from the start."""
    case = load_case(OWN_CASES / "S16-expected-gpu-hot-plugged-late.yaml")
    del case.files["etc/podvm-gpu/config.yaml"]
    with World(case) as world:
        boot = world.run("boot")
        check = world.run("check")

    assert boot.status["state"] == "no-gpu" and boot.arrivals == [] and boot.wall_s < 2
    pci = next(c for c in json.loads(check.stdout)["checks"] if c["name"] == "pci")
    assert pci["result"] == "pass" and "0000:00:05.0" in pci["detail"], pci


def test_kernel_log_during_appends_records_with_real_elapsed_time(tmp_path):
    """Issue 46's rule key: records a tool writes while it runs, appended with the next seq and
    the time that really passed since the call began (fake_tool.sleep_logging)."""
    import time

    from scenarios.fake_tool import sleep_logging

    layout = fx.Layout(str(tmp_path))
    Path(layout.root, "dev").mkdir(parents=True)
    Path(layout.root, "dev", "kmsg").write_text(kmsg_records(["nvidia: loaded"]))
    Path(layout.state).write_text(json.dumps(fx.initial_state([])))

    class Caller:
        @staticmethod
        def sleep(seconds):
            time.sleep(seconds)

    class World:
        pass

    world = World()
    world.layout = layout
    line = "<3>NVRM: GPU{} kbifCacheVFInfo_GB100: Unable to read NV_PF0_INITIAL_AND_TOTAL_VFS"
    started = time.monotonic()
    sleep_logging(Caller, world, 0.5, [{"after_s": 0.3, "line": line.format(1)},
                                       {"after_s": 0.1, "line": line.format(0)}])
    assert time.monotonic() - started >= 0.5
    records = [re.fullmatch(r"(\d+),(\d+),(\d+),-;(.*)", x)
               for x in Path(layout.root, "dev", "kmsg").read_text().splitlines()]
    assert [(r.group(1), r.group(2)) for r in records] == [("6", "0"), ("3", "1"), ("3", "2")]
    assert [r.group(4)[:11] for r in records[1:]] == ["NVRM: GPU0 ", "NVRM: GPU1 "]
    usec = [int(r.group(3)) for r in records]
    assert 0.1e6 <= usec[1] - usec[0] < 0.3e6 and 0.18e6 <= usec[2] - usec[1] < 0.5e6
    with pytest.raises(fx.EffectError, match="must begin with its level"):
        fx.append_kernel_log(layout, "NVRM: no level", 1)


@pytest.mark.parametrize("entry", [{"after_s": 1, "line": "no level"}, {"after_s": -1, "line": "<3>x"},
                                   {"after_s": 1, "line": "<3>x", "extra": 1}, "just a line"])
def test_a_bad_kernel_log_during_entry_is_a_case_error(tmp_path, entry):
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump({"id": "X2", "tools": [
        {"argv": ["nvidia-persistenced"], "rc": 0, "stdout": "", "stderr": "", "delay_s": 1,
         "effects": [], "kernel_log_during": [entry]}]}))

    with pytest.raises(CaseError, match="kernel_log_during entry"):
        load_case(path)
