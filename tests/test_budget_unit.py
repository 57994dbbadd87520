"""budget_s against the installed unit's start time-out (issue 46 item 1, its `config` and
`check --image` part): ``budget_s: 1000`` passed both silently while systemd stops
podvm-gpu.service at its TimeoutStartSec (270 s as shipped), before the boot's budget ends and
before it writes its status."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from podvm_gpu import units
from podvm_gpu.check.image import Image, unit_row
from podvm_gpu.cli import main
from podvm_gpu.config.load import parse_config
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, seconds", [
    ("270", 270), ("5min", 300), ("4min 30s", 270), ("1h", 3600), ("500ms", 0.5),
    ("infinity", math.inf), ("0", math.inf), ("2 min", 120), ("1.5min", 90),
    ("soon", None), ("5 parsecs", None), ("", None)])
def test_systemd_time_spans_are_read_as_systemd_reads_them(text, seconds):
    assert units.timespan_s(text) == seconds


def image_root(tmp_path, budget_s=None, dropins=()):
    lib = tmp_path / "usr/lib/systemd/system"
    lib.mkdir(parents=True)
    shutil.copy(REPO / "systemd/podvm-gpu.service", lib)
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "podvm-gpu.service").symlink_to("/usr/lib/systemd/system/podvm-gpu.service")
    for name, text in dropins:
        folder = tmp_path / "etc/systemd/system/podvm-gpu.service.d"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    if budget_s is not None:
        config = tmp_path / "etc/podvm-gpu/config.yaml"
        config.parent.mkdir(parents=True)
        config.write_text(f"budget_s: {budget_s}\n")
    return tmp_path


def test_no_unit_or_no_setting_is_no_claim(tmp_path):
    assert units.start_timeout(Root(str(tmp_path)), units.AGENT_UNIT) == (None, "")
    root = image_root(tmp_path / "x", dropins=[("10.conf", "[Service]\nTimeoutStartSec=\n")])
    assert units.start_timeout(Root(str(root)), units.AGENT_UNIT) == (None, "")


def test_the_last_drop_in_wins_and_an_empty_value_resets(tmp_path):
    root = Root(str(image_root(tmp_path, dropins=[
        ("10-more.conf", "[Service]\nTimeoutStartSec=20min\n"),
        ("20-less.conf", "[Service]\nTimeoutSec=5min\n")])))
    assert units.start_timeout(root, units.AGENT_UNIT) == (
        300, "/etc/systemd/system/podvm-gpu.service.d/20-less.conf")
    (tmp_path / "etc/systemd/system/podvm-gpu.service.d/30-reset.conf").write_text(
        "[Service]\nTimeoutStartSec=\n")
    assert units.start_timeout(root, units.AGENT_UNIT) == (None, "")


def row_for(tmp_path, budget_s, dropins=()):
    root = Root(str(image_root(tmp_path, dropins=dropins)))
    config = parse_config(f"budget_s: {budget_s}\n", "c.yaml")
    return unit_row(Image(root, config, Runner(read_only=True)))


def test_check_image_warns_when_budget_s_runs_past_the_units_start_timeout(tmp_path):
    assert units.start_timeout(Root(str(image_root(tmp_path / "a"))), units.AGENT_UNIT)[0] == 270
    assert row_for(tmp_path / "b", 240).result == "pass"  # the shipped pair fits
    row = row_for(tmp_path / "c", 1000)
    assert row.result == "warn" and "budget_s 1000 s is above podvm-gpu.service's " \
        "TimeoutStartSec 270 s (/usr/lib/systemd/system/podvm-gpu.service)" in row.detail, row
    raised = row_for(tmp_path / "d", 1000,
                     [("50-long.conf", "[Service]\nTimeoutStartSec=infinity\n")])
    assert raised.result == "pass", raised


def test_config_warns_when_budget_s_runs_past_the_units_start_timeout(tmp_path, capsys):
    root = image_root(tmp_path, budget_s=1000)
    assert main(["config", "--root", str(root)]) == 0
    err = capsys.readouterr().err
    assert "warning: budget_s 1000 s is above podvm-gpu.service's TimeoutStartSec 270 s" in err
    (root / "etc/podvm-gpu/config.yaml").write_text("budget_s: 240\n")
    assert main(["config", "--root", str(root)]) == 0
    assert "TimeoutStartSec" not in capsys.readouterr().err
