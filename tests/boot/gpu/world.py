"""The fake 1 x H100 PCIe VM of the GPU boot test, written into a test rootfs under /srv/gpu.

Inside the rootfs:
  /srv/gpu/root          the agent's PODVM_GPU_ROOT: the VM before boot, as field case P02 has it
  /srv/gpu/bin           fakegpu.py and its tool links (first on the agent's PATH)
  /srv/gpu/h100.umockdev the PCI devices (emulated VGA, virtio NIC, an unbound H100 PCIe)
  /srv/gpu/spec-1gpu.yaml what the fake ``nvidia-ctk cdi generate`` writes (real nvidia-ctk
                         1.20.0 output, shared/fixtures/nvidia-ctk/spec-1gpu.yaml)
  /srv/gpu/calls.log     every fake tool call, one JSON list per line
plus the drop-ins that point podvm-gpu.service (umockdev, PATH, root) and the kata-agent
stand-in (root) at it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL = "6.8.0-1015-example"
VERSION = "550.54.15"
# No nvidia-modprobe: the agent does not run it under a root (the real one writes the real /dev).
TOOLS = ["modprobe", "nvidia-ctk", "nvidia-persistenced", "nvidia-smi", "nv-fabricmanager"]

PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  4 ttyS
  5 /dev/tty
  5 /dev/console
  5 /dev/ptmx
  7 vcs
 10 misc
 13 input
 29 fb
128 ptm
136 pts
226 drm
250 hidraw
251 virtio-portsdev
252 bsg
253 watchdog
254 rtc

Block devices:
  7 loop
  8 sd
  9 md
 11 sr
253 device-mapper
254 virtblk
259 blkext
"""

PROC_MODULES = """virtio_net 77824 0 - Live 0x0000000000000000
net_failover 20480 1 virtio_net, Live 0x0000000000000000
failover 12288 1 net_failover, Live 0x0000000000000000
virtio_blk 28672 2 - Live 0x0000000000000000
bochs 16384 0 - Live 0x0000000000000000
"""

KERNEL_LOG = [
    "nvidia: loading out-of-tree module taints kernel.",
    "nvidia: module verification failed: signature and/or required key missing - tainting kernel",
    f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {VERSION}  Release Build"
    "  (builder@buildhost)  Tue Mar  5 22:15:33 UTC 2024",
]


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def populate(rootfs: Path, spec_template: Path, fail_cdi_generate: bool = False,
             fail_persistenced: bool = False, kill_persistenced: bool = False,
             hang_persistenced: bool = False, driver_files: bool = False,
             attested: bool = False) -> Path:
    """Write the fake GPU VM into rootfs; returns the host path of /srv/gpu. With
    ``fail_cdi_generate`` the boot fails in its last step, after persistenced started; with
    ``fail_persistenced`` the daemon fails to initialise (fakegpu.py says how); with
    ``kill_persistenced`` it is killed by SIGKILL while it initialises; with
    ``hang_persistenced`` it initialises for ever. ``driver_files``: every file the spec mounts
    into a container exists under the fake root (empty), as a driver install leaves them, so a
    real runtime can start a container with the spec (the podman boots). ``attested``: a TDX
    guest (the CPU flag) whose GPU is in CC mode, with the nvattest stand-in
    (tests/nvattest_standin.py) on the agent's PATH; each nvattest call appends to
    ``/srv/gpu/nvattest.log`` its argv, its cgroup and whether it may open an IPv4 socket."""
    home = rootfs / "srv/gpu"
    root = home / "root"
    files = {
        "proc/cmdline": f"BOOT_IMAGE=/boot/vmlinuz-{KERNEL} ro console=ttyS0,115200n8\n",
        "proc/sys/kernel/osrelease": KERNEL + "\n",
        "proc/modules": PROC_MODULES,
        "proc/devices": PROC_DEVICES,
        "sys/kernel/security/lockdown": "[none] integrity confidentiality\n",
        # /dev/kmsg records: <prio>,<seq>,<usec>,<flags>;<message> (contract section 9).
        "dev/kmsg": "".join(f"4,{i},{1000 * (i + 1)},-;{line}\n" for i, line in enumerate(KERNEL_LOG)),
        f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}": "",
        f"usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}": "",
    }
    for name in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"):
        files[f"lib/modules/{KERNEL}/updates/dkms/{name}.ko"] = ""
    for path, text in files.items():
        _write(root / path, text)
    _write(root / "usr/bin/nvidia-cdi-hook", "#!/bin/sh\n# stand-in for the toolkit's CDI hook\nexit 0\n", 0o755)
    for lib in ("libnvidia-ml", "libcuda"):
        (root / f"usr/lib/x86_64-linux-gnu/{lib}.so.1").symlink_to(f"{lib}.so.{VERSION}")
    if driver_files:
        import yaml

        spec = yaml.safe_load(spec_template.read_text())
        for mount in spec["containerEdits"].get("mounts", []):
            path = root / mount["hostPath"].lstrip("/")
            if not path.exists():
                _write(path, "", 0o755 if "/bin/" in mount["hostPath"] else 0o644)
    for folder in ("run", "var/run", "etc"):
        (root / folder).mkdir(parents=True, exist_ok=True)

    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copyfile(HERE / "fakegpu.py", bin_dir / "fakegpu")
    (bin_dir / "fakegpu").chmod(0o755)
    for tool in TOOLS:
        (bin_dir / tool).symlink_to("fakegpu")
    shutil.copyfile(HERE / "h100.umockdev", home / "h100.umockdev")
    shutil.copyfile(spec_template, home / "spec-1gpu.yaml")
    (home / "calls.log").touch()
    if fail_cdi_generate:
        (home / "fail-cdi-generate").touch()
    if fail_persistenced:
        (home / "fail-persistenced").touch()
    if kill_persistenced:
        (home / "kill-persistenced").touch()
    if hang_persistenced:
        (home / "hang-persistenced").touch()

    if attested:
        _write(root / "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\n"
               "flags\t\t: fpu vme de pse tsc msr pae tdx_guest hypervisor\n\n")
        (home / "cc-on").touch()
        standin = HERE.parents[1] / "nvattest_standin.py"
        _write(bin_dir / "nvattest", "#!/usr/bin/python3\n" + standin.read_text().split("\n", 1)[1],
               0o755)
        _write(bin_dir / "nvattest.plan.json", json.dumps(
            {"gpus": [{"driver": VERSION}], "log": "/srv/gpu/nvattest.log"}))
        # the transient unit is podvm-gpu-nvattest-gpu-<pid>.service: a prefix drop-in reaches
        # it (systemd 246+); the stand-in writes its log under /srv/gpu
        dropin = rootfs / "etc/systemd/system/podvm-gpu-nvattest-.service.d/50-fake-gpu.conf"
        _write(dropin, "[Service]\nReadWritePaths=/srv/gpu\n")
    for unit in ("podvm-gpu.service", "kata-agent.service", "podvm-gpu-persistenced.service"):
        dropin = rootfs / f"etc/systemd/system/{unit}.d/50-fake-gpu.conf"
        dropin.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HERE / f"{unit}.d/50-fake-gpu.conf", dropin)
    return home


REAL_ROOT_UNITS = ("podvm-gpu.service", "kata-agent.service")


def on_the_real_root(rootfs: Path, config: str) -> None:
    """The agent (and the kata-agent stand-in) on the VM's own root ``/`` instead of the fake
    one, with ``config`` as /etc/podvm-gpu/config.yaml: only /sys is mocked (umockdev: the H100
    and, once the fake modprobe ran, /sys/module/<name>), so what the agent writes below /proc
    reaches the real kernel through the unit's real sandbox. The fake tools still change only
    /srv/gpu/root, so the boot fails after the modules step (the real /proc knows no driver)."""
    for unit in REAL_ROOT_UNITS:
        dropin = rootfs / f"etc/systemd/system/{unit}.d/60-real-root.conf"
        dropin.parent.mkdir(parents=True, exist_ok=True)
        dropin.write_text("# module lock boot tests: the agent works on the VM's own root\n"
                          "[Service]\nEnvironment=PODVM_GPU_ROOT=/\n")
    _write(rootfs / "etc/podvm-gpu/config.yaml", config)
