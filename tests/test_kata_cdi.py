"""kata-agent's CDI wait as kata-agent reads it (podvm_gpu.kata) and the ``kata-agent-cdi`` check
row built on it, for a running VM and for ``check --image``.

The rules are kata-agent's own (config.rs, main.rs, device/mod.rs; see podvm_gpu/kata.py): with
``--config FILE`` only FILE counts, else the kernel command line; a config file's
``cdi_timeout`` is a serde Duration. The accepted spellings of that Duration are the ones real
serde + toml printed ``Ok`` for (tests/data/kata-agent/duration_probe.out).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from podvm_gpu import kata, units
from podvm_gpu.check import FAIL, PASS, SKIP, WARN
from podvm_gpu.check.image import image_checks
from podvm_gpu.check.units import kata_cdi_check
from podvm_gpu.config.model import Config
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner

PROBE = Path(__file__).parent / "data" / "kata-agent" / "duration_probe.out"
ETC = "etc/systemd/system"

# peer pods start kata-agent with its config file (cloud-api-adaptor's podvm/files unit)
PEER_PODS_UNIT = ("[Unit]\nDescription=Kata Containers agent\n\n[Service]\n"
                  "ExecStart=/usr/local/bin/kata-agent --config /etc/agent-config.toml\n")
PLAIN_UNIT = "[Unit]\nDescription=Kata Containers agent\n\n[Service]\nExecStart=/usr/local/bin/kata-agent\n"


class Tree:
    def __init__(self, path: Path):
        self.path, self.root = path, Root(path)

    def file(self, rel: str, text: str) -> "Tree":
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return self

    def kata(self, unit: str = PEER_PODS_UNIT, config: str | None = None) -> "Tree":
        self.file(f"{ETC}/kata-agent.service", unit)
        if config is not None:
            self.file("etc/agent-config.toml", config)
        return self


@pytest.fixture
def tree(tmp_path) -> Tree:
    return Tree(tmp_path)


def row(tree: Tree, cmdline: str | None = "", version: str | None = None):
    return kata_cdi_check(tree.root, units.exec_start(tree.root, "kata-agent.service"), cmdline,
                          version)


# --- where kata-agent reads cdi_timeout --------------------------------------------------------

def test_with_config_the_kernel_command_line_is_not_read(tree):
    tree.kata(config='server_addr = "unix:///run/kata-containers/agent.sock"\n'
                     "cdi_timeout = { secs = 600, nanos = 0 }\n")

    wait = kata.cdi_wait(tree.root, units.exec_start(tree.root, "kata-agent.service"),
                         "console=ttyS0 agent.cdi_timeout=60")

    assert wait.seconds == 600
    assert "/etc/agent-config.toml" in wait.source


def test_with_config_and_no_cdi_timeout_the_default_applies(tree):
    tree.kata(config='server_addr = "unix:///run/kata-containers/agent.sock"\n')

    wait = kata.cdi_wait(tree.root, units.exec_start(tree.root, "kata-agent.service"),
                         "agent.cdi_timeout=60")

    assert wait.seconds == kata.DEFAULT_CDI_TIMEOUT_S == 100
    assert "sets none" in wait.source


def test_without_config_the_kernel_command_line_sets_it_last_one_wins_and_zero_keeps_default(tree):
    tree.kata(PLAIN_UNIT, config="cdi_timeout = { secs = 600, nanos = 0 }\n")
    argv = units.exec_start(tree.root, "kata-agent.service")

    assert kata.cdi_wait(tree.root, argv, "ro agent.cdi_timeout=30 agent.cdi_timeout=45").seconds == 45
    assert kata.cdi_wait(tree.root, argv, "ro agent.cdi_timeout=0").seconds == 100
    assert kata.cdi_wait(tree.root, argv, "ro xagent.cdi_timeout=5").seconds == 100
    assert kata.cdi_wait(tree.root, argv, "").seconds == 100  # the file is not read at all


def test_agent_config_file_on_the_kernel_command_line_switches_to_that_file(tree):
    tree.kata(PLAIN_UNIT).file("run/peerpod/agent.toml", "cdi_timeout = [20, 0]\n")

    wait = kata.cdi_wait(tree.root, ["/usr/local/bin/kata-agent"],
                         "agent.cdi_timeout=300 agent.config_file=/run/peerpod/agent.toml")

    assert wait.seconds == 20
    assert "agent.config_file=" in wait.source


def test_a_non_number_on_the_kernel_command_line_stops_kata_agent(tree):
    tree.kata(PLAIN_UNIT)

    check = row(tree, cmdline="agent.cdi_timeout=100s")

    assert check.result == FAIL
    assert "will not start" in check.detail and "100s" in check.detail


def test_config_equals_form_is_not_kata_agents_config_argument():
    # kata-agent looks for the exact tokens --config / -c (config.rs); clap's --config=FILE
    # form does not reach that lookup, so the kernel command line is read
    assert kata.config_file_argument(["kata-agent", "--config=/etc/a.toml"]) is None
    assert kata.config_file_argument(["kata-agent", "-c", "/etc/a.toml"]) == "/etc/a.toml"
    assert kata.config_file_argument(["kata-agent", "--config"]) is None


def test_exec_start_follows_a_drop_in_that_resets_it(tree):
    tree.kata(PLAIN_UNIT).file(f"{ETC}/kata-agent.service.d/20-config.conf",
                               "[Service]\nExecStart=\nExecStart=-/usr/local/bin/kata-agent "
                               "--config '/etc/agent config.toml'\n")

    assert units.exec_start(tree.root, "kata-agent.service") == [
        "/usr/local/bin/kata-agent", "--config", "/etc/agent config.toml"]


# --- the Duration kata-agent's config parser wants ---------------------------------------------

def probe_verdicts() -> list[tuple[str, bool]]:
    """(TOML line, accepted) for each line with a cdi_timeout that real serde + toml was given
    (the probe's control line sets another key only)."""
    out = []
    for line in PROBE.read_text().splitlines():
        text, verdict = line.split(" -> ", 1)
        if text.startswith("cdi_timeout"):
            out.append((text.strip(), verdict.startswith("Ok")))
    return out


@pytest.mark.parametrize("line,accepted", probe_verdicts())
def test_durations_accepted_exactly_as_real_serde_accepts_them(line, accepted):
    import tomllib

    assert (kata.duration_s(tomllib.loads(line)["cdi_timeout"]) is not None) == accepted


def test_probe_covers_the_integer_form_and_the_table_form():
    verdicts = dict(probe_verdicts())
    assert verdicts["cdi_timeout = 100"] is False
    assert verdicts["cdi_timeout = { secs = 100, nanos = 0 }"] is True


def test_integer_cdi_timeout_that_earlier_tests_and_users_write_stops_the_real_kata_agent(tree):
    # the first batch's tests took "cdi_timeout = 100" as valid; kata-agent's serde refuses it
    tree.kata(config="cdi_timeout = 100\n")

    check = row(tree)

    assert check.result == FAIL
    assert "not a Duration" in check.detail
    assert "secs = 100, nanos = 0" in check.hint


def test_unreadable_or_broken_config_file_stops_kata_agent(tree):
    tree.kata()
    assert row(tree).result == FAIL  # --config names a file that is not there
    tree.file("etc/agent-config.toml", "cdi_timeout = [not toml\n")
    check = row(tree)
    assert check.result == FAIL and "not TOML" in check.detail


# --- the check row -----------------------------------------------------------------------------

def test_no_kata_agent_unit_skips(tree):
    assert row(tree).result == SKIP


def test_kata_agent_from_3_32_fails_at_once(tree):
    tree.kata(config="cdi_timeout = { secs = 100, nanos = 0 }\n")

    check = row(tree, version="kata-agent version 3.32.0 (api version: 0.0.1, commit version: "
                              "abc, type: rust, extra-features: [])\n")

    assert check.result == PASS
    assert "3.32.0" in check.detail and "at once" in check.detail


def test_older_kata_agent_waits_cdi_timeout_and_says_how_long_and_where_from(tree):
    tree.kata(config="cdi_timeout = { secs = 45, nanos = 0 }\n")

    check = row(tree, version="kata-agent version 3.31.2 (api version: 0.0.1, ...)\n")

    assert check.result == WARN
    assert "3.31.2" in check.detail and "45 s" in check.detail
    assert "/etc/agent-config.toml" in check.detail
    assert "3.32.0" in check.hint


def test_unknown_version_states_both_behaviours(tree):
    tree.kata(config="")

    check = row(tree, version=None)

    assert check.result == PASS
    assert "100 s" in check.detail and "3.32.0" in check.detail


def test_check_runs_the_vms_kata_agent_for_its_version(tmp_path):
    from podvm_gpu.check.units import kata_agent_version

    agent = tmp_path / "kata-agent"
    agent.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'kata-agent version 3.33.1 "
                     "(api version: 0.0.1)'\n")
    agent.chmod(0o755)

    assert kata.version(kata_agent_version(str(agent))) == (3, 33, 1)
    assert kata_agent_version(str(tmp_path / "absent")) is None


def test_image_check_has_the_row_and_reads_no_kernel_command_line(tree):
    tree.kata(PLAIN_UNIT).file("proc/cmdline", "agent.cdi_timeout=5\n")

    rows = {c.name: c for c in image_checks(tree.root, Config(), Runner(read_only=True))}

    assert rows["kata-agent-cdi"].result == PASS
    assert "kernel command line" in rows["kata-agent-cdi"].detail
    assert not re.search(r"\b5 s\b", rows["kata-agent-cdi"].detail)


def test_image_check_fails_the_integer_form_in_the_images_config(tree):
    tree.kata(config="cdi_timeout = 100\n")

    rows = {c.name: c for c in image_checks(tree.root, Config(), Runner(read_only=True))}

    assert rows["kata-agent-cdi"].result == FAIL


@pytest.mark.parametrize("value", ["{ secs = 18446744073709551616, nanos = 0 }",
                                   "{ secs = 9223372036854775808, nanos = 0 }",
                                   "{ secs = 1, nanos = 4294967296 }"])
def test_a_duration_kata_agent_cannot_hold_is_not_one(value):
    """Found by a newcomer: 2^64 seconds passed. TOML integers are i64 (the toml crate refuses
    larger ones) and serde's nanos field is a u32, so kata-agent refuses such a file."""
    import tomllib

    from podvm_gpu.kata import duration_s

    assert duration_s(tomllib.loads(f"cdi_timeout = {value}")["cdi_timeout"]) is None
    assert duration_s(tomllib.loads("cdi_timeout = { secs = 9223372036854775807, nanos = 0 }")
                      ["cdi_timeout"]) == float(2**63 - 1)


# --- issue 29 item 24: the argument kata-agent does not read, and an unreadable unit -------------

def test_config_equals_form_in_the_unit_warns_that_kata_agent_does_not_read_it(tree):
    # the row passed on defaults for this unit: kata-agent reads only --config FILE / -c FILE
    tree.kata("[Service]\nExecStart=-/usr/bin/kata-agent --config=/etc/agent-config.toml\n",
              config="cdi_timeout = { secs = 5, nanos = 0 }\n")

    check = row(tree, cmdline="", version="kata-agent version 3.32.0 (api version: 0.0.1)")

    assert check.result == WARN, check
    assert "does not read --config=/etc/agent-config.toml" in check.detail, check.detail
    assert "cdi_timeout 100 s" in check.detail  # the file's 5 s is not what kata-agent waits
    assert check.hint.startswith("write --config /etc/agent-config.toml (a space, not =)")
    # issue 35 item 15: where the settings come from was said twice
    assert check.detail.count("the kernel command line sets none") == 1, check.detail


@pytest.mark.parametrize("written, hint", [
    ("30", "write it as cdi_timeout = { secs = 30, nanos = 0 }"),
    ("0", "write it as cdi_timeout = { secs = 0, nanos = 0 }"),
    ('"30s"', "write it as cdi_timeout = { secs = N, nanos = 0 } (N whole seconds; the default is 100)"),
    ("-5", "write it as cdi_timeout = { secs = N, nanos = 0 } (N whole seconds; the default is 100)"),
])
def test_the_duration_hint_keeps_the_users_own_seconds(tree, written, hint):
    """Issue 35 item 15: ``cdi_timeout = 30`` was told to write ``{ secs = 100, nanos = 0 }``."""
    tree.kata(config=f"cdi_timeout = {written}\n")
    check = row(tree)
    assert check.result == FAIL and "not a Duration" in check.detail
    assert check.hint == hint


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_an_unreadable_kata_agent_unit_is_reported_by_name(tree, kind):
    unit = tree.path / ETC / "kata-agent.service"
    unit.parent.mkdir(parents=True)
    os.mkfifo(unit) if kind == "fifo" else unit.mkdir()

    check = row(tree)

    assert check.result == WARN, check
    assert f"not read here: /{ETC}/kata-agent.service" in check.detail, check.detail
    assert "make each a regular file" in check.hint


def test_a_fifo_drop_in_of_kata_agent_is_named_by_both_kata_rows(tree):
    tree.kata(PLAIN_UNIT)
    os.mkfifo(_mkdir(tree, "kata-agent.service.d") / "50.conf")
    from podvm_gpu.check.units import kata_ordering_check

    cdi, ordering = row(tree), kata_ordering_check(tree.root)

    fifo = f"/{ETC}/kata-agent.service.d/50.conf is a FIFO, not a regular file"
    assert cdi.result == WARN and fifo in cdi.detail, cdi
    assert ordering.result == FAIL and fifo in ordering.detail, ordering


def _mkdir(tree: Tree, name: str) -> Path:
    folder = tree.path / ETC / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
