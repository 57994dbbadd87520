"""The real NVIDIA Container Toolkit in place of the stand-ins (issue 36): every scenario whose
boot ends ``ready`` runs once more with NVIDIA's own ``nvidia-ctk`` and ``nvidia-cdi-hook``.

``PODVM_GPU_REAL_TOOLKIT`` names a folder holding real builds of both (the toolkit is not in
Debian and is a Go module: built from NVIDIA/nvidia-container-toolkit's source, never committed
here). Without it this module does not run, and ``.ci/run`` says so in one line.

Per case: the stand-in world boots first (as tests/test_scenarios.py runs it), then a second
world of the same case with the real binaries: ``nvidia-ctk`` in the world's ``bin/`` (every
nvidia-ctk call goes to it, the case's rules for it unused), ``nvidia-cdi-hook`` at the root's
``/usr/bin/nvidia-cdi-hook`` (not on PATH: nvidia-ctk then writes that path, the one the spec's
hooks name in an image), the world's ``libnvidia-ml.so.<driver>`` replaced by the fake NVML
(tests/fake_nvml) describing the world's GPUs in index order beside it (nvidia-ctk gets no
``FAKE_NVML_DESCRIPTION``: the agent passes it only PATH, LD_LIBRARY_PATH and LD_PRELOAD), and
the product run in a private mount namespace whose ``/proc/devices`` is the world's
(tests/real_toolkit_ns.py: ``system create-device-nodes`` reads that path). The boot must end
``ready`` (or, for a toolkit before 1.18.0 and a case that sets ``imex.channels`` or
``cdi.disable_hooks``, ``failed`` naming 1.18.0), and the installed spec must pass the agent's
validation (docs/interface.md section 8) and name the same index devices and ``all`` as the
stand-in's (the UUID names differ by design: each GPU's is the fake NVML's).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import fake_nvml
import pytest
import yaml
from scenarios.world import World, case_files, case_id, load_case

REAL = os.environ.get("PODVM_GPU_REAL_TOOLKIT", "")
if not REAL:
    pytest.skip("PODVM_GPU_REAL_TOOLKIT names no folder of real nvidia-ctk and nvidia-cdi-hook "
                "builds: the real-toolkit suite did not run", allow_module_level=True)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BINARIES = ("nvidia-ctk", "nvidia-cdi-hook")
LIB_DIR = "usr/lib/x86_64-linux-gnu"
CDI_PATH = "var/run/cdi/nvidia.yaml"


def ready_cases() -> list[Path]:
    found = []
    for path in case_files():
        try:
            case = load_case(path)
        except Exception:  # a broken case fails in tests/test_scenarios.py
            continue
        if case.expect.get("boot", {}).get("state") == "ready":
            found.append(path)
    return found


CASES = ready_cases()


@pytest.fixture(scope="module")
def real() -> dict[str, Path]:
    folder = Path(REAL)
    tools = {b: folder / b for b in BINARIES}
    missing = [str(p) for p in tools.values() if not os.access(p, os.X_OK)]
    assert not missing, f"PODVM_GPU_REAL_TOOLKIT={REAL}: not executable: {missing}"
    return tools


@pytest.fixture(scope="module")
def nvml(tmp_path_factory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("nvml"))


def driver_version(world: World) -> str:
    for line in (world.case.kernel_log or []):
        for word in line.split():
            if word.count(".") == 2 and all(p.isdigit() for p in word.split(".")):
                return word
    return "550.54.15"


def real_world(world: World, real: dict[str, Path], nvml: Path) -> None:
    """Put the real binaries and the fake NVML into a freshly built world (module docstring)."""
    layout = world.layout
    ctk = Path(layout.bin, "nvidia-ctk")
    ctk.unlink()
    shutil.copy(real["nvidia-ctk"], ctk)
    hook = Path(world.path("/usr/bin/nvidia-cdi-hook"))
    hook.parent.mkdir(parents=True, exist_ok=True)
    if hook.exists() or hook.is_symlink():
        hook.unlink()
    shutil.copy(real["nvidia-cdi-hook"], hook)
    version = driver_version(world)
    libs = Path(layout.root, LIB_DIR)
    libs.mkdir(parents=True, exist_ok=True)
    target = libs / f"libnvidia-ml.so.{version}"
    if target.exists() or target.is_symlink():
        target.unlink()
    shutil.copy(nvml, target)
    link = libs / "libnvidia-ml.so.1"
    if not link.exists():
        link.symlink_to(target.name)
    gpus = sorted(dev["address"] for dev in world.case.pci + world.case.pci_late
                  if str(dev.get("vendor")).lower() == "0x10de"
                  and str(dev.get("class", "")).lower().startswith("0x03"))
    from podvm_gpu.host.fs import Root
    from podvm_gpu.readers import gpu_minor

    # a GPU whose information file the case gives keeps that minor; the others get the ones
    # the world's load_module effect gives (the next free, in PCI order)
    given = {a: gpu_minor(Root(layout.root), a) for a in gpus}
    free = (m for m in range(256) if m not in given.values())
    fake_nvml.describe(libs / fake_nvml.BESIDE,
                       [fake_nvml.gpu(i, pci="0000" + a.upper(),
                                      minor=given[a] if given[a] is not None else next(free))
                        for i, a in enumerate(gpus)],
                       driver_version=version)


def device_names(world: World) -> tuple[list[str], str]:
    text = Path(world.path("/" + CDI_PATH)).read_text()
    names = [d["name"] for d in yaml.safe_load(text)["devices"]]
    return sorted(n for n in names if not n.startswith("GPU-") and not n.startswith("MIG-")), text


def needs_1_18(case) -> bool:
    config = yaml.safe_load(case.files.get("etc/podvm-gpu/config.yaml", "") or "") or {}
    return bool((config.get("imex") or {}).get("channels")) or \
        bool((config.get("cdi") or {}).get("disable_hooks"))


@pytest.mark.parametrize("case_file", CASES, ids=[case_id(p) for p in CASES])
def test_the_real_toolkit_gives_the_stand_in_s_devices(case_file, real, nvml, monkeypatch):
    from podvm_gpu import nvidia_ctk
    from podvm_gpu.cdi.parse import parse_spec
    from podvm_gpu.cdi.ready import check_ready_spec
    from podvm_gpu.host.fs import Root
    from podvm_gpu.readers import gpu_minor

    case = load_case(case_file)
    with World(case) as world:
        stand_in = world.run("boot")
        assert stand_in.status and stand_in.status["state"] == "ready", stand_in.stderr[-2000:]
        expected, _ = device_names(world)
    version = nvidia_ctk.parse_version(os.popen(f"{shlex.quote(str(real['nvidia-ctk']))} "
                                                "--version").read())
    with World(case) as world:
        real_world(world, real, nvml)
        monkeypatch.setenv("PODVM_GPU_CMD", shlex.join(
            [sys.executable, str(HERE / "real_toolkit_ns.py"), world.layout.root, str(REPO),
             sys.executable, "-m", "podvm_gpu"]))
        run = world.run("boot")
        status = run.status or {}
        said = f"{status.get('reason')}\n{run.stderr[-3000:]}"
        if version and version.number < nvidia_ctk.SINCE_1_18 and needs_1_18(case):
            assert status.get("state") == "failed", said
            assert "needs nvidia-ctk 1.18.0 or later" in status.get("reason", ""), said
            return
        assert status.get("state") == "ready", said
        names, text = device_names(world)
        spec = parse_spec(text, source="real nvidia-ctk")
        root = Root(world.layout.root)
        minors = {g["pci_address"]: gpu_minor(root, g["pci_address"]) for g in status["gpus"]}
        assert check_ready_spec(spec, root, minors) == []
        assert names == expected, text[:2000]
        assert status.get("nvidia_ctk_version") == (version.text if version else None)


# --- issue 42: a spec naming a hook the node's binary lacks, with the real binaries ------------
# Where REAL is the 1.20.0 folder of ../shared/nvidia-ctk and 1.18.2's is beside it (as CI has
# them, .ci/run): a 1.20.0 spec names update-application-profile, which 1.18.2's nvidia-cdi-hook
# lacks and only warns about (exit 0): the boot fails naming the hook, the binary and its
# version; with 1.20.0's own hook binary the same boot is ready. Run once, with the 1.20.0 folder.
SIBLINGS = Path(REAL).resolve().parent
if Path(REAL).resolve().name == "1.20.0" and (SIBLINGS / "1.18.2" / "nvidia-cdi-hook").exists():
    @pytest.mark.parametrize("hook_version", ["1.18.2", "1.20.0"])
    def test_a_1_20_spec_with_an_older_hook_binary_fails_naming_the_hook(hook_version, real, nvml,
                                                                         monkeypatch):
        tools = {"nvidia-ctk": real["nvidia-ctk"],
                 "nvidia-cdi-hook": SIBLINGS / hook_version / "nvidia-cdi-hook"}
        case = load_case(next(p for p in CASES if case_id(p) == "P02"))
        with World(case) as world:
            real_world(world, tools, nvml)
            monkeypatch.setenv("PODVM_GPU_CMD", shlex.join(
                [sys.executable, str(HERE / "real_toolkit_ns.py"), world.layout.root, str(REPO),
                 sys.executable, "-m", "podvm_gpu"]))
            run = world.run("boot")
            status = run.status or {}
            said = f"{status.get('reason')}\n{run.stderr[-3000:]}"
            if hook_version == "1.20.0":
                assert status.get("state") == "ready", said
                return
            assert status.get("state") == "failed", said
            assert "the spec names hook update-application-profile, which " \
                "/usr/bin/nvidia-cdi-hook (nvidia-cdi-hook 1.18.2) does not have" in said, said
            assert "nvidia-ctk 1.20.0" in said, said
