"""``check --image``'s ``toolkit`` row (podvm_gpu/steps/cdi/toolkit_image.py, issue 36): the
versions of nvidia-ctk and nvidia-cdi-hook from dpkg's records, as Debian packages of
nvidia-container-toolkit lay them out (nvidia-container-toolkit-base carries both binaries)."""

from __future__ import annotations

import os

import pytest

from podvm_gpu.config.load import parse_config
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner
from podvm_gpu.row import PASS, SKIP, WARN
from podvm_gpu.steps.cdi import toolkit_image


class FakeImage:
    def __init__(self, root, config=""):
        self.root, self.config = Root(str(root)), parse_config(config, "c.yaml")
        self.runner = Runner(read_only=True)

    def tool(self, name):
        path = f"/usr/bin/{name}"
        real = self.root.resolve(path)
        return path if os.path.isfile(real) and os.access(real, os.X_OK) else None


def stanza(package: str, version: str, status="install ok installed") -> str:
    return (f"Package: {package}\nStatus: {status}\nPriority: optional\nArchitecture: amd64\n"
            f"Version: {version}\nDescription: NVIDIA Container toolkit\n multi-line text: here\n")


def image(tmp_path, packages: dict[str, tuple[str, list[str]]], binaries=("nvidia-ctk",
          "nvidia-cdi-hook"), extra_status=""):
    """An image root: the binaries in /usr/bin, dpkg's lists and status for ``packages``
    (name -> (version, files))."""
    (tmp_path / "usr/bin").mkdir(parents=True)
    for binary in binaries:
        (tmp_path / "usr/bin" / binary).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / "usr/bin" / binary).chmod(0o755)
    info = tmp_path / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    status = [stanza("libc6", "2.36-9+deb12u10")]
    for name, (version, files) in packages.items():
        (info / f"{name}.list").write_text("/.\n/usr\n/usr/bin\n" + "".join(f + "\n" for f in files))
        status.append(stanza(name, version))
    (tmp_path / "var/lib/dpkg/status").write_text("\n".join(status) + extra_status)
    return tmp_path


BASE = ["/usr/bin/nvidia-ctk", "/usr/bin/nvidia-cdi-hook"]


def test_one_package_of_both_binaries_passes_naming_the_version(tmp_path):
    root = image(tmp_path, {"nvidia-container-toolkit-base": ("1.20.0-1", BASE)})
    row = toolkit_image.image_row(FakeImage(root))
    assert row.result == PASS, row
    assert "nvidia-ctk 1.20.0 at /usr/bin/nvidia-ctk (package nvidia-container-toolkit-base " \
           "1.20.0-1)" in row.detail and "nvidia-cdi-hook 1.20.0" in row.detail


def test_binaries_of_two_toolkit_versions_warn(tmp_path):
    root = image(tmp_path, {"nvidia-container-toolkit-base": ("1.20.0-1", BASE[:1]),
                            "nvidia-cdi-hook-old": ("1.17.8-1", BASE[1:])})
    row = toolkit_image.image_row(FakeImage(root))
    assert row.result == WARN and "different toolkit versions" in row.detail, row
    assert "nvidia-cdi-hook 1.17.8" in row.detail


@pytest.mark.parametrize("config", ["imex: {channels: [0]}\n",
                                    "cdi: {disable_hooks: [all]}\n"])
def test_1_17_8_warns_when_the_config_needs_1_18(tmp_path, config):
    root = image(tmp_path, {"nvidia-container-toolkit-base": ("1.17.8-1", BASE)})
    assert toolkit_image.image_row(FakeImage(root)).result == PASS
    row = toolkit_image.image_row(FakeImage(root, config))
    assert row.result == WARN and "need nvidia-ctk 1.18.0 or later" in row.detail, row


def test_a_usrmerged_list_and_a_removed_package_are_read_as_dpkg_means_them(tmp_path):
    root = image(tmp_path, {"nvidia-container-toolkit-base": ("1.20.0-1", ["/bin/nvidia-ctk",
                                                                            "/bin/nvidia-cdi-hook"])})
    assert toolkit_image.image_row(FakeImage(root)).result == PASS
    (root / "var/lib/dpkg/status").write_text(stanza("nvidia-container-toolkit-base", "1.20.0-1",
                                                     "deinstall ok config-files"))
    row = toolkit_image.image_row(FakeImage(root))
    assert row.result == SKIP and "version unknown" in row.detail, row


def test_no_hook_binary_warns_and_no_nvidia_ctk_is_the_tools_row_s(tmp_path):
    root = image(tmp_path, {"nvidia-container-toolkit-base": ("1.20.0-1", BASE)},
                 binaries=("nvidia-ctk",))
    row = toolkit_image.image_row(FakeImage(root))
    assert row.result == WARN and "no nvidia-cdi-hook" in row.detail, row
    empty = tmp_path / "empty"
    empty.mkdir()
    assert toolkit_image.image_row(FakeImage(empty)).result == SKIP


def test_binaries_no_package_lists_are_not_compared_under_a_root(tmp_path):
    root = image(tmp_path, {})
    row = toolkit_image.image_row(FakeImage(root))
    assert row.result == SKIP and "version unknown (no dpkg package lists it)" in row.detail


def test_upstream_versions():
    assert toolkit_image.upstream("1.17.8-1") == "1.17.8"
    assert toolkit_image.upstream("1:1.20.0~rc.1-0ubuntu1") == "1.20.0~rc.1"
    assert toolkit_image.upstream("garbage") is None


def test_on_root_slash_a_binary_no_package_lists_is_asked_its_version(tmp_path):
    tool = tmp_path / "nvidia-ctk"
    tool.write_text("#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.19.0'\n"
                    "echo 'commit: 1234567'\n")
    tool.chmod(0o755)
    assert toolkit_image._asked(FakeImage(tmp_path), str(tool)) == "1.19.0"
    tool.write_text("#!/bin/sh\necho 'stand-in: not for running' >&2\nexit 1\n")
    assert toolkit_image._asked(FakeImage(tmp_path), str(tool)) is None


# --- CDI versions against podman (issue 46 item 8) ------------------------------------------

@pytest.mark.parametrize("ctk, podman, warns", [
    ("1.19.1", "4.3.1+ds1-8+deb12u1", True),  # Debian 12's podman and a 0.7.0 writer
    ("1.19.1", "5.4.2+ds1-2", False),  # podman 5 reads 0.7.0
    ("1.20.0", "4.3.1+ds1-8+deb12u1", False),  # 1.20.0 wrote 0.5.0 on the real H200
    ("1.18.2", "4.3.1+ds1-8+deb12u1", False),  # not in the table: no claim
    ("1.19.1", None, False),  # no podman: kata-agent's CDI crate reads 0.7.0
])
def test_podman_before_5_warns_only_for_a_toolkit_seen_writing_0_7_0(tmp_path, ctk, podman,
                                                                      warns):
    extra = "\n" + stanza("podman", podman) if podman else ""
    root = image(tmp_path, {"nvidia-container-toolkit-base": (f"{ctk}-1", BASE)},
                 extra_status=extra)
    row = toolkit_image.image_row(FakeImage(root))
    said = "cdiVersion 0.7.0 (the toolkit version table)" in row.detail
    assert said == warns, row
    if warns:
        assert row.result == "warn" and "podman 4.3.1+ds1 (dpkg) is older than 5" in row.detail
        assert "install podman 5 or later" in row.hint
    else:
        assert "podman" not in row.detail, row


def test_a_missing_hook_is_said_once(tmp_path):
    """Issue 47 item 13: ``no nvidia-cdi-hook: no nvidia-cdi-hook: the hooks ... name it``."""
    root = image(tmp_path, {"nvidia-container-toolkit-base": ("1.20.0-1", BASE[:1])},
                 binaries=("nvidia-ctk",))
    row = toolkit_image.image_row(FakeImage(root))
    assert row.result == WARN, row
    assert row.detail.count("no nvidia-cdi-hook") == 1, row.detail
    assert "the hooks of nvidia-ctk's specs name it" in row.detail
