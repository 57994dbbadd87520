"""The harness's IMEX answer (imex_ctk.py) against nvidia-ctk 1.20.0's own captures, and its
``register_char_device`` effect."""

from __future__ import annotations

import json
import os
import stat

import pytest

from scenarios import effects as fx
from scenarios import imex_ctk
from scenarios.world import DATA

FIXTURES = [str(DATA / "fixtures/nvidia-ctk")]
ARGV = ["nvidia-ctk", "cdi", "generate", "--mode=imex", "--class=imex-channel"]


def channels(root, *ids):
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("mknod needs CAP_MKNOD (root); CI runs as root")
    folder = root / "dev/nvidia-caps-imex-channels"
    folder.mkdir(parents=True, exist_ok=True)
    for i in ids:
        os.mknod(folder / f"channel{i}", stat.S_IFCHR | 0o666, os.makedev(fx.IMEX_MAJOR, i))


@pytest.mark.parametrize("argv, fixture", [
    (ARGV, imex_ctk.WITH_CHANNELS),
    (ARGV[:4], "generate-imex-without-class.txt"),
])
def test_the_captured_world_gets_the_capture_byte_for_byte(tmp_path, argv, fixture):
    root = tmp_path / "root"
    channels(root, 0, 1)
    argv = [*argv, f"--driver-root={root}", f"--dev-root={root}", "--format=yaml", "--output="]
    rc, out, err = imex_ctk.answer(argv, str(tmp_path), str(root), FIXTURES)
    want_rc, want_err, want_out = imex_ctk.capture(FIXTURES, fixture)
    assert (rc, out, err) == (want_rc, want_out.replace("/ROOT", str(root)),
                              want_err.replace("/ROOT", str(root)))


def test_json_is_the_same_object_and_only_the_channels_present_are_devices(tmp_path):
    root = tmp_path / "root"
    channels(root, 3)
    argv = [*ARGV, f"--dev-root={root}", "--format=json", "--output="]
    rc, out, err = imex_ctk.answer(argv, str(tmp_path), str(root), FIXTURES)
    spec = json.loads(out)
    assert rc == 0 and "\n" not in out and spec["kind"] == "nvidia.com/imex-channel"
    assert [d["name"] for d in spec["devices"]] == ["3", "all"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia-caps-imex-channels/channel3",
         "hostPath": f"{root}/dev/nvidia-caps-imex-channels/channel3"}]
    assert err.count('msg="Selecting ') == 1


def test_no_channel_node_is_the_captured_failure(tmp_path):
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    rc, out, err = imex_ctk.answer([*ARGV, f"--dev-root={root}", "--output="], str(tmp_path),
                                   str(root), FIXTURES)
    assert rc == 1 and out == "" and "empty device edits" in err.splitlines()[-1]


def test_register_char_device_adds_the_imex_major_once(tmp_path):
    layout = fx.Layout(str(tmp_path))
    os.makedirs(layout.root)
    effect = {"register_char_device": "nvidia-caps-imex-channels", "major": 508}
    fx.validate_effect(effect)
    with pytest.raises(fx.EffectError):
        fx.validate_effect({"register_char_device": "nvidia-caps-imex-channels", "major": "508"})
    world = {"pci": [], "fixture_dirs": FIXTURES}
    state = fx.initial_state([])
    for _ in range(2):
        fx.Effects(layout, world, state, ["modprobe", "nvidia"]).apply(effect)
    assert fx.char_majors(layout.root) == {"nvidia-caps-imex-channels": 508}
    assert state["applied"] == ["register_char_device=nvidia-caps-imex-channels"]
