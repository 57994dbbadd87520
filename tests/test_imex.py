"""IMEX channels (podvm_gpu/steps/cdi/imex.py, issue 28): the config key, the channel nodes made
with the major of /proc/devices, the spec of nvidia-ctk 1.20.0 (real captures in
tests/data/fixtures/nvidia-ctk/generate-imex-*.txt) accepted only as kind nvidia.com/imex-channel
with exactly the channels asked, its install and removal, and the check rows. Boot-level:
scenarios S108-S112."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from podvm_gpu import nvidia_ctk
from podvm_gpu.cdi import IMEX_SPEC_PATH
from podvm_gpu.cdi.unavailable import remove_spec, write_unavailable_spec
from podvm_gpu.config.load import parse_config
from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Completed
from podvm_gpu.model import Status
from podvm_gpu.row import FAIL, PASS, SKIP
from podvm_gpu.steps.cdi import imex
from podvm_gpu.steps.context import BootContext

FIXTURES = Path(__file__).parent / "data/fixtures/nvidia-ctk"
IMEX_MAJOR = 509


def capture(name: str) -> tuple[int, str, str]:
    """(exit, stderr, stdout) of a capture with ``# exit``, ``# stderr:``, ``# stdout:`` lines."""
    text = (FIXTURES / name).read_text()
    rc = int(text.split("# exit: ", 1)[1].split("\n", 1)[0])
    err, out = text.split("# stderr:\n", 1)[1].split("# stdout:\n", 1)
    return rc, err, out


def need_mknod():
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("mknod needs CAP_MKNOD (root); CI runs as root")


class Ctk:
    """nvidia-ctk answered by a real capture, ``/ROOT`` made the test's root."""

    def __init__(self, root: Path, name: str = "generate-imex-2-channels.txt", error=None):
        self.root, self.name, self.error, self.ran = root, name, error, []

    def run(self, argv, check=True, **_):
        self.ran.append(argv)
        if self.error:
            raise self.error
        rc, err, out = capture(self.name)
        out, err = out.replace("/ROOT", str(self.root)), err.replace("/ROOT", str(self.root))
        if rc:
            raise CommandError(argv, rc, out, err)
        return Completed(argv, rc, out, err, 0.0)


def world(tmp_path, channels="[0, 1]", major=True, runner=None) -> BootContext:
    (tmp_path / "proc").mkdir(exist_ok=True)
    lines = ["Character devices:", "195 nvidia", "510 nvidia-uvm"]
    if major:
        lines.append(f"{IMEX_MAJOR} {imex.IMEX_MAJOR_NAME}")
    (tmp_path / "proc/devices").write_text("\n".join(lines) + "\n\nBlock devices:\n  8 sd\n")
    config = parse_config(f"imex: {{channels: {channels}}}\n", "config.yaml")
    return BootContext(Root(str(tmp_path)), config, runner or Ctk(tmp_path), Status(),
                       time.monotonic() + 60)


# --- config ---------------------------------------------------------------------------------

def test_imex_is_off_by_default_and_channels_are_sorted_ids():
    assert parse_config("", "c.yaml").imex.channels == ()
    assert parse_config("imex: {channels: [3, 0]}\n", "c.yaml").imex.channels == (0, 3)


@pytest.mark.parametrize("value, words", [
    ("[-1]", "c.yaml: imex.channels.0: must be from 0 to 2047, not -1"),
    ("[2048]", "must be from 0 to 2047, not 2048"),
    ("[true]", "must be a whole number, not a boolean"),
    ("['0']", "must be a whole number, not a string"),
    ("[1.0]", "must be a whole number, not 1.0"),
    ("0", "must be a list of channel ids, not an integer"),
    ("[0, 0]", "channel 0 is listed twice"),
    (str(list(range(65))), "at most 64 channels, not 65"),
])
def test_bad_channel_lists_are_refused_by_key(value, words):
    from podvm_gpu.config.load import ConfigError

    with pytest.raises(ConfigError, ) as err:
        parse_config(f"imex: {{channels: {value}}}\n", "c.yaml")
    assert words in str(err.value)


# --- nodes ----------------------------------------------------------------------------------

def test_the_channel_nodes_get_the_major_of_proc_devices_minor_the_id_and_mode_0666(tmp_path):
    need_mknod()
    ctx = world(tmp_path, "[0, 5]")
    old = os.umask(0o077)
    try:
        imex.make_channels(ctx, ctx.config.imex.channels)
    finally:
        os.umask(old)
    for channel in (0, 5):
        info = os.lstat(tmp_path / f"dev/nvidia-caps-imex-channels/channel{channel}")
        assert stat.S_ISCHR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o666
        assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (IMEX_MAJOR, channel)
    assert stat.S_IMODE(os.stat(tmp_path / "dev/nvidia-caps-imex-channels").st_mode) == 0o755


def test_no_imex_major_fails_naming_it_and_makes_nothing(tmp_path):
    ctx = world(tmp_path, major=False)
    with pytest.raises(StepFailed, match="imex: no 'nvidia-caps-imex-channels' major in "
                                         "/proc/devices: the loaded driver has no IMEX"):
        imex.generate(ctx)
    assert not (tmp_path / "dev").exists() and ctx.runner.ran == []


def test_something_else_at_a_channel_path_is_named_not_replaced(tmp_path):
    (tmp_path / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
    (tmp_path / "dev/nvidia-caps-imex-channels/channel0").write_text("")
    with pytest.raises(StepFailed, match="imex: /dev/nvidia-caps-imex-channels/channel0 exists "
                                         "but is not a character device"):
        imex.generate(world(tmp_path, "[0]"))


# --- the spec -------------------------------------------------------------------------------

def test_the_real_imex_spec_of_two_channels_is_accepted_and_the_argv_has_the_class(tmp_path):
    need_mknod()
    ctx = world(tmp_path)
    got = imex.generate(ctx)
    assert ctx.runner.ran == [["nvidia-ctk", "cdi", "generate", "--mode=imex",
                               "--class=imex-channel", "--format=json",
                               f"--driver-root={tmp_path}", f"--dev-root={tmp_path}"]]
    assert got.spec.kind == "nvidia.com/imex-channel" and got.channels == (0, 1)
    assert got.spec.device_names() == ["0", "1", "all"]


def test_the_real_spec_without_the_class_is_refused_as_kind_nvidia_com_gpu(tmp_path):
    need_mknod()
    ctx = world(tmp_path, runner=Ctk(tmp_path, "generate-imex-without-class.txt"))
    with pytest.raises(StepFailed, match=r"imex: the generated spec is refused: kind "
                                         r"nvidia\.com/gpu, not nvidia\.com/imex-channel"):
        imex.generate(ctx)


def test_a_spec_with_a_channel_not_asked_is_refused(tmp_path):
    need_mknod()
    ctx = world(tmp_path, "[0]")  # the capture holds channels 0 and 1
    with pytest.raises(StepFailed, match="devices 0, 1, all, expected exactly 0, all"):
        imex.generate(ctx)


def test_nvidia_ctk_that_finds_no_channel_fails_with_its_last_error(tmp_path):
    need_mknod()
    rc, err, out = capture("generate-imex-no-channels.txt")
    error = CommandError(["nvidia-ctk"], rc, out, err)
    with pytest.raises(StepFailed, match=r"imex: nvidia-ctk cdi generate --mode=imex failed "
                                         r"\(exit 1\): .*empty device edits"):
        imex.generate(world(tmp_path, runner=Ctk(tmp_path, error=error)))


def test_a_timed_out_generation_says_so(tmp_path):
    need_mknod()
    error = CommandError(["nvidia-ctk"], None, timed_out=True, timeout_s=60.0)
    with pytest.raises(StepFailed, match="imex: nvidia-ctk cdi generate --mode=imex timed out "
                                         "after 60 s"):
        imex.generate(world(tmp_path, runner=Ctk(tmp_path, error=error)))


def test_imex_off_runs_nothing_and_install_removes_an_earlier_spec(tmp_path):
    ctx = world(tmp_path, "[]")
    assert imex.generate(ctx) is None and ctx.runner.ran == [] and imex.plan(ctx) == []
    spec = tmp_path / IMEX_SPEC_PATH.lstrip("/")
    spec.parent.mkdir(parents=True)
    spec.write_text("stale")
    assert "removed (imex is off)" in imex.install(ctx, None)
    assert not spec.exists() and imex.install(ctx, None) == ""


def test_install_is_atomic_0644_and_the_unavailable_spec_removes_it(tmp_path):
    need_mknod()
    ctx = world(tmp_path)
    said = imex.install(ctx, imex.generate(ctx))
    spec = tmp_path / IMEX_SPEC_PATH.lstrip("/")
    assert said == f"{IMEX_SPEC_PATH}: 2 IMEX channel(s) (0, 1)"
    assert stat.S_IMODE(spec.stat().st_mode) == 0o644
    assert "kind: nvidia.com/imex-channel" in spec.read_text()
    assert [p.name for p in spec.parent.iterdir()] == ["nvidia-imex.yaml"]  # no temporary left
    write_unavailable_spec(Root(str(tmp_path)), "failed", "cdi: x")
    assert not spec.exists()
    spec.write_text("again")
    remove_spec(Root(str(tmp_path)))  # unavailable_spec: false
    assert not spec.exists()


# --- check rows -----------------------------------------------------------------------------

class Facts:
    def __init__(self, ctx, gpus=("0000:18:00.0",), reached=True):
        self.root, self.config, self.gpus, self._reached = ctx.root, ctx.config, gpus, reached

    def not_reached(self, step):
        from types import SimpleNamespace

        return None if self._reached else SimpleNamespace(detail="not reached: cdi")


def test_the_rows_skip_when_imex_is_off(tmp_path):
    facts = Facts(world(tmp_path, "[]"))
    for row in (imex.imex_channels_row, imex.imex_spec_row):
        assert row(facts).result == SKIP and "imex is off" in row(facts).detail


def test_the_rows_fail_naming_the_missing_major_node_and_spec(tmp_path):
    facts = Facts(world(tmp_path, "[0]", major=False))
    assert imex.imex_channels_row(facts).result == FAIL
    assert "no 'nvidia-caps-imex-channels' major" in imex.imex_channels_row(facts).detail
    facts = Facts(world(tmp_path, "[0]"))
    row = imex.imex_channels_row(facts)
    assert row.result == FAIL and "/dev/nvidia-caps-imex-channels/channel0 is missing" in row.detail
    row = imex.imex_spec_row(facts)
    assert row.result == FAIL and row.detail == f"{IMEX_SPEC_PATH} is missing"


def test_the_rows_pass_after_an_install_and_fail_on_a_gpu_kind_spec(tmp_path):
    need_mknod()
    ctx = world(tmp_path)
    imex.install(ctx, imex.generate(ctx))
    facts = Facts(ctx)
    assert imex.imex_channels_row(facts).result == PASS
    row = imex.imex_spec_row(facts)
    assert row.result == PASS and "devices 0, 1, all" in row.detail
    text = capture("generate-imex-without-class.txt")[2].replace("/ROOT", str(tmp_path))
    (tmp_path / IMEX_SPEC_PATH.lstrip("/")).write_text(text)
    row = imex.imex_spec_row(facts)
    assert row.result == FAIL and "kind nvidia.com/gpu, not nvidia.com/imex-channel" in row.detail


def test_dry_run_plans_the_imex_generation_after_the_gpus_only_when_on(tmp_path):
    from podvm_gpu.steps.cdi import step

    on = step.plan(world(tmp_path, "[0]"))
    assert on[0] == ["nvidia-ctk", "--version"]  # issue 36: read before any generation
    assert on[2] == nvidia_ctk.generate_imex_argv(world(tmp_path, "[0]").root)
    assert on[1][:4] == ["nvidia-ctk", "cdi", "generate", "--mode=nvml"]
    assert not any("--mode=imex" in argv for argv in step.plan(world(tmp_path, "[]")))
