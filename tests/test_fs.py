"""Root-relative paths and atomic writes (podvm_gpu.host.fs; contract sections 1 and 2).

Path resolution is pure file logic, so it runs on pyfakefs; the atomic-write tests that depend on
the kernel's own behaviour (umask, O_NOFOLLOW, rename over a symlink) use real temp dirs.
"""

from __future__ import annotations

import errno
import os
import stat

import pytest

from podvm_gpu.host import fs as fsmod
from podvm_gpu.host.fs import Root, atomic_write, ensure_dir, is_char_device

ROOT = "/vmroot"


# --- Root.resolve: chroot-style resolution (pyfakefs) -----------------------------------------

@pytest.fixture
def root(fs) -> Root:
    """A fake VM root at /vmroot with the usual ``/var/run -> /run`` link."""
    fs.create_dir(f"{ROOT}/run/cdi")
    fs.create_dir(f"{ROOT}/var")
    fs.create_symlink(f"{ROOT}/var/run", "/run")
    return Root(ROOT)


def test_absolute_symlink_var_run_stays_inside_the_root(root, fs):
    fs.create_dir("/run/cdi")  # the host's own /run must not be where it lands

    assert root.resolve("/var/run/cdi/nvidia.yaml") == f"{ROOT}/run/cdi/nvidia.yaml"


def test_relative_symlink_is_taken_from_the_links_folder(root, fs):
    fs.create_dir(f"{ROOT}/usr/lib")
    fs.create_symlink(f"{ROOT}/lib", "usr/lib")

    assert root.resolve("/lib/x86_64-linux-gnu/libc.so.6") == \
        f"{ROOT}/usr/lib/x86_64-linux-gnu/libc.so.6"


def test_dotdot_cannot_climb_out_of_the_root(root):
    assert root.resolve("/../../../etc/shadow") == f"{ROOT}/etc/shadow"
    assert root.resolve("/run/../../../../etc/shadow") == f"{ROOT}/etc/shadow"


def test_relative_link_full_of_dotdot_cannot_climb_out_of_the_root(root, fs):
    fs.create_symlink(f"{ROOT}/run/escape", "../../../../../../etc")

    assert root.resolve("/run/escape/passwd") == f"{ROOT}/etc/passwd"


def test_absolute_link_to_a_host_path_is_taken_under_the_root(root, fs):
    fs.create_file("/etc/passwd", contents="host")
    fs.create_symlink(f"{ROOT}/run/pw", "/etc/passwd")

    assert root.resolve("/run/pw") == f"{ROOT}/etc/passwd"


def test_symlink_loop_is_an_eloop_error(root, fs):
    fs.create_symlink(f"{ROOT}/a", "b")
    fs.create_symlink(f"{ROOT}/b", "/a")

    with pytest.raises(OSError) as err:
        root.resolve("/a/x")
    assert err.value.errno == errno.ELOOP


def test_a_chain_of_41_links_cannot_lead_out_of_the_root(root, fs):
    """Keeping the 41st link as a plain name would let the kernel follow it out of the root."""
    fs.create_dir("/outside")
    for i in range(1, 41):
        fs.create_symlink(f"{ROOT}/l{i}", f"/l{i + 1}")
    fs.create_symlink(f"{ROOT}/l41", "/outside")

    with pytest.raises(OSError) as err:
        root.resolve("/l1/nvidia.yaml")
    assert err.value.errno == errno.ELOOP


def test_follow_last_false_returns_the_link_itself(root, fs):
    fs.create_file(f"{ROOT}/run/cdi/real.yaml")
    fs.create_symlink(f"{ROOT}/run/cdi/nvidia.yaml", "/run/cdi/real.yaml")

    assert root.resolve("/var/run/cdi/nvidia.yaml", follow_last=False) == \
        f"{ROOT}/run/cdi/nvidia.yaml"
    assert root.resolve("/var/run/cdi/nvidia.yaml") == f"{ROOT}/run/cdi/real.yaml"


def test_missing_components_are_appended_as_they_are(root):
    assert root.resolve("/proc/driver/nvidia/gpus/0000:00:04.0/information") == \
        f"{ROOT}/proc/driver/nvidia/gpus/0000:00:04.0/information"


def test_host_path_is_the_inverse_of_resolve(root):
    assert root.host_path(root.resolve("/run/cdi")) == "/run/cdi"
    assert root.host_path(ROOT) == "/"


def test_read_text_and_exists_follow_links_chroot_style(root, fs):
    fs.create_file(f"{ROOT}/run/podvm-gpu/status.json", contents="{}")

    assert root.exists("/var/run/podvm-gpu/status.json")
    assert root.read_text("/var/run/podvm-gpu/status.json") == "{}"
    assert root.read_text("/var/run/nothing", default="gone") == "gone"


def test_slash_operator_is_resolve(root):
    assert root / "/var/run/cdi" == f"{ROOT}/run/cdi"


def test_host_root_is_not_rewritten():
    assert Root("/").is_host
    assert Root("/").resolve("/proc//devices", follow_last=False) == "/proc/devices"


# --- atomic_write (real temp dirs) -----------------------------------------------------------

def test_atomic_write_sets_mode_0644_whatever_the_umask(tmp_path):
    target = tmp_path / "nvidia.yaml"
    old = os.umask(0o077)
    try:
        atomic_write(str(target), "kind: nvidia.com/gpu\n")
    finally:
        os.umask(old)

    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == "kind: nvidia.com/gpu\n"


def test_atomic_write_mode_is_not_widened_by_a_zero_umask(tmp_path):
    target = tmp_path / "status.json"
    old = os.umask(0)
    try:
        atomic_write(str(target), b"{}")
    finally:
        os.umask(old)

    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_atomic_write_temp_name_is_not_scanned_by_cdi_readers(tmp_path, monkeypatch):
    """CDI readers load every *.yaml and *.json in /var/run/cdi; the temporary file must not be
    one, even for the instant it exists."""
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.path.dirname(src), os.path.basename(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(fsmod.os, "replace", spy)
    atomic_write(str(tmp_path / "nvidia.yaml"), "x")
    atomic_write(str(tmp_path / "status.json"), "x")

    assert len(seen) == 2
    for folder, name in seen:
        assert folder == str(tmp_path)  # same directory: the rename is atomic
        assert not name.endswith((".yaml", ".yml", ".json"))


def test_atomic_write_replaces_a_planted_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "nvidia.yaml"
    target.symlink_to(victim)

    atomic_write(str(target), "new")

    assert not target.is_symlink()
    assert target.read_text() == "new"
    assert victim.read_text() == "precious"


def test_atomic_write_ignores_a_symlink_planted_at_the_temp_name(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    monkeypatch.setattr(fsmod.os, "getpid", lambda: 4242)
    (tmp_path / ".nvidia.yaml.4242.tmp").symlink_to(victim)

    atomic_write(str(tmp_path / "nvidia.yaml"), "new")

    assert victim.read_text() == "precious"
    assert (tmp_path / "nvidia.yaml").read_text() == "new"


def test_atomic_write_replaces_the_old_file_never_appends(tmp_path):
    target = tmp_path / "nvidia.yaml"
    target.write_text("old content that is longer than the new one\n")

    atomic_write(str(target), "new\n")

    assert target.read_text() == "new\n"


def test_atomic_write_leaves_no_temp_file_when_the_rename_fails(tmp_path):
    target = tmp_path / "nvidia.yaml"
    target.mkdir()  # os.replace of a file over a directory fails
    (target / "keep").write_text("x")

    with pytest.raises(OSError):
        atomic_write(str(target), "new")

    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia.yaml"]


def test_atomic_write_leaves_no_temp_file_and_keeps_the_old_file_when_the_disk_is_full(
        tmp_path, monkeypatch):
    target = tmp_path / "status.json"
    target.write_text("old")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsmod.os, "write", full)
    with pytest.raises(OSError) as err:
        atomic_write(str(target), "new")

    assert err.value.errno == errno.ENOSPC
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_atomic_write_fails_cleanly_when_the_folder_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write(str(tmp_path / "nope" / "x.json"), "x")


def test_atomic_write_under_pyfakefs_writes_the_bytes_with_mode_0644(fs):
    fs.create_dir("/run/podvm-gpu")

    atomic_write("/run/podvm-gpu/status.json", '{"state": "running"}')

    with open("/run/podvm-gpu/status.json") as f:
        assert f.read() == '{"state": "running"}'
    assert stat.S_IMODE(os.stat("/run/podvm-gpu/status.json").st_mode) == 0o644
    assert os.listdir("/run/podvm-gpu") == ["status.json"]


# --- ensure_dir, is_char_device ------------------------------------------------------------------

def test_ensure_dir_creates_parents_not_world_writable(tmp_path):
    old = os.umask(0)
    try:
        ensure_dir(str(tmp_path / "var" / "run" / "cdi"))
    finally:
        os.umask(old)

    assert stat.S_IMODE((tmp_path / "var" / "run" / "cdi").stat().st_mode) == 0o755
    ensure_dir(str(tmp_path / "var" / "run" / "cdi"))  # exists: no error


def test_is_char_device_reads_major_and_minor():
    assert is_char_device("/dev/null") == (1, 3)


def test_is_char_device_is_none_for_a_file_or_nothing(tmp_path):
    (tmp_path / "nvidia0").write_text("")

    assert is_char_device(str(tmp_path / "nvidia0")) is None
    assert is_char_device(str(tmp_path / "missing")) is None
