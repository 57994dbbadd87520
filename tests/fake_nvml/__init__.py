"""The fake ``libnvidia-ml.so.1`` (fake_nvml.c): build it, describe GPUs, make a GPU pod VM root.

The root is what a pod VM looks like after a ``ready`` boot: status.json written by the
product's own :class:`podvm_gpu.status.StatusFile`, nvidia-persistenced's pid file naming a
process whose ``/proc/<pid>/comm`` says so, a kernel log, and the library where the loader
finds it (``/usr/lib/x86_64-linux-gnu``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
SMI_SOURCE = HERE / "smi_calls.c"  # included by fake_nvml.c: the calls the real nvidia-smi makes
# The functions fake_nvml.c exports (the ones the exporter reaches through nvidia-ml-py).
FUNCTIONS = [
    "nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetConfComputeSettings",
    "nvmlSystemGetConfComputeState", "nvmlSystemGetConfComputeGpusReadyState",
    "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID",
    "nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetFieldValues",
    # what NVIDIA's real nvidia-ctk's cdi generate also calls (issue 36, nvidia-ctk-real.md)
    "nvmlDeviceGetMinorNumber", "nvmlDeviceGetHandleByUUID", "nvmlDeviceIsMigDeviceHandle",
]
# The description beside the library, read when FAKE_NVML_DESCRIPTION is not set (nvidia-ctk
# gets only PATH, LD_LIBRARY_PATH and LD_PRELOAD from the agent).
BESIDE = "fake-nvml.description"
# What NVIDIA's real nvidia-smi also needs for the agent's command lines (tests/test_real_nvidia_smi.py).
SMI_FUNCTIONS = [
    "nvmlInternalGetExportTable", "nvmlSystemGetNVMLVersion", "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetIndex", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetPciInfoExt", "nvmlSystemSetConfComputeGpusReadyState",
    "nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlDeviceGetGpuInstances", "nvmlGpuInstanceGetInfo",
]
# Of those, what Debian 12's real libnvidia-ml1 535.309.01 does not export (checked against
# the real library by test_metrics_real_nvml.py).
ABSENT_IN_535 = ["nvmlSystemGetConfComputeSettings", "nvmlDeviceGetTemperatureV",
                 "nvmlDeviceGetGpuFabricInfoV"]
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
PERSISTENCED_PID = 4242
# daemon -> its pid file (podvm_gpu/readers.py, podvm_gpu/steps/fabric/nvl5.py)
FABRIC_DAEMON_FILES = {"nvlsm": "/run/podvm-gpu/nvlsm.pid",
                       # a pid of the root's own /proc: nothing runs under it on this host
                       "nv-fabricmanager": "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"}


def build(out_dir: Path, branch: int | None = None) -> Path:
    """Compile the fake with gcc into ``out_dir`` (cached by the source's hash).

    Args:
        branch: 535 for a library with only what the 535 branch has; None for a current one.

    Returns:
        The path of the built ``libnvidia-ml.so.1``.
    """
    source = SOURCE.read_bytes() + SMI_SOURCE.read_bytes()
    key = hashlib.sha256(source + str(branch).encode()).hexdigest()[:12]
    target = out_dir / f"fake-nvml-{branch or 'current'}-{key}" / "libnvidia-ml.so.1"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        argv = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
                f"-DFAKE_NVML_BRANCH={branch or 0}", "-o", str(target), str(SOURCE)]
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    return target


def gpu(index: int, **fields) -> dict[str, object]:
    """An H100 SXM5 as NVML describes it, with ``fields`` (description keys such as
    ``**{"temp.slowdown": 80}``, or ``lost=1``) replaced or added; a value None removes the key
    (the GPU does not support it)."""
    desc: dict[str, object] = {
        "uuid": f"GPU-5c7d10a2-4e7b-11ee-8c99-0242ac12{index:04x}",
        "name": "NVIDIA H100 80GB HBM3",
        "pci": f"00000000:{0x18 + index * 0x10:02X}:00.0",
        "temp": 34 + index, "temp.slowdown": 92, "temp.shutdown": 97, "temp.gpu_max": 87,
        "ecc.sbe_vol": 0, "ecc.dbe_vol": 0, "ecc.sbe_agg": 2, "ecc.dbe_agg": 0,
        "retired.sbe": 0, "retired.dbe": 0, "retired.pending": 0,
        "remap.correctable": 1, "remap.uncorrectable": 0, "remap.pending": 0, "remap.failure": 0,
        "pcie_replay": 0, "power_mw": 71234, "energy_mj": 987654321,
        "clock.sm": 1980, "clock.mem": 2619,
        "util.gpu": 7, "util.memory": 2, "util.encoder": 0, "util.decoder": 0,
        "mem.total": 85520809984, "mem.reserved": 566231040, "mem.used": 4194304,
        "mem.free": 84950384640,
    }
    desc.update(fields)
    return {k: v for k, v in desc.items() if v is not None}


CC_MODES = {"off": (0, 0, 0), "on": (1, 0, 0), "devtools": (1, 1, 0), "ppcie": (0, 0, 1)}


def describe(path: Path, gpus: list[dict], *, cc: str = "off", cc_ready: int = 1,
             error: dict | None = None, hang: dict | None = None, **system) -> Path:
    """Write a description file.

    Args:
        gpus: dicts as :func:`gpu` makes them.
        cc: the CC mode, a key of :data:`CC_MODES` (feature, dev-tools, multi-GPU mode).
        error, hang: ``{"nvmlDeviceGetPowerUsage.3": 15}``: that call (on GPU 3; without the
            index on every GPU) returns 15 / never returns.
        system: other keys as they are (``driver_version``, ``init_error``, ``log``,
            ``cc.error``).
    """
    feature, devtools, multigpu = CC_MODES[cc]
    lines = [f"driver_version {system.pop('driver_version', '550.54.15')}", f"gpus {len(gpus)}",
             f"cc.feature {feature}", f"cc.devtools {devtools}", f"cc.multigpu {multigpu}",
             f"cc.ready {cc_ready}"]
    for kind, calls in (("error", error or {}), ("hang", hang or {})):
        lines += [f"{kind}.{call} {value}" for call, value in calls.items()]
    lines += [f"{key} {value}" for key, value in system.items()]
    for i, g in enumerate(gpus):
        lines += [f"gpu.{i}.{k} {v}" for k, v in g.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_root(root: Path, lib: Path | None, *, state: str = "ready", gpus: int = 8,
              nvswitches: int = 0, persistenced: bool = True, kernel_log: list[str] = (),
              reason: str | None = None, fabric: str | None = None,
              running: tuple[str, ...] = (), attestation: dict | None = None,
              binding: dict | None = None) -> Path:
    """A pod VM root after a boot that ended in ``state`` with ``gpus`` GPUs found on PCI.

    Args:
        lib: the library to install as ``libnvidia-ml.so.1`` (copied), or None for none.
        persistenced: True: persistenced's pid file names a live ``nvidia-persistenced``.
        kernel_log: messages for ``/dev/kmsg`` (a plain file under the root), as the kernel
            writes them after the record prefix.
        fabric: status.json's ``fabric.kind`` (podvm_gpu/steps/fabric/fabric_kind.py); None: ``nvswitch``
            with NVSwitches, else ``none``; ``nvlink5`` gets port mlx5_2 and its GUID.
        running: fabric daemons whose pid files name a live process (``nvlsm``,
            ``nv-fabricmanager``).
        attestation: status.json's ``attestation`` record (docs/interface.md 3.11), or None.
        binding: status.json's ``binding`` record (docs/interface.md 3.14), or None.
    """
    from podvm_gpu.cdi import SPEC_PATH as CDI_SPEC_PATH
    from podvm_gpu.host.fs import Root
    from podvm_gpu.model import PciDevice, Status, Step, StepResult
    from podvm_gpu.status import READY_STEPS, StatusFile
    from podvm_gpu.steps.fabric.fabric_kind import Fabric

    status = Status()
    status.gpus = [PciDevice(f"0000:{0x18 + i * 0x10:02x}:00.0", "10de", "2330", "030200", "nvidia",
                             "H100 SXM5 80GB") for i in range(gpus)]
    status.nvswitches = [PciDevice(f"0000:{0x90 + i:02x}:00.0", "10de", "22a3", "068000", "nvidia",
                                   "NVSwitch") for i in range(nvswitches)]
    status.fabric = Fabric(fabric or ("nvswitch" if nvswitches else "none"),
                           [s.pci_address for s in status.nvswitches], [], [])
    status.attestation = attestation
    status.binding = binding
    if status.fabric.kind == "nvlink5":
        status.fabric.port, status.fabric.guid = "mlx5_2", "0xa088c20300543a1e"
    # every GPU step, as a ready boot has them (a ready document without them is unreadable:
    # interface.md 4.4); the failed boot fails at cdi
    seconds = {"detect": 0.004, "modules": 1.9, "persistenced": 11.2, "cdi": 0.8}
    for name, _results in READY_STEPS:
        step = Step(name, StepResult.OK if state != "failed" or name != "cdi" else StepResult.FAILED)
        step.duration_s = seconds.get(name, 0.01)
        status.steps.append(step)
    if state != "no-gpu":
        status.driver_version = "550.54.15"
    if state == "ready":
        status.cdi = {"path": CDI_SPEC_PATH, "kind": "nvidia.com/gpu",
                      "devices": [str(i) for i in range(gpus)] + ["all"]}
    if state == "running":
        StatusFile(Root(root)).write(status)
    else:
        StatusFile(Root(root)).finish(status, state, reason)
    if persistenced:
        pid_dir = root / "var/run/nvidia-persistenced"
        pid_dir.mkdir(parents=True, exist_ok=True)
        (pid_dir / "nvidia-persistenced.pid").write_text(f"{PERSISTENCED_PID}\n")
        proc = root / f"proc/{PERSISTENCED_PID}"
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "comm").write_text("nvidia-persiste\n")
    for pid, (daemon, pid_file) in enumerate(sorted(FABRIC_DAEMON_FILES.items()), 4243):
        if daemon in running:
            (root / pid_file.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / pid_file.lstrip("/")).write_text(f"{pid}\n")
            (root / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
            (root / f"proc/{pid}/comm").write_text(daemon[:15] + "\n")
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev/kmsg").write_text("".join(f"6,{i},{1000 * i},-;{m}\n"
                                           for i, m in enumerate(kernel_log)))
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/hostname").write_text("podvm-gpu-test-1\n")
    if lib is not None:
        libdir = root / LIB_DIR.lstrip("/")
        libdir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, libdir / "libnvidia-ml.so.1")
    return root


def metrics_env(description: Path | None, **extra: str) -> dict[str, str]:
    """The environment for a ``python -m podvm_gpu.metrics`` child that loads the fake."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PODVM_GPU_ROOT", "PODVM_GPU_CONFIG", "FAKE_NVML_DESCRIPTION")}
    # the test-only opening (podvm_gpu/gpufacts/nvml.py TEST_FOREIGN_NVML): the fake lives under
    # a temporary root, which production never loads NVML from (issue 47 item 3)
    env["PODVM_GPU_TEST_FOREIGN_NVML"] = "1"
    if description is not None:
        env["FAKE_NVML_DESCRIPTION"] = str(description)
    env.update(extra)
    return env
