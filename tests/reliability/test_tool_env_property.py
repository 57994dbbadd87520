"""Issue 29 item 28 in the reliability suite: whatever of nvidia-ctk's variables the unit's
environment holds, with whatever values, none reaches nvidia-ctk, and the P02 boot (one H100)
ends ready with the spec nvidia-ctk generated (tests/test_tool_env.py's stand-in fails a call
that any variable outside the allowlist reaches)."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenarios.world import World
from test_tool_env import CTK_VARIABLES, install_standin, p02
from tier import examples

from reliability.test_properties import TEXT

NAMES = st.sampled_from(sorted(CTK_VARIABLES)) | st.sampled_from(
    ["NVIDIA_CTK_CDI_GENERATE_MODE", "NVIDIA_CTK_CDI_GENERATE_OUTPUT", "NVIDIA_CTK_CONFIG",
     "NVIDIA_CTK_CDI_GENERATE_CSV_FILES", "NVIDIA_CTK_CDI_GENERATE_LIBRARY_SEARCH_PATHS",
     "NVIDIA_CTK_CDI_GENERATE_VENDOR", "NVIDIA_CTK_CDI_GENERATE_CLASS", "NVIDIA_CTK_LOG_LEVEL",
     "NVIDIA_CTK_QUIET", "NVIDIA_VISIBLE_DEVICES", "HOME", "LANG", "TMPDIR"])
VALUES = st.sampled_from(["all", "true", "false", "uuid", "/", "/elsewhere", "csv", "json", ""]) \
    | TEXT.map(lambda t: t.replace("\0", ""))


@settings(max_examples=examples(6, 3), deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.dictionaries(NAMES, VALUES, min_size=1, max_size=8))
def test_no_nvidia_ctk_variable_of_the_unit_reaches_it_and_the_boot_ends_ready(monkeypatch, variables):
    with monkeypatch.context() as patched:
        for key, value in variables.items():
            patched.setenv(key, value)
        with World(dataclasses.replace(p02(), id="P02-ctk-env-fuzz")) as world:
            seen = install_standin(world)
            boot = world.run("boot")
            calls = open(seen).read().splitlines()

    assert boot.status and boot.status["state"] == "ready", (variables, boot.status)
    assert len(calls) >= 2 and all(line == "" for line in calls), (variables, calls)
