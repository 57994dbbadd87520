"""``check --image`` where what ``modprobe nvidia`` reaches is not what the image holds (issue 18),
on the stand-in image of tests/test_check_image.py (real ELF modules with a ``.modinfo`` section):
a module file that ``modules.dep`` still names after it was removed, no module at all, and tool
paths that the config names instead of ``PATH``. The same cases on Debian's real images are in
tests/test_open_driver_image.py and tests/test_trixie_driver_image.py.
"""

from __future__ import annotations

import shutil

from boot.nvidia_image import MODULES, VERSION
from test_check_image import check_image, make_image


def _kernel(root) -> str:
    return next((root / "lib/modules").iterdir()).name


def index_modules(root) -> str:
    """A modules.dep for the stand-in modules, as depmod writes it (paths relative to the tree)."""
    release = _kernel(root)
    (root / f"lib/modules/{release}/modules.dep").write_text(
        "".join(f"updates/dkms/{name}.ko:\n" for name in MODULES))
    return release


def test_a_module_file_that_modules_dep_still_names_fails_modules_naming_the_file(tmp_path):
    """A DKMS build removed without depmod: modprobe would reach a file that is not there."""
    root = make_image(tmp_path)
    release = index_modules(root)
    assert check_image(root)[0] == 0
    (root / f"lib/modules/{release}/updates/dkms/nvidia.ko").unlink()
    code, checks = check_image(root)
    assert code == 1
    modules = checks["modules"]
    assert modules["result"] == "fail", modules
    assert f"/lib/modules/{release}/updates/dkms/nvidia.ko" in modules["detail"], modules
    assert "not there" in modules["detail"] and "modules.dep" in modules["detail"], modules
    assert "depmod" in modules["hint"], modules
    # the rows that read the module say there is none to read, and do not pass
    for name in ("versions", "firmware"):
        assert checks[name]["result"] != "pass", checks[name]
        assert "cannot read" not in checks[name]["detail"], checks[name]


def test_without_any_nvidia_module_versions_and_firmware_do_not_pass(tmp_path):
    root = make_image(tmp_path)
    shutil.rmtree(root / f"lib/modules/{_kernel(root)}/updates")
    code, checks = check_image(root)
    assert code == 1
    assert checks["modules"]["result"] == "fail", checks["modules"]
    for name in ("versions", "firmware"):
        row = checks[name]
        assert row["result"] == "skip", row
        assert "no nvidia module" in row["detail"] and "modules" in row["detail"], row
    assert VERSION not in checks["versions"]["detail"], "no module version was read"


def _configure_tool(root, tool: str, path: str, write: bool = True) -> None:
    config = root / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"tools: {{{tool}: {path}}}\n")
    if write:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("#!/bin/sh\nexit 0\n")
        target.chmod(0o755)


def test_a_tool_the_config_places_elsewhere_is_found_there(tmp_path):
    root = make_image(tmp_path)
    (root / "usr/bin/nvidia-ctk").unlink()
    _configure_tool(root, "nvidia-ctk", "/opt/nv/bin/nvidia-ctk")
    code, checks = check_image(root)
    tools = checks["tools"]
    assert tools["result"] == "pass", tools
    assert "nvidia-ctk at /opt/nv/bin/nvidia-ctk (config)" in tools["detail"], tools


def test_a_tool_the_config_places_where_nothing_is_fails_though_path_has_one(tmp_path):
    """Boot runs the configured path, never the PATH one, so the image check must judge that."""
    root = make_image(tmp_path)
    _configure_tool(root, "nvidia-persistenced", "/opt/nv/bin/nvidia-persistenced", write=False)
    assert (root / "usr/bin/nvidia-persistenced").exists()
    code, checks = check_image(root)
    assert code == 1
    tools = checks["tools"]
    assert tools["result"] == "fail", tools
    assert "nvidia-persistenced: /opt/nv/bin/nvidia-persistenced (set in the config) is not an " \
           "executable" in tools["detail"], tools


def _kmod_finds(root, release: str, module: str = "nvidia") -> bool:
    """What the real kmod says: ``modprobe -d <image> -S <release> --show-depends <module>``."""
    import subprocess

    from boot.nvidia_image import kmod_program

    done = subprocess.run([kmod_program("modprobe"), "-d", str(root), "-S", release,
                           "--show-depends", module], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        assert f"Module {module} not found in directory" in done.stderr, done.stderr
        return False
    assert done.stdout.split()[:2] == ["insmod", f"{root}/lib/modules/{release}/updates/dkms/"
                                       f"{module}.ko"], done.stdout
    return True


def test_the_modules_row_agrees_with_real_kmod_on_a_kernel_depmod_has_not_indexed(tmp_path):
    """Issue 35 item 2: an image whose kernel had no modules.dep passed ``modules`` (the row
    scanned the tree and named modules.dep as its source) while kmod 30 said ``FATAL: Module
    nvidia not found in directory``. The row is held to the real kmod in each state: indexed by
    the builder's ``depmod -b``; no index (kmod reads modules.dep.bin alone: the text
    modules.dep without it finds nothing either); after the hint's own command."""
    import subprocess

    from boot.nvidia_image import kmod_program

    root = make_image(tmp_path)
    release = _kernel(root)
    folder = root / f"lib/modules/{release}"
    assert _kmod_finds(root, release) and check_image(root)[1]["modules"]["result"] == "pass"

    (folder / "modules.dep.bin").unlink()
    assert (folder / "modules.dep").is_file()
    code, checks = check_image(root)
    assert not _kmod_finds(root, release)
    assert code == 1 and checks["modules"]["result"] == "fail", checks["modules"]

    for index in folder.glob("modules.*"):
        index.unlink()
    code, checks = check_image(root)
    assert not _kmod_finds(root, release)
    modules = checks["modules"]
    assert code == 1 and modules["result"] == "fail", modules
    assert modules["detail"].startswith(f"kernel {release}: no /lib/modules/{release}/"
                                        "modules.dep.bin: "), modules
    assert modules["hint"] == f"run depmod -b {root} {release}", modules

    hint = modules["hint"].removeprefix("run ").split()
    done = subprocess.run([kmod_program("depmod"), *hint[1:]], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert _kmod_finds(root, release) and check_image(root)[1]["modules"]["result"] == "pass"


def test_the_stand_in_image_is_indexed_as_dkms_leaves_it(tmp_path):
    """tests/boot/nvidia_image.py runs the real depmod -b after adding the modules."""
    root = make_image(tmp_path)
    folder = root / f"lib/modules/{_kernel(root)}"
    assert (folder / "modules.dep.bin").is_file()
    assert "updates/dkms/nvidia.ko:" in (folder / "modules.dep").read_text()
