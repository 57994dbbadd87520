"""Capture what Debian's real NVIDIA programs do, from qemu boots of the real-driver image.

Usage (root, about 4 minutes here: one plain boot and one per kernel command line below):

    .venv/bin/python tests/boot/real/capture.py [--out tests/data]

Each boot runs ``capture-in-guest.py`` as a oneshot unit under the real systemd, journald and
kernel of the image (qemu TCG, no GPU), with a plan of commands run the way the agent runs them,
then powers off. The results become fixtures under ``<out>/nvidia-<module version>/<boot>/<name>/``:
``argv`` (JSON), ``rc``, ``stdout``, ``stderr``, ``kmsg`` (the raw ``/dev/kmsg`` records written
while the command ran) and, for daemons, ``journal`` (JSON lines: what journald got under the
daemon's syslog identifier); a ``read`` entry gives ``files.json``. The fixtures' README says
how each was made; tests/boot/real/captured.py reads them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for ``boot``

from boot import image, real_driver  # noqa: E402

GUEST_DIR = "/usr/local/lib/podvm-gpu-capture"
RESULT = "/var/lib/podvm-gpu-capture/result.json"
UNIT = f"""[Unit]
Description=capture the real NVIDIA programs' behaviour, then power off
After=systemd-journald.service systemd-modules-load.service systemd-udev-settle.service
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 {GUEST_DIR}/capture-in-guest.py
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=600

[Install]
WantedBy=multi-user.target
"""
SMI = "nvidia-smi"
PERSISTENCED_JOURNAL = {"journal": "nvidia-persistenced", "settle": 1}


def cmd(name: str, *argv: str, **extra) -> dict:
    return {"name": name, "argv": list(argv), **extra}


def state(name: str) -> dict:
    """What the kernel says about module loading, read before each cause is tried."""
    return {"name": name, "read": ["/proc/cmdline", "/sys/kernel/security/lockdown",
                                   "/sys/module/module/parameters/sig_enforce",
                                   "/proc/sys/kernel/modules_disabled", "/proc/modules"]}


LOAD = [cmd("modprobe-nvidia", "modprobe", "nvidia", settle=1),
        cmd("modprobe-nvidia_uvm", "modprobe", "nvidia_uvm", settle=1)]

# The plain boot: the layout Debian installs, the programs with the agent's arguments.
PLAIN = [
    state("state"),
    {"name": "layout", "read": [
        "/etc/modprobe.d/*", "/lib/modprobe.d/*", "/usr/lib/modprobe.d/*", "/run/modprobe.d/*",
        "/etc/modules-load.d/*", "/etc/nvidia/**", "/etc/alternatives/nvidia*",
        "/etc/alternatives/glx*", "/lib/systemd/system/nvidia-persistenced.service"]},
    cmd("uname-r", "uname", "-r"),
    cmd("find-modules", "find", "/lib/modules", "-name", "nvidia*"),
    cmd("find-firmware", "find", "/lib/firmware/nvidia", "-type", "f"),
    cmd("find-dkms", "find", "/var/lib/dkms", "-maxdepth", "5"),
    cmd("dkms-status", "dkms", "status"),
    cmd("update-alternatives-nvidia", "update-alternatives", "--display", "nvidia"),
    cmd("update-alternatives-glx", "update-alternatives", "--display", "glx"),
    cmd("modinfo-nvidia", "modinfo", "nvidia"),
    cmd("modinfo-nvidia-current", "modinfo", "nvidia-current"),
    cmd("modinfo-F-firmware-nvidia-current", "modinfo", "-F", "firmware", "nvidia-current"),
    cmd("modinfo-F-name-nvidia-current", "modinfo", "-F", "name", "nvidia-current"),
    cmd("modinfo-F-version-nvidia-current", "modinfo", "-F", "version", "nvidia-current"),
    cmd("modinfo-nvidia-current-uvm", "modinfo", "nvidia-current-uvm"),
    cmd("modprobe-show-depends-nvidia", "modprobe", "--show-depends", "nvidia"),
    cmd("modprobe-show-depends-nvidia_uvm", "modprobe", "--show-depends", "nvidia_uvm"),
    cmd("modprobe-show-depends-nvidia-current", "modprobe", "--show-depends", "nvidia-current"),
    cmd("modprobe-R-nvidia", "modprobe", "-R", "nvidia"),
    cmd("modprobe-R-nvidia_uvm", "modprobe", "-R", "nvidia_uvm"),
    cmd("modprobe-R-nvidia-current", "modprobe", "-R", "nvidia-current"),
    cmd("modprobe-n-v-nvidia", "modprobe", "-n", "-v", "nvidia", "NVreg_EnableGpuFirmware=1"),
    cmd("find-nvidia-programs", "find", "/usr/bin", "/usr/lib/nvidia", "-name", "nvidia*", "-printf",
        "%p %y %M %U:%G %l\\n"),
    cmd("journal-nvidia-persistenced-unit", "journalctl", "-b", "--no-pager", "-o", "json",
        "-u", "nvidia-persistenced.service"),
    cmd("systemctl-status-nvidia-persistenced", "systemctl", "--no-pager", "status",
        "nvidia-persistenced.service"),
    cmd("nvidia-smi", SMI),
    cmd("nvidia-smi-L", SMI, "-L"),
    cmd("nvidia-smi-q", SMI, "-q"),
    cmd("nvidia-smi-q-d-FABRIC", SMI, "-q", "-d", "FABRIC"),
    cmd("nvidia-smi-conf-compute-f", SMI, "conf-compute", "-f"),
    cmd("nvidia-smi-conf-compute-grs", SMI, "conf-compute", "-grs"),
    cmd("nvidia-smi-query-gpu-mig", SMI, "--query-gpu=index,mig.mode.current", "--format=csv,noheader"),
    cmd("nvidia-smi-query-gpu-fabric", SMI, "--query-gpu=fabric.state,fabric.status", "--format=csv,noheader"),
    cmd("nvidia-smi-mig-lgi", SMI, "mig", "-lgi"),
    cmd("nvidia-persistenced-help", "nvidia-persistenced", "--help"),
    cmd("nvidia-persistenced-version", "nvidia-persistenced", "--version"),
    cmd("nvidia-persistenced-agent-default-args", "nvidia-persistenced", "--persistence-mode",
        "--uvm-persistence-mode", **PERSISTENCED_JOURNAL),
    cmd("nvidia-persistenced-persistence-mode", "nvidia-persistenced", "--persistence-mode",
        **PERSISTENCED_JOURNAL),
    cmd("nvidia-persistenced-no-args", "nvidia-persistenced", **PERSISTENCED_JOURNAL),
    cmd("nvidia-persistenced-user-nvpd", "nvidia-persistenced", "--user", "nvpd",
        **PERSISTENCED_JOURNAL),
    cmd("nvidia-persistenced-verbose", "nvidia-persistenced", "--verbose", "--persistence-mode",
        **PERSISTENCED_JOURNAL),
    {"name": "persistenced-leftovers", "read": ["/var/run/nvidia-persistenced/*", "/run/nvpd/*"]},
    *LOAD,
    cmd("modprobe-nvidia-modeset", "modprobe", "nvidia_modeset", settle=1),
    {"name": "after-modprobe", "read": ["/proc/modules", "/proc/devices", "/sys/module/nvidia*/**",
                                         "/proc/driver/nvidia/**"]},
    cmd("nvidia-modprobe-c0", "nvidia-modprobe", "-c", "0", settle=1),
    cmd("nvidia-modprobe-u-c0", "nvidia-modprobe", "-u", "-c", "0", settle=1),
    cmd("find-dev-nvidia", "find", "/dev", "-maxdepth", "1", "-name", "nvidia*", "-printf",
        "%p %y %M %U:%G\\n"),
    cmd("nvidia-smi-L-after-modprobe", SMI, "-L"),
    # An install line that runs /bin/false, ahead of Debian's own (first file in the order).
    {"name": "write-install-false", "write": "/etc/modprobe.d/00-capture-install-false.conf",
     "text": "install nvidia /bin/false\n"},
    cmd("modprobe-nvidia-install-false", "modprobe", "nvidia", settle=1),
    cmd("modprobe-show-depends-nvidia-install-false", "modprobe", "--show-depends", "nvidia"),
    {"name": "remove-install-false", "remove": "/etc/modprobe.d/00-capture-install-false.conf"},
    # A blacklist line: kmod applies it to aliases only.
    {"name": "write-blacklist", "write": "/etc/modprobe.d/00-capture-blacklist.conf",
     "text": "blacklist nvidia\nblacklist nvidia-current\n"},
    cmd("modprobe-nvidia-blacklisted", "modprobe", "nvidia", settle=1),
    cmd("modprobe-b-nvidia-blacklisted", "modprobe", "-b", "nvidia", settle=1),
    {"name": "remove-blacklist", "remove": "/etc/modprobe.d/00-capture-blacklist.conf"},
    # Last: once set, modules_disabled stays until the next boot.
    {"name": "write-modules-disabled", "write": "/proc/sys/kernel/modules_disabled", "text": "1\n"},
    state("state-modules-disabled"),
    cmd("modprobe-nvidia-modules-disabled", "modprobe", "nvidia", settle=1),
]

# One boot per kernel command line that keeps modules from loading.
CAUSES = {
    "lockdown-integrity": "lockdown=integrity",
    "sig-enforce": "module.sig_enforce=1",
    "module-blacklist": "module_blacklist=nvidia,nvidia_uvm",
    "modprobe-blacklist": "modprobe.blacklist=nvidia,nvidia_current",
}
CAUSE_PLAN = [state("state"), *LOAD, cmd("nvidia-smi-L", SMI, "-L")]
# Debian's headless install without an NVIDIA library (no libcuda1): no /etc/modprobe.d/nvidia.conf.
NO_RULE_PLAN = [state("state"), cmd("modprobe-show-depends-nvidia", "modprobe", "--show-depends", "nvidia"),
                *LOAD]
# The open module (nvidia-open-kernel-dkms next to nvidia-kernel-dkms, chosen with the alternative).
OPEN_PLAN = [cmd("update-alternatives-set-open", "update-alternatives", "--set", "nvidia",
                 "/usr/lib/nvidia/current-open"),
             cmd("modprobe-show-depends-nvidia", "modprobe", "--show-depends", "nvidia"),
             cmd("modinfo-F-firmware-nvidia-current-open", "modinfo", "-F", "firmware", "nvidia-current-open"),
             *LOAD, cmd("nvidia-smi-L", SMI, "-L")]


def without_install_rule(root: Path) -> None:
    (root / "etc/modprobe.d/nvidia.conf").unlink()


def with_install_rule(root: Path) -> None:
    """The open-module tree was made from an image without libcuda1: add Debian's link."""
    link = root / "etc/modprobe.d/nvidia.conf"
    if not link.is_symlink():
        link.symlink_to("/etc/nvidia/nvidia-modprobe.conf")


def prepare(root: Path, plan: list[dict]) -> None:
    image.install_file(HERE / "capture-in-guest.py", root, f"{GUEST_DIR}/capture-in-guest.py")
    (root / GUEST_DIR.lstrip("/") / "plan.json").write_text(json.dumps(plan, indent=1))
    unit = root / "etc/systemd/system/podvm-gpu-capture.service"
    unit.write_text(UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants/podvm-gpu-capture.service"
    wants.symlink_to("/etc/systemd/system/podvm-gpu-capture.service")


def capture(boot_name: str, plan: list[dict], append: str, workdir: Path, source: Path,
            tweak=None) -> dict:
    """Boot a fresh view of source (the real-driver image) with the plan; return the guest's result."""
    with image.writable_view(source, workdir / boot_name / "view") as root:
        prepare(root, plan)
        if tweak:
            tweak(root)
        code, console, wall_s, files = image.run_qemu(root, workdir / boot_name / "artifacts",
                                                      [RESULT], append=append, timeout_s=600)
    if RESULT not in files:
        raise SystemExit(f"{boot_name}: no result (qemu exit {code}, {wall_s:.0f} s):\n{console[-3000:]}")
    print(f"{boot_name}: qemu exit {code}, {wall_s:.0f} s", file=sys.stderr)
    return json.loads(files[RESULT])


def write_fixtures(boot_dir: Path, result: dict) -> None:
    shutil.rmtree(boot_dir, ignore_errors=True)
    boot_dir.mkdir(parents=True)
    if boot_dir.name == "plain":  # the whole boot's kernel log once; the other boots differ only after
        (boot_dir / "kmsg-at-start").write_text("".join(r + "\n" for r in result["kernel_log_at_start"]))
    for run in result["runs"]:
        folder = boot_dir / run["name"]
        if "changed" in run:
            continue
        folder.mkdir()
        if "files" in run:
            (folder / "files.json").write_text(json.dumps(run["files"], indent=1, sort_keys=True) + "\n")
            continue
        (folder / "argv").write_text(json.dumps(run["argv"]) + "\n")
        (folder / "rc").write_text(f"{run['rc']}\n")
        (folder / "stdout").write_text(run["stdout"])
        (folder / "stderr").write_text(run["stderr"])
        (folder / "kmsg").write_text("".join(r + "\n" for r in run["kmsg"]))
        if "journal" in run:
            (folder / "journal").write_text("".join(json.dumps(e, sort_keys=True) + "\n"
                                                    for e in run["journal"]))


def module_version(result: dict) -> str:
    run = next(r for r in result["runs"] if r["name"] == "modinfo-F-version-nvidia-current")
    return run["stdout"].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE.parents[1] / "data")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/podvm-gpu-capture"))
    parser.add_argument("--only", help="one boot: plain, no-install-rule, open-module or a cause name")
    parser.add_argument("--open-rootfs", type=Path, help="the real-driver image with "
                        "nvidia-open-kernel-dkms added (not built by the tests: see the README)")
    args = parser.parse_args()
    image_root = real_driver.nvidia_rootfs()
    boots = {"plain": (PLAIN, "", image_root, None),
             "no-install-rule": (NO_RULE_PLAN, "", image_root, without_install_rule),
             **{name: (CAUSE_PLAN, line, image_root, None) for name, line in CAUSES.items()}}
    if args.open_rootfs:
        boots["open-module"] = (OPEN_PLAN, "", args.open_rootfs, with_install_rule)
    if args.only:
        boots = {args.only: boots[args.only]}
    results = {}
    for name, (plan, append, source, tweak) in boots.items():
        results[name] = capture(name, plan, append, args.work, source, tweak)
    version = module_version(results["plain"]) if "plain" in results else None
    if version is None:
        existing = sorted(args.out.glob("nvidia-*"))
        if not existing:
            raise SystemExit("capture the plain boot first: it names the fixture folder")
        target = existing[-1]
    else:
        target = args.out / f"nvidia-{version}"
    for name, result in results.items():
        write_fixtures(target / name, result)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
