"""Issue 29 item 28: nvidia-ctk runs with an environment built from an allowlist.

nvidia-ctk (urfave/cli) fills every flag the agent does not pass from an environment variable:
with ``NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS=all`` in the unit's environment the real 1.20.0
wrote a spec without hooks, which the agent installed as ready; ``ROOT``, ``DRIVER_ROOT``,
``NVIDIA_DRIVER_ROOT``, ``DEV_ROOT``, ``NVIDIA_DEV_ROOT``, ``DRY_RUN`` and ``NVIDIA_CTK_*`` redirect
or disable the node command and the generation. The tests give the product every such variable
and put a stand-in before the scenario's fake nvidia-ctk that fails when one reaches it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys

import pytest
from scenarios.world import DATA, World, load_case

from podvm_gpu.host.proc import Runner, tool_env
from podvm_gpu.nvidia_ctk import TOOL_ENV_ALLOWED

# What nvidia-ctk 1.20.0 reads (issue 29 item 28), and the config file it would take from
# XDG_CONFIG_HOME.
CTK_VARIABLES = {
    "NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS": "all",
    "NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES": "uuid",
    "NVIDIA_CTK_CDI_GENERATE_NO_ALL_DEVICE": "true",
    "NVIDIA_CTK_DRIVER_ROOT": "/elsewhere", "NVIDIA_CTK_DEV_ROOT": "/elsewhere",
    "NVIDIA_CTK_DEBUG": "true", "ROOT": "/elsewhere", "DRIVER_ROOT": "/elsewhere",
    "NVIDIA_DRIVER_ROOT": "/elsewhere", "DEV_ROOT": "/elsewhere", "NVIDIA_DEV_ROOT": "/elsewhere",
    "DRY_RUN": "true", "XDG_CONFIG_HOME": "/elsewhere",
}

# The stand-in: fails, naming them, when any variable outside the allowlist reaches it; else it
# runs the scenario's fake nvidia-ctk (same file name, so the fake knows which tool it is).
STANDIN = """#!{python} -IS
import os, sys
allowed = {allowed!r}
extra = sorted(k for k in os.environ if k not in allowed)
with open({seen!r}, "a") as f:
    f.write(" ".join(extra) + "\\n")
if extra:
    print("stand-in nvidia-ctk: reached by " + ", ".join(extra), file=sys.stderr)
    sys.exit(1)
os.execv({fake!r}, [{fake!r}, *sys.argv[1:]])
"""


def test_tool_env_keeps_only_the_allowlist_for_nvidia_ctk_and_everything_for_the_others():
    env = {**CTK_VARIABLES, "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "LANG": "de_DE",
           "HOME": "/root", "LC_ALL": "C"}

    assert tool_env("nvidia-ctk", env) == {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib",
                                          "LC_ALL": "C"}
    assert tool_env("nvidia-smi", env) is env
    assert set(TOOL_ENV_ALLOWED["nvidia-ctk"]) == {"PATH", "LD_LIBRARY_PATH", "LD_PRELOAD"}


def test_the_runner_gives_nvidia_ctk_the_reduced_environment(tmp_path):
    tool = tmp_path / "nvidia-ctk"
    tool.write_text(f"#!{sys.executable} -IS\nimport json, os\nprint(json.dumps(dict(os.environ)))\n")
    tool.chmod(0o755)
    runner = Runner({"nvidia-ctk": str(tool)}, env={**CTK_VARIABLES, "PATH": "/usr/bin"})

    seen = json.loads(runner.run(["nvidia-ctk", "--version"]).stdout)

    seen.pop("LC_CTYPE", None)  # the interpreter's own locale coercion (PEP 538), not ours
    assert seen == {"PATH": "/usr/bin", "LC_ALL": "C"}


def p02() -> object:
    return load_case(DATA / "cases/P02-one-h100-pcie-ready.yaml")


def install_standin(world: World) -> str:
    """Put the stand-in where the product finds nvidia-ctk; return the file it logs to."""
    bin_dir = world.layout.bin
    hidden = os.path.join(world.layout.dir, "fake-bin")
    os.makedirs(hidden)
    fake = os.path.join(hidden, "nvidia-ctk")
    os.rename(os.path.join(bin_dir, "nvidia-ctk"), fake)
    seen = os.path.join(world.layout.dir, "nvidia-ctk-env.log")
    script = os.path.join(bin_dir, "nvidia-ctk")
    with open(script, "w") as f:
        f.write(STANDIN.format(python=sys.executable, seen=seen, fake=fake,
                               allowed={*TOOL_ENV_ALLOWED["nvidia-ctk"], "LC_ALL", "LC_CTYPE"}))
    os.chmod(script, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return seen


@pytest.mark.parametrize("variables", [CTK_VARIABLES], ids=["every-variable-nvidia-ctk-reads"])
def test_a_boot_with_nvidia_ctk_s_variables_in_its_environment_ends_ready(monkeypatch, variables):
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    with World(dataclasses.replace(p02(), id="P02-ctk-env")) as world:
        seen = install_standin(world)
        boot = world.run("boot")
        calls = open(seen).read().splitlines()

    assert boot.status and boot.status["state"] == "ready", (boot.status, boot.stderr[-2000:])
    assert len(calls) >= 2 and all(line == "" for line in calls), calls  # nodes and generate
