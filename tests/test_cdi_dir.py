"""Other spec files of kind nvidia.com/gpu (podvm_gpu.cdi; contract section 3, step 9).

Boot owns the kind in /var/run/cdi: kata-agent drops every device two specs define, so another
file there that defines it is renamed to ``<name>.disabled-by-podvm-gpu`` on every outcome, also on
a VM without a GPU and on a failed boot. /etc/cdi is only reported, never written. The module is
tested directly on a temporary root, then through the real boot under the CPU-VM umockdev tree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from guards import must_finish_within

from podvm_gpu.cdi import DISABLED_SUFFIX, disable_duplicates, other_specs
from podvm_gpu.host.fs import Root

GPU_YAML = ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n"
            "    deviceNodes:\n    - path: /dev/nvidia0\n")
GPU_YAML_QUOTED = GPU_YAML.replace("kind: nvidia.com/gpu", 'kind: "nvidia.com/gpu"  # toolkit')
# what nvidia-ctk writes with --format=json: one line, no blanks
GPU_JSON = json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                       "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}]},
                      separators=(",", ":"))
FPGA_YAML = ("cdiVersion: 0.5.0\nkind: example.com/fpga\ndevices:\n- name: a\n  containerEdits:\n"
             "    env: [A=1]\n")
# another vendor's spec whose device annotation happens to say kind: nvidia.com/gpu
NESTED_YAML = ("cdiVersion: 0.6.0\nkind: example.com/fpga\ndevices:\n- name: a\n  annotations:\n"
               "    kind: nvidia.com/gpu\n  containerEdits:\n    env: [A=1]\n")


@pytest.fixture
def vm(tmp_path) -> Path:
    """A VM root with /var/run/cdi and /etc/cdi."""
    root = tmp_path / "root"
    (root / "var" / "run" / "cdi").mkdir(parents=True)
    (root / "etc" / "cdi").mkdir(parents=True)
    return root


def run_cdi(root: Path) -> Path:
    return root / "var" / "run" / "cdi"


def etc_cdi(root: Path) -> Path:
    return root / "etc" / "cdi"




# --- the module on a temporary root --------------------------------------------------------------

@pytest.mark.parametrize("name, text", [("toolkit.yaml", GPU_YAML),
                                        ("quoted.yaml", GPU_YAML_QUOTED),
                                        ("toolkit.json", GPU_JSON)])
def test_a_spec_of_our_kind_in_var_run_cdi_is_renamed_aside_with_a_warning(vm, name, text):
    (run_cdi(vm) / name).write_text(text)

    warnings = disable_duplicates(Root(vm))

    assert sorted(os.listdir(run_cdi(vm))) == [name + DISABLED_SUFFIX]
    assert (run_cdi(vm) / (name + DISABLED_SUFFIX)).read_text() == text  # nothing lost
    assert warnings == [f"cdi: /var/run/cdi/{name} also defined nvidia.com/gpu; renamed to "
                        f"/var/run/cdi/{name}{DISABLED_SUFFIX}"]


@pytest.mark.parametrize("text", [FPGA_YAML, NESTED_YAML], ids=["other-kind", "nested-kind-line"])
def test_a_spec_that_does_not_have_our_kind_at_the_top_is_left_alone(vm, text):
    (run_cdi(vm) / "fpga.yaml").write_text(text)

    assert disable_duplicates(Root(vm)) == []
    assert sorted(os.listdir(run_cdi(vm))) == ["fpga.yaml"]


@pytest.mark.parametrize("name, text", [
    ("fpga.json", json.dumps({"cdiVersion": "0.6.0", "kind": "example.com/fpga", "devices": [
        {"name": "a", "annotations": {"kind": "nvidia.com/gpu"},
         "containerEdits": {"env": ["A=1"]}}]})),
    ("fpga.yaml", NESTED_YAML.replace("  annotations:\n    kind: nvidia.com/gpu\n",
                                      '  annotations: {"kind": "nvidia.com/gpu"}\n')),
], ids=["json", "yaml-flow-mapping"])
def test_a_nested_kind_value_in_a_spec_of_another_kind_does_not_make_it_ours(vm, name, text):
    """Only the top-level kind decides (the CDI library's rule, and what this module's docstring
    promises). A JSON-shaped ``"kind": "nvidia.com/gpu"`` inside another vendor's spec must not
    get that vendor's devices renamed away (and reported by check as duplicates)."""
    assert yaml.safe_load(text)["kind"] == "example.com/fpga"
    (run_cdi(vm) / name).write_text(text)

    assert disable_duplicates(Root(vm)) == []
    assert sorted(os.listdir(run_cdi(vm))) == [name]


def test_a_symlink_in_var_run_cdi_is_not_read_through(vm, tmp_path):
    """The spec folder is opened with O_NOFOLLOW: a planted link must not make boot read (or act
    on) whatever file it names."""
    target = tmp_path / "elsewhere" / "gpu.yaml"
    target.parent.mkdir()
    target.write_text(GPU_YAML)
    os.symlink(target, run_cdi(vm) / "link.yaml")

    assert disable_duplicates(Root(vm)) == []
    assert sorted(os.listdir(run_cdi(vm))) == ["link.yaml"]
    assert os.path.islink(run_cdi(vm) / "link.yaml")
    assert target.read_text() == GPU_YAML


def test_a_fifo_in_var_run_cdi_does_not_block(vm):
    os.mkfifo(run_cdi(vm) / "pipe.yaml")

    with must_finish_within(5):
        assert disable_duplicates(Root(vm)) == []
    assert sorted(os.listdir(run_cdi(vm))) == ["pipe.yaml"]


@pytest.mark.parametrize("name", ["toolkit.yaml", "nvidia.yaml"])
def test_a_spec_of_our_kind_in_etc_cdi_is_reported_and_never_renamed(vm, name):
    (etc_cdi(vm) / name).write_text(GPU_YAML)

    warnings = disable_duplicates(Root(vm))

    assert sorted(os.listdir(etc_cdi(vm))) == [name]
    assert (etc_cdi(vm) / name).read_text() == GPU_YAML
    assert len(warnings) == 1
    assert f"/etc/cdi/{name}" in warnings[0] and "boot never writes to /etc/cdi" in warnings[0]
    assert DISABLED_SUFFIX not in warnings[0]


def test_our_own_nvidia_yaml_is_not_renamed(vm):
    (run_cdi(vm) / "nvidia.yaml").write_text(GPU_YAML)

    assert disable_duplicates(Root(vm)) == []
    assert sorted(os.listdir(run_cdi(vm))) == ["nvidia.yaml"]


def test_only_yaml_and_json_files_are_looked_at(vm):
    (run_cdi(vm) / "notes.txt").write_text(GPU_YAML)
    (run_cdi(vm) / ("old.yaml" + DISABLED_SUFFIX)).write_text(GPU_YAML)

    assert disable_duplicates(Root(vm)) == []
    assert other_specs(Root(vm), "/var/run/cdi") == []


def test_missing_spec_folders_mean_nothing_to_do(tmp_path):
    assert disable_duplicates(Root(tmp_path)) == []
    assert list(tmp_path.iterdir()) == []


# --- through the real boot: every outcome ---------------------------------------------------------

def populate(root: Path, outside: Path) -> None:
    """Every kind of file the spec folders of a VM may hold."""
    (run_cdi(root) / "toolkit.yaml").write_text(GPU_YAML)
    (run_cdi(root) / "toolkit.json").write_text(GPU_JSON)
    (run_cdi(root) / "fpga.yaml").write_text(FPGA_YAML)
    (run_cdi(root) / "nested.yaml").write_text(NESTED_YAML)
    (run_cdi(root) / "nvidia.yaml").write_text(GPU_YAML)  # an earlier boot's, replaced
    outside.write_text(GPU_YAML)
    os.symlink(outside, run_cdi(root) / "link.yaml")
    (etc_cdi(root) / "image.yaml").write_text(GPU_YAML)


def assert_duplicates_handled(root: Path, outside: Path, status: dict) -> None:
    assert sorted(os.listdir(run_cdi(root))) == [
        "fpga.yaml", "link.yaml", "nested.yaml", "nvidia.yaml",
        "toolkit.json" + DISABLED_SUFFIX, "toolkit.yaml" + DISABLED_SUFFIX]
    assert os.path.islink(run_cdi(root) / "link.yaml") and outside.read_text() == GPU_YAML
    assert sorted(os.listdir(etc_cdi(root))) == ["image.yaml"]
    spec = yaml.safe_load((run_cdi(root) / "nvidia.yaml").read_text())
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    warnings = status["warnings"]
    assert len(warnings) == 3, warnings
    assert any("/var/run/cdi/toolkit.yaml" in w and "renamed" in w for w in warnings)
    assert any("/var/run/cdi/toolkit.json" in w and "renamed" in w for w in warnings)
    assert any("/etc/cdi/image.yaml" in w and "never writes to /etc/cdi" in w for w in warnings)


def test_boot_without_a_gpu_renames_duplicates_and_warns_in_the_status(vm, tmp_path, podvm,
                                                                       empty_path):
    outside = tmp_path / "outside.yaml"
    populate(vm, outside)

    done = podvm(["boot", "--root", str(vm)], tree="cpu-vm", env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    status = json.loads((vm / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "no-gpu"
    assert_duplicates_handled(vm, outside, status)


def test_a_failed_boot_renames_duplicates_too(vm, tmp_path, podvm, empty_path):
    outside = tmp_path / "outside.yaml"
    populate(vm, outside)
    (vm / "etc" / "podvm-gpu").mkdir()
    (vm / "etc" / "podvm-gpu" / "config.yaml").write_text("budget_s: true\n")

    done = podvm(["boot", "--root", str(vm)], tree="cpu-vm", env={"PATH": empty_path})

    assert done.returncode == 1, done.stderr
    status = json.loads((vm / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "failed" and status["reason"].startswith("config:")
    assert_duplicates_handled(vm, outside, status)
