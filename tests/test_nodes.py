"""Making a GPU's device node (podvm_gpu.steps.nodes.make_node; contract section 3, step 5).

Real mknod under a temporary root: needs CAP_MKNOD (root), skipped without it.
"""

from __future__ import annotations

import os
import stat

import pytest

from podvm_gpu.errors import StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.steps.nodes import Node, make_node

NVIDIA_MAJOR = 195


@pytest.fixture
def dev(tmp_path):
    (tmp_path / "dev").mkdir()
    return tmp_path / "dev"


def test_a_regular_file_at_the_node_path_is_a_step_failure_naming_the_path(tmp_path, dev):
    (dev / "nvidia0").write_text("left by an image build\n")

    with pytest.raises(StepFailed) as err:
        make_node(Root(tmp_path), Node("/dev/nvidia0", NVIDIA_MAJOR, 0))

    assert "/dev/nvidia0" in str(err.value) and "not a character device" in str(err.value)
    assert (dev / "nvidia0").read_text() == "left by an image build\n"  # replaced nothing


def test_a_dangling_symlink_at_the_node_path_is_a_step_failure_naming_the_path(tmp_path, dev):
    os.symlink("/dev/elsewhere", dev / "nvidia1")

    with pytest.raises(StepFailed) as err:
        make_node(Root(tmp_path), Node("/dev/nvidia1", NVIDIA_MAJOR, 1))

    assert "/dev/nvidia1" in str(err.value) and "symlink" in str(err.value)
    assert os.readlink(dev / "nvidia1") == "/dev/elsewhere"
    assert not os.path.lexists(tmp_path / "dev" / "elsewhere")


@pytest.mark.parametrize("minor", [0, 7])
def test_a_fresh_node_is_a_char_device_with_the_numbers_and_mode_0666_whatever_the_umask(
        tmp_path, minor):
    old = os.umask(0o077)
    try:
        make_node(Root(tmp_path), Node(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    finally:
        os.umask(old)

    info = os.lstat(tmp_path / "dev" / f"nvidia{minor}")  # /dev made on the way
    assert stat.S_ISCHR(info.st_mode)
    assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (NVIDIA_MAJOR, minor)
    assert stat.S_IMODE(info.st_mode) == 0o666
