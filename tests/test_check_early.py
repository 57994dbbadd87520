"""``check --image``'s ``early-gpu-clients`` row (issue 46 item 2; podvm_gpu/check/early.py): what
in an image loads the NVIDIA driver or opens a GPU before the agent, by modules-load.d(5)'s rules
and the image's enabled units. tests/test_check_image.py runs it through ``check --image``."""

from __future__ import annotations

from podvm_gpu.check.early import early_clients_check, modules_loaded_early, units_opening_gpus
from podvm_gpu.host.fs import Root


def write(root, path, text):
    full = root / path.lstrip("/")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)
    return full


def test_an_image_without_early_clients_passes(tmp_path):
    write(tmp_path, "/etc/modules-load.d/virtio.conf", "virtio_net\n")
    check = early_clients_check(Root(tmp_path), confidential=True)
    assert check.result == "pass"


def test_every_nvidia_module_in_force_is_named_comments_and_dashes_read_as_systemd_does(tmp_path):
    write(tmp_path, "/usr/lib/modules-load.d/nvidia.conf",
          "# the driver\nnvidia\n; nvidia_uvm\nnvidia-modeset  # KMS\n")
    write(tmp_path, "/etc/modules-load.d/peermem.conf", "nvidia_peermem\n")
    assert modules_loaded_early(Root(tmp_path)) == [
        "/usr/lib/modules-load.d/nvidia.conf loads nvidia, nvidia_modeset",
        "/etc/modules-load.d/peermem.conf loads nvidia_peermem"]


def test_a_file_of_the_same_name_in_etc_wins_and_a_dev_null_link_masks(tmp_path):
    write(tmp_path, "/usr/lib/modules-load.d/nvidia.conf", "nvidia_drm\n")
    write(tmp_path, "/etc/modules-load.d/nvidia.conf", "nvidia_uvm\n")
    assert modules_loaded_early(Root(tmp_path)) == ["/etc/modules-load.d/nvidia.conf loads nvidia_uvm"]
    (tmp_path / "etc/modules-load.d/nvidia.conf").unlink()
    (tmp_path / "etc/modules-load.d/nvidia.conf").symlink_to("/dev/null")
    assert modules_loaded_early(Root(tmp_path)) == []


def test_an_enabled_dcgm_unit_counts_unless_ordered_after_the_agent(tmp_path):
    unit = "/usr/lib/systemd/system/nvidia-dcgm.service"
    write(tmp_path, unit, "[Service]\nExecStart=/usr/bin/nv-hostengine -n\n"
          "[Install]\nWantedBy=multi-user.target\n")
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "nvidia-dcgm.service").symlink_to(unit)
    assert units_opening_gpus(Root(tmp_path)) == [
        "nvidia-dcgm.service is enabled and not ordered after podvm-gpu.service"]
    check = early_clients_check(Root(tmp_path), confidential=False)
    assert check.result == "warn" and "nvidia-dcgm.service" in check.detail
    write(tmp_path, "/etc/systemd/system/nvidia-dcgm.service.d/10-after.conf",
          "[Unit]\nAfter=podvm-gpu.service\n")
    assert units_opening_gpus(Root(tmp_path)) == []


def test_a_confidential_image_fails_and_names_the_cause(tmp_path):
    write(tmp_path, "/etc/modules-load.d/nvidia.conf", "nvidia-drm\n")
    check = early_clients_check(Root(tmp_path), confidential=True)
    assert check.result == "fail"
    assert "loads nvidia_drm: before the agent's persistenced" in check.detail
    assert "nvtrust#109" in check.detail and "modules-load.d" in check.hint
