"""No argv the agent builds has a ``--flag=`` word with an empty value (issue 42).

An empty ``--output=`` made every boot fail on nvidia-ctk 1.18.2 and 1.19.1: one release of
urfave/cli takes it as empty, one refuses it (``flag needs an argument: --output=``), one takes
the next argv word as the value (../shared/nvidia-ctk/README.md, the real builds). A program's
parser decides what ``--x=`` means, so the agent never writes one: every builder below is walked
with the config's values empty or unset, a root of ``/`` and of a folder, and each word it gives
is held to ``--[a-z-]+=$`` never matching.
"""

from __future__ import annotations

import re
import time

import pytest

from podvm_gpu import nvidia_ctk
from podvm_gpu.boot import plan
from podvm_gpu.config.load import parse_config
from podvm_gpu.gpufacts import smi
from podvm_gpu.host import daemons
from podvm_gpu.host.fs import Root
from podvm_gpu.model import Status
from podvm_gpu.steps import nodes
from podvm_gpu.steps.context import BootContext
from podvm_gpu.steps.fabric import nvl5
from podvm_gpu.steps.fabric import step as fabric
from podvm_gpu.steps.modules.step import modprobe_argv

EMPTY_VALUE = re.compile(r"--[a-z-]+=$")

CONFIGS = {
    "default": "",
    "empty lists": "cdi: {disable_hooks: []}\nimex: {channels: []}\n",
    "imex and hooks": "imex: {channels: [0, 1]}\n"
                      "cdi: {disable_hooks: [disable-device-node-modification, all]}\n",
}


class Refusing:
    """A runner that runs nothing: a builder that would call a tool gets exit 1."""

    timeouts: dict = {}

    def __init__(self):
        self.calls: list[list[str]] = []

    def run(self, argv, check=True, **_):
        from podvm_gpu.errors import CommandError

        self.calls.append(list(argv))
        raise CommandError(argv, 1, "", "")

    def which(self, name):
        return f"/usr/bin/{name}"


def contexts(tmp_path):
    for name, text in CONFIGS.items():
        for root in (Root("/"), Root(str(tmp_path))):
            yield name, BootContext(root, parse_config(text, "config.yaml"), Refusing(),
                                    Status(), time.monotonic() + 60)


def empty_words(argvs) -> list[list[str]]:
    return [argv for argv in argvs if any(EMPTY_VALUE.fullmatch(str(w)) for w in argv)]


def test_the_pattern_finds_the_word_that_broke_1_18_and_1_19():
    assert empty_words([["nvidia-ctk", "cdi", "generate", "--output="]])
    assert not empty_words([["nvidia-ctk", "--output", ""], ["nvidia-ctk", "--mode=nvml"]])


def test_a_query_of_no_field_is_refused_not_written_as_an_empty_value():
    with pytest.raises(ValueError, match="no field"):
        smi.query_gpu_argv(())


def test_no_builder_gives_an_empty_flag_value(tmp_path):
    walked = []
    for name, ctx in contexts(tmp_path):
        argvs = [nvidia_ctk.generate_nvml_argv(ctx.root, ctx.config.cdi.disable_hooks),
                 nvidia_ctk.generate_imex_argv(ctx.root), nvidia_ctk.VERSION_ARGV,
                 [*nvidia_ctk.disable_hook_args(ctx.config.cdi.disable_hooks)],
                 *nodes.plan(ctx), fabric.fabricmanager_argv(ctx, write=False),
                 nvl5.nvlsm_argv(ctx, ""), modprobe_argv("nvidia", {}),
                 *[smi.fabric_argv(), smi.fabric_health_argv(),
                   smi.remap_argv(), smi.ecc_argv(), smi.reset_argv(), smi.action_argv(),
                   smi.vbios_argv(), smi.mig_mode_argv(), smi.mig_list_argv(),
                   smi.full_query_argv(), smi.conf_compute_argv()]]
        try:
            argvs += plan.plan(ctx)
        except Exception as err:  # a plan reads the root's facts; "/" here is no pod VM
            pytest.fail(f"{name}: boot --dry-run's plan failed: {err!r}")
        assert empty_words(argvs) == [], name
        walked += argvs
    generate = [a for a in walked if a[:3] == ["nvidia-ctk", "cdi", "generate"]]
    assert generate and not any(w.startswith("--output") for a in generate for w in a)
    assert any("--mode=imex" in a for a in generate)  # the IMEX generation was walked too


def test_the_daemons_units_have_no_empty_flag_value(monkeypatch):
    """``systemd-run --unit= --description= --property=...`` as :func:`daemons.start_daemon`
    builds it, for every daemon the agent starts."""
    monkeypatch.setattr(daemons, "under_systemd", lambda: True)
    monkeypatch.setattr(daemons, "unit_properties", lambda runner, unit: {})

    class Recording(Refusing):
        def run(self, argv, check=True, **_):
            self.calls.append(list(argv))

    for name in daemons.DAEMONS:
        runner = Recording()
        daemons.start_daemon(runner, [name], "/dev/null")
        started = [a for a in runner.calls if a[0] == "systemd-run"]
        assert started and empty_words(started) == [], name
