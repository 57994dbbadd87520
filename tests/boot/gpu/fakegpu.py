#!/usr/bin/python3
"""Fake NVIDIA tools for the GPU boot test: one 1 x H100 PCIe VM where every tool succeeds.

One multi-call script, installed in the test rootfs as ``/srv/gpu/bin/fakegpu`` with links named
``modprobe``, ``nvidia-ctk``, ``nvidia-persistenced``, ``nvidia-smi`` and ``nv-fabricmanager``
(no ``nvidia-modprobe``: under a root the agent makes GPU nodes with mknod); the GPU test's
drop-in puts ``/srv/gpu/bin`` first on the agent's PATH.
Each tool changes the fake root (``/srv/gpu/root``, the agent's ``PODVM_GPU_ROOT``) the way the
real one changes a VM, with the world shape of field case P02 and the vocabulary of
``shared/cases/EFFECTS.md``. PCI devices come from umockdev (``/sys`` is mocked for the agent and
everything it runs), so loading ``nvidia`` also binds the GPU in the umockdev testbed, as the
kernel would. Every call is appended to ``/srv/gpu/calls.log`` (one JSON list per line).

Standard library only: this runs on the test image's own python3.
"""

import json
import os
import signal
import socket
import sys
import syslog
import time

HOME = os.environ.get("FAKEGPU_HOME", "/srv/gpu")
ROOT = os.path.join(HOME, "root")
DRIVER_VERSION = "550.54.15"
UVM_MAJOR = 510
GPU_NAME = "NVIDIA H100 PCIe"
GPU_UUID = "GPU-3f6c1a2e-7b4d-4e8a-9c1f-0d2e4b6a8c00"
PERSISTENCED_DIR = "var/run/nvidia-persistenced"
# A boot test that needs a boot failing after persistenced started creates this file: then
# "nvidia-ctk cdi generate" fails as nvidia-ctk does when NVML cannot be used.
FAIL_CDI_GENERATE = os.path.join(HOME, "fail-cdi-generate")
# A boot test of a daemon that fails to start creates this file (see nvidia_persistenced).
FAIL_PERSISTENCED = os.path.join(HOME, "fail-persistenced")
# ... and this one for a daemon that is killed by SIGKILL while it initialises.
KILL_PERSISTENCED = os.path.join(HOME, "kill-persistenced")
# ... and this one for a daemon that initialises for ever (many CC GPUs, a slow attach): its
# first process never hands over, the unit stays "activating".
HANG_PERSISTENCED = os.path.join(HOME, "hang-persistenced")
# What the fake persistenced did: "started PID" and "SIGTERM PID" lines (under /srv, which
# outlives the boot: the tests read it after power-off).
PERSISTENCED_EVENTS = os.path.join(HOME, "persistenced-events.log")
# The GPU in CC mode (issue 26's attestation boot): present, conf-compute answers CC on and
# keeps the ready state in CC_READY; absent, CC is off as before.
CC_ON = os.path.join(HOME, "cc-on")
CC_READY = os.path.join(HOME, "cc-ready")


def under(root, path):
    return os.path.join(root, path.lstrip("/"))


def read(path, default=""):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return default


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def option(args, name, default=None):
    """Value of ``--name=V`` or ``--name V`` in args."""
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return default


def fail(tool, args, code=1):
    print(f"fake {tool}: unsupported call: {' '.join(args)}", file=sys.stderr)
    return code


def nvidia_gpus():
    """PCI addresses of the NVIDIA GPUs the (mocked) /sys shows, in address order."""
    found = []
    for addr in sorted(os.listdir("/sys/bus/pci/devices")):
        dev = f"/sys/bus/pci/devices/{addr}"
        vendor = read(f"{dev}/vendor").strip()
        klass = read(f"{dev}/class").strip()
        if vendor == "0x10de" and klass[:6] in ("0x0300", "0x0302"):
            found.append(addr)
    return found


def bind_to_nvidia(addr):
    """What the kernel does when nvidia.ko loads: the GPU gets driver ``nvidia`` (umockdev testbed)."""
    testbed = os.environ.get("UMOCKDEV_DIR")
    if not testbed:
        return
    device = os.path.realpath(f"{testbed}/sys/bus/pci/devices/{addr}")
    os.makedirs(f"{testbed}/sys/bus/pci/drivers/nvidia", exist_ok=True)
    if not os.path.lexists(f"{device}/driver"):
        os.symlink("../../../bus/pci/drivers/nvidia", f"{device}/driver")
        with open(f"{device}/uevent", "a", encoding="utf-8") as f:
            f.write("DRIVER=nvidia\n")


def add_char_device(major, name):
    path = under(ROOT, "/proc/devices")
    lines = read(path).splitlines()
    entry = f"{major:3d} {name}"
    if entry in lines:
        return
    # Character devices come first in /proc/devices, then a blank line, then block devices.
    end = lines.index("") if "" in lines else len(lines)
    lines.insert(end, entry)
    write(path, "\n".join(lines) + "\n")


def modprobe(args):
    names = [a for a in args if not a.startswith("-") and "=" not in a]
    if not names:
        return fail("modprobe", args)
    module = names[0].replace("-", "_")
    if module not in ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"):
        print(f"modprobe: FATAL: Module {module} not found in directory /lib/modules/6.8.0-1015-example",
              file=sys.stderr)
        return 1
    modules = under(ROOT, "/proc/modules")
    if not any(line.split(" ", 1)[0] == module for line in read(modules).splitlines()):
        write(modules, read(modules) + f"{module} 12345 0 - Live 0x0000000000000000\n")
    os.makedirs(under(ROOT, f"/sys/module/{module}"), exist_ok=True)
    testbed = os.environ.get("UMOCKDEV_DIR")
    if testbed:  # the kernel's /sys/module/<name>, which an agent on the VM's own root reads
        write(f"{testbed}/sys/module/{module}/initstate", "live\n")
    if module == "nvidia":
        write(under(ROOT, "/sys/module/nvidia/version"), DRIVER_VERSION + "\n")
        write(under(ROOT, "/proc/driver/nvidia/version"),
              f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER_VERSION}  Release Build"
              "  (builder@buildhost)  Tue Mar  5 22:15:33 UTC 2024\n")
        add_char_device(195, "nvidia")
        for minor, addr in enumerate(nvidia_gpus()):
            write(under(ROOT, f"/proc/driver/nvidia/gpus/{addr}/information"),
                  f"Model: \t\t {GPU_NAME}\nIRQ:   \t\t 42\nGPU UUID: \t {GPU_UUID}\n"
                  f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                  f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {addr}\nDevice Minor: \t {minor}\n"
                  "GPU Excluded:\t No\n")
            bind_to_nvidia(addr)
    elif module == "nvidia_uvm":
        add_char_device(UVM_MAJOR, "nvidia-uvm")
    return 0


def majors():
    table = {}
    for line in read(under(ROOT, "/proc/devices")).split("\n\n")[0].splitlines()[1:]:
        number, _, name = line.strip().partition(" ")
        table[name] = int(number)
    return table


def mknod(dev_root, name, major, minor):
    path = under(dev_root, f"/dev/{name}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path):
        os.mknod(path, 0o20666, os.makedev(major, minor))
        os.chmod(path, 0o666)


def nvidia_ctk(args):
    if args[:1] == ["--version"]:
        print("NVIDIA Container Toolkit CLI version 1.20.0\ncommit: d34b3046758cb1a5db606b2a39519c731bbf9f56")
        return 0
    if args[:2] == ["system", "create-device-nodes"]:
        dev_root = option(args, "--dev-root", "/")
        table = majors()
        if "nvidia" not in table:
            print('level=error msg="failed to create device nodes: no major for nvidia"', file=sys.stderr)
            return 1
        mknod(dev_root, "nvidiactl", table["nvidia"], 255)
        mknod(dev_root, "nvidia-modeset", table["nvidia"], 254)
        if "nvidia-uvm" in table:
            mknod(dev_root, "nvidia-uvm", table["nvidia-uvm"], 0)
            mknod(dev_root, "nvidia-uvm-tools", table["nvidia-uvm"], 1)
        return 0
    if args[:2] == ["cdi", "generate"] and os.path.exists(FAIL_CDI_GENERATE):
        # the last line of nvidia-ctk 1.20.0 without NVML (shared/fixtures/nvidia-ctk/generate-no-nvml.txt)
        print('level=error msg="failed to generate CDI spec: failed to create device CDI specs: '
              'failed to construct device spec generators: failed to initialize NVML: '
              'ERROR_LIBRARY_NOT_FOUND"', file=sys.stderr)
        return 1
    if args[:2] == ["cdi", "generate"]:
        # As nvidia-ctk does: the driver root goes in front of every hostPath.
        prefix = option(args, "--dev-root") or option(args, "--driver-root") or "/"
        spec = read(os.path.join(HOME, "spec-1gpu.yaml"))
        if prefix.rstrip("/"):
            spec = spec.replace("hostPath: /", f"hostPath: {prefix.rstrip('/')}/")
        print("level=info msg=\"Auto-detected mode as 'nvml'\"", file=sys.stderr)
        print('level=info msg="Generated CDI spec with version 0.5.0"', file=sys.stderr)
        output = option(args, "--output", "")
        if not output:
            sys.stdout.write(spec)
            return 0
        if not output.endswith((".yaml", ".json")):
            output += ".yaml"
        write(output, spec)
        return 0
    return fail("nvidia-ctk", args)


def online_memory():
    """What the real daemon does on Grace-based GPUs (nvidia-numa.c): have GPU memory onlined
    through memory hotplug in sysfs. Here the current value is written back, which changes
    nothing; the result says whether the daemon's sandbox allows the write."""
    path = "/sys/devices/system/memory/auto_online_blocks"
    try:
        with open(path, encoding="ascii") as f:
            value = f.read().strip()
        with open(path, "w", encoding="ascii") as f:
            f.write(value)
    except OSError as err:
        return err.strerror or str(err)
    return "written"


def event(line):
    with open(PERSISTENCED_EVENTS, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def nvidia_persistenced(args):
    """Daemonise as the real one does (nvidia-persistenced.c, daemonize() and main()): fork once;
    the parent waits on a pipe until the child has set up the GPUs and its socket, then exits 0,
    or prints "nvidia-persistenced failed to initialize. Check syslog for more details." and exits
    1; the child says "Started (PID)" to syslog, and "Shutdown (PID)" when it ends (SIGTERM, or
    a failure after its syslog error). With FAIL_PERSISTENCED present it fails the way the real
    one fails without usable device nodes."""
    if args[:1] == ["--version"]:
        print(f"nvidia-persistenced:  version {DRIVER_VERSION}")
        return 0
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child:
        os.close(write_fd)
        if os.path.exists(KILL_PERSISTENCED):
            # killed mid-initialisation (the OOM killer, an operator's kill -9): no message
            os.kill(child, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        if os.read(read_fd, 1) != b"\x01":
            print("nvidia-persistenced failed to initialize. Check syslog for more details.",
                  file=sys.stderr)
            return 1
        return 0
    os.close(read_fd)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    rundir = under(ROOT, PERSISTENCED_DIR)
    os.makedirs(rundir, exist_ok=True)
    pid = os.getpid()
    write(under(ROOT, f"/proc/{pid}/comm"), "nvidia-persiste\n")
    write(under(ROOT, f"/proc/{pid}/cmdline"), "\0".join(["nvidia-persistenced", *args]) + "\0")
    write(os.path.join(rundir, "nvidia-persistenced.pid"), f"{pid}\n")
    syslog.openlog("nvidia-persistenced", 0, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_NOTICE, f"Started ({pid})")
    event(f"started {pid}")

    def shutdown(status):
        os.unlink(os.path.join(rundir, "nvidia-persistenced.pid"))
        syslog.syslog(syslog.LOG_NOTICE, f"Shutdown ({pid})")
        os._exit(status)

    if os.path.exists(FAIL_PERSISTENCED):
        syslog.syslog(syslog.LOG_ERR, "Failed to query NVIDIA devices. Please ensure that the "
                      "NVIDIA device files (/dev/nvidia*) exist, and that user 0 has read and "
                      "write permissions for those files.")
        shutdown(1)
    if os.path.exists(HANG_PERSISTENCED):
        def still_initialising(*_):
            event(f"SIGTERM {pid}")
            shutdown(0)

        signal.signal(signal.SIGTERM, still_initialising)
        event(f"initialising {pid}")
        while True:
            signal.pause()
    event(f"auto_online_blocks {online_memory()}")
    time.sleep(0.2)  # a real one initialises the GPUs before its socket appears
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(rundir, "socket"))
    sock.listen(1)
    os.write(write_fd, b"\x01")
    os.close(write_fd)

    def on_sigterm(*_):
        event(f"SIGTERM {pid}")
        shutdown(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    while True:
        signal.pause()


def nvidia_smi(args):
    if args == ["-L"]:
        print(f"GPU 0: {GPU_NAME} (UUID: {GPU_UUID})")
        return 0
    if args[:2] == ["conf-compute", "-f"]:
        if os.path.exists(CC_ON):  # what the agent's own sandbox allows (its children's)
            import socket

            try:
                socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
                write(os.path.join(HOME, "agent-inet"), "allowed\n")
            except OSError as err:
                write(os.path.join(HOME, "agent-inet"), f"refused: {err}\n")
        print("CC status: ON" if os.path.exists(CC_ON) else "CC status: OFF")
        return 0
    if os.path.exists(CC_ON) and args[:1] == ["conf-compute"]:
        answers = {"-d": "DevTools Mode: OFF", "-e": "CC Environment: PRODUCTION",
                   "-mgm": "Multi-GPU Mode: None",
                   "-grs": "Confidential Compute GPUs Ready state: "
                           + ("ready" if read(CC_READY).strip() == "1" else "not-ready")}
        if args[1:2] == ["-srs"] and args[2:] in (["1"], ["0"]):
            # written in place, never removed: the watcher's test grants this one file
            write(CC_READY, args[2] + "\n")
            print("Confidential Compute GPUs Ready state: "
                  + ("ready" if args[2] == "1" else "not-ready"))
            return 0
        if args[1] in answers:
            print(answers[args[1]])
            return 0
    if args[:1] == ["-q"]:
        print("\n==============NVSMI LOG==============\n\n"
              f"Driver Version                            : {DRIVER_VERSION}\n"
              "Attached GPUs                             : 1\nGPU 00000000:00:04.0\n"
              f"    Product Name                          : {GPU_NAME}\n"
              "    Fabric\n        State                             : N/A\n"
              "        Status                            : N/A\n")
        return 0
    fields = option(args, "--query-gpu")
    if fields:
        values = {"index": "0", "name": GPU_NAME, "uuid": GPU_UUID, "pci.bus_id": "00000000:00:04.0",
                  "driver_version": DRIVER_VERSION, "mig.mode.current": "Disabled",
                  "persistence_mode": "Enabled"}
        print(", ".join(values.get(f, "[N/A]") for f in fields.split(",")))
        return 0
    return fail("nvidia-smi", args)


def nv_fabricmanager(args):
    print("fake nv-fabricmanager: this VM has no NVSwitch", file=sys.stderr)
    return 1


TOOLS = {"modprobe": modprobe, "nvidia-ctk": nvidia_ctk, "nvidia-persistenced": nvidia_persistenced,
         "nvidia-smi": nvidia_smi, "nv-fabricmanager": nv_fabricmanager}


def main():
    tool = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    with open(os.path.join(HOME, "calls.log"), "a", encoding="utf-8") as log:
        log.write(json.dumps([tool, *args]) + "\n")
    if tool not in TOOLS:
        return fail(tool, args, 127)
    return TOOLS[tool](args)


if __name__ == "__main__":
    sys.exit(main())
