"""An optional module (``modules.optional``, nvidia_modeset by default) that cannot be loaded is
a warning that names it as optional, its cause and both fixes (issue 35 item 11: a real H200 VM
without modprobe said "modules: optional cannot load nvidia_modeset: modprobe: not found on
PATH")."""

from __future__ import annotations

import time

from podvm_gpu.config.model import Config
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner
from podvm_gpu.model import Status
from podvm_gpu.steps.context import BootContext
from podvm_gpu.steps.modules import step as modules


def context(tmp_path) -> BootContext:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    # the required modules are loaded; nvidia_modeset is not
    (root / "proc/modules").write_text("nvidia_uvm 1 0 - Live 0x0\nnvidia 1 1 nvidia_uvm, Live 0x0\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    runner = Runner(env={"PATH": str(empty)}, deadline=time.monotonic() + 30)
    return BootContext(Root(str(root)), Config(), runner, Status(), time.monotonic() + 30)


def test_an_optional_module_without_modprobe_is_a_warning_that_names_both_fixes(tmp_path):
    ctx = context(tmp_path)
    modules.run(ctx)
    assert ctx.status.warnings == [
        f"modules: optional module nvidia_modeset not loaded (cannot run modprobe nvidia_modeset: "
        f"modprobe: not found on PATH (PATH={tmp_path / 'bin'}): install kmod, or name modprobe in "
        "tools.modprobe); if it is not needed, take nvidia_modeset out of modules.optional"]


def test_a_configured_modprobe_that_is_missing_is_named_without_the_path(tmp_path):
    ctx = context(tmp_path)
    ctx.runner.tool_paths["modprobe"] = "/opt/kmod/modprobe"  # as tools.modprobe makes it
    modules.run(ctx)
    warning, = ctx.status.warnings
    assert "cannot run modprobe nvidia_modeset: modprobe: /opt/kmod/modprobe (set in the config) is " \
        "not an executable: install kmod" in warning, warning
    assert "PATH=" not in warning
