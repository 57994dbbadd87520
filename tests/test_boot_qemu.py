"""The boot tests of test_boot_nspawn.py, in a VM: qemu with the image's own kernel and initrd.

What a VM adds over a container: a real kernel with systemd as PID 1 on cgroup v2, so the
unit's sandbox is fully in force (device cgroup policy while the GPU path creates device nodes,
IP firewall, mount namespaces), real udev coldplug and the VM's own PCI devices in /sys (the
CPU path scans qemu's emulated devices). Under TCG (no KVM here) a boot to power-off takes
about 20 s on the CPU path and 30 s on the GPU path; Python runs about 20x slower, so the
agent's time here says nothing about a real VM's.
"""

from __future__ import annotations

import pytest
import yaml
from boot import checks, image
from boot.fixtures import SPEC_TEMPLATE, installed, podman_installed, podman_rootfs, rootfs  # noqa: F401
from boot.gpu import world

pytestmark = pytest.mark.slow


def test_cpu_vm_kata_agent_starts_after_the_agent_and_sees_the_unavailable_spec(rootfs, tmp_path):  # noqa: F811
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_the_unavailable_spec(record)
    # the final state line reaches the serial console through the kernel log
    console_line = f"podvm-gpu[{record['agent_unit']['ExecMainPID']}]: no-gpu: detect: no NVIDIA GPU on PCI"
    assert console_line in boot.console, boot.console[-3000:]
    print(f"qemu CPU path: boot {boot.wall_s:.1f} s, agent {boot.agent_time_s():.3f} s (journal)")


def test_gpu_vm_kata_agent_starts_after_the_agent_and_sees_a_ready_spec(rootfs, tmp_path):  # noqa: F811
    world.populate(rootfs, SPEC_TEMPLATE)
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_a_ready_spec_with_persistenced_running(boot, record)
    assert record["persistenced"]["cgroup"] == "0::/system.slice/podvm-gpu-persistenced.service\n", "cgroup v2 only"
    # On Grace-based GPUs nvidia-persistenced writes /sys/devices/system/memory/auto_online_blocks;
    # ProtectKernelTunables= makes /sys read-only (measured in a VM: "Read-only file system"), so
    # its unit opens that folder again: the fake daemon writes the value back from its unit.
    events = boot.files.get("/srv/gpu/persistenced-events.log", "")
    assert "auto_online_blocks written" in events.splitlines(), events
    print(f"qemu GPU path: boot {boot.wall_s:.1f} s, agent {boot.agent_time_s():.3f} s (journal)")


@pytest.mark.parametrize("outcome", ["ready", "failed"])
def test_persistenced_outlives_every_boot_outcome_and_is_stopped_at_power_off(rootfs, tmp_path,  # noqa: F811
                                                                              outcome):
    """As in test_boot_nspawn.py, with a real kernel and cgroup v2: the daemon's unit, not the
    agent's, holds it; a failed agent unit does not take it down; power-off stops it."""
    world.populate(rootfs, SPEC_TEMPLATE, fail_cdi_generate=outcome == "failed")
    image.clean_power_off(rootfs)
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")
    checks.persistenced_outlived_the_boot(boot, outcome)



# --- podman as kata-agent, and the module lock, in a VM (issues 19 and 17) --------------------
# The podman boots use an image of their own (tests/boot/podman_image.py: the base rootfs plus
# Debian 12's podman 4.3.1 and busybox-static); the module lock boots use the base image.

CONTAINER_REQUESTS = ("nvidia.com/gpu=all", "nvidia.com/gpu=unavailable")
PROBE_MODULE = "dummy"  # drivers/net/dummy.ko: in the cloud kernel, loaded by nothing else


def podman_answers(record: dict) -> dict[str, dict]:
    return {answer["request"]: answer for answer in record.get("podman") or []}


def container_saw(answer: dict) -> tuple[dict[str, tuple[int, int]], list[str], list[str]]:
    """From the container's ``ls -ln /dev; echo ---; env; echo ---; mount points``: its
    /dev/nvidia* character devices (name -> (major, minor)), its environment, its mount points."""
    listing, _, rest = answer["stdout"].partition("\n---\n")
    env, _, mounts = rest.partition("\n---\n")
    nodes = {}
    for line in listing.splitlines():
        words = line.split()
        # crw-rw-rw-    1 0        0         195,   0 Dec  1 21:40 nvidia0
        if words and words[0].startswith("c") and words[-1].startswith("nvidia"):
            nodes[words[-1]] = (int(words[4].rstrip(",")), int(words[5]))
    return nodes, env.splitlines(), mounts.splitlines()


def test_cpu_vm_a_podman_gpu_request_fails_at_once_and_modules_stay_unlocked(podman_rootfs, tmp_path):  # noqa: F811
    """kata-agent's place taken by the real podman (the Go CDI library) on the CPU VM's
    unavailable spec: a GPU request fails at once with the library's error, the ``unavailable``
    device runs and carries the state; the module lock is off by default: a module loads."""
    from boot import podman_image

    podman_image.run_containers(podman_rootfs, *CONTAINER_REQUESTS, probe_module=PROBE_MODULE)
    boot = image.boot_qemu(podman_rootfs, tmp_path / "artifacts", timeout_s=600)

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_the_unavailable_spec(record)
    answers = podman_answers(record)
    gpu = answers["nvidia.com/gpu=all"]
    assert gpu["rc"] not in (0, None), gpu
    assert "unresolvable CDI devices nvidia.com/gpu=all" in gpu["stderr"], gpu
    assert gpu["seconds"] < 30, f"a GPU request on a CPU VM must fail at once, not wait: {gpu}"
    unavailable = answers["nvidia.com/gpu=unavailable"]
    assert unavailable["rc"] == 0, unavailable
    _, env, _ = container_saw(unavailable)
    assert "PODVM_GPU_STATE=no-gpu" in env, unavailable
    assert f"PODVM_GPU_REASON={record['status']['reason']}" in env, unavailable
    lock = record["module_lock"]
    assert lock["modules_disabled"] == "0", lock
    assert lock["modprobe_rc"] == 0 and lock["loaded_after"], lock
    print(f"qemu CPU path + podman: boot {boot.wall_s:.1f} s; podman run =all failed in "
          f"{gpu['seconds']} s, =unavailable ran in {unavailable['seconds']} s")


def test_gpu_vm_podman_runs_a_container_with_the_devices_and_env_of_the_spec(podman_rootfs, tmp_path):  # noqa: F811
    """The ready spec of the fake 1 x H100 boot, consumed by the real podman and crun: the
    container gets every device node of ``all`` (made by crun with the numbers the CDI library
    read from the agent's nodes), the spec's env and mounts, and its hooks ran."""
    from boot import podman_image

    world.populate(podman_rootfs, SPEC_TEMPLATE, driver_files=True)
    podman_image.run_containers(podman_rootfs, "nvidia.com/gpu=all")
    boot = image.boot_qemu(podman_rootfs, tmp_path / "artifacts", timeout_s=600,
                           extra=(podman_image.HOOK_LOG,))

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_a_ready_spec_with_persistenced_running(boot, record)
    answer = podman_answers(record)["nvidia.com/gpu=all"]
    assert answer["rc"] == 0, answer
    nodes, env, mounts = container_saw(answer)
    assert nodes == {"nvidia0": (195, 0), "nvidiactl": (195, 255), "nvidia-modeset": (195, 254),
                     "nvidia-uvm": (510, 0), "nvidia-uvm-tools": (510, 1)}, answer["stdout"]
    spec = yaml.safe_load(record["spec"])
    assert set(spec["containerEdits"]["env"]) <= set(env), env
    assert {m["containerPath"] for m in spec["containerEdits"]["mounts"]} <= set(mounts), mounts
    hooks = boot.files.get(podman_image.HOOK_LOG, "").splitlines()
    assert [h.split()[0] for h in hooks] == [h["args"][1] for h in spec["containerEdits"]["hooks"]], hooks
    print(f"qemu GPU path + podman: boot {boot.wall_s:.1f} s; podman run =all {answer['seconds']} s")


# Without the unit's ReadWritePaths= of the file (a drop-in that lists the others again), the
# same boot shows that the sandbox is in force: ProtectKernelTunables= leaves /proc/sys read-only.
WITHOUT_THE_UNITS_PATH = """# module lock boot test: the unit without its ReadWritePaths= of modules_disabled
[Service]
ReadWritePaths=
ReadWritePaths=/run /srv/gpu
"""


@pytest.mark.parametrize("lock", ["on", "off", "on-without-the-units-path"])
def test_the_module_lock_reaches_the_real_kernel_through_the_units_sandbox(rootfs, tmp_path, lock):  # noqa: F811
    """modules.lock_after_boot on the VM's own root: after the modules step's last modprobe the
    agent, inside its real unit (ProtectKernelTunables=, ReadWritePaths= of the one file), writes
    1 to the real kernel's modules_disabled, and a later modprobe fails; off, nothing changes;
    without the unit's ReadWritePaths= of the file the write fails and the boot says so."""
    world.populate(rootfs, SPEC_TEMPLATE)
    world.on_the_real_root(rootfs, f"modules:\n  lock_after_boot: {str(lock != 'off').lower()}\n")
    if lock == "on-without-the-units-path":
        dropin = rootfs / "etc/systemd/system/podvm-gpu.service.d/70-no-modules-disabled.conf"
        dropin.write_text(WITHOUT_THE_UNITS_PATH)
    from boot import podman_image

    podman_image.probe_modules(rootfs, PROBE_MODULE)
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot, failed=True)
    status = record["status"]
    steps = {s["name"]: s for s in status["steps"]}
    modules = steps["modules"]
    calls = [c for c in boot.calls if c[0] == "modprobe"]
    # the module's name follows modprobe (one GPU without a fabric adds NVreg_NvLinkDisable=1)
    assert [c[1] for c in calls][:2] == ["nvidia", "nvidia_uvm"], boot.calls
    probe = record["module_lock"]
    if lock == "on":
        assert modules["result"] == "ok", steps
        assert "module loading locked (/proc/sys/kernel/modules_disabled = 1" in modules["message"], modules
        assert probe["modules_disabled"] == "1", probe
        assert probe["modprobe_rc"] != 0 and "Operation not permitted" in probe["modprobe_stderr"], probe
        assert not probe["loaded_after"], probe
    elif lock == "off":
        assert modules["result"] == "ok", steps
        assert "locked" not in modules["message"], modules
    else:
        assert modules["result"] == "failed", steps
        assert status["reason"] == ("modules: cannot lock module loading (modules.lock_after_boot): "
                                    "writing 1 to /proc/sys/kernel/modules_disabled failed: "
                                    "Read-only file system"), status
    if lock != "on":
        assert probe["modules_disabled"] == "0", probe
        assert probe["modprobe_rc"] == 0 and probe["loaded_after"], probe
    print(f"qemu module lock {lock}: boot {boot.wall_s:.1f} s, ended "
          f"{status['state']} ({status['reason']}); modprobe {PROBE_MODULE}: {probe}")
