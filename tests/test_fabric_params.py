"""ModifyDeviceFiles against the fabric manager (podvm_gpu/steps/fabric/params.py, issue 36):
the loaded module's value in /proc/driver/nvidia/params, read as the driver writes the file.
Boot-level (the fabric manager never started): scenario C73."""

from __future__ import annotations

import pytest

from podvm_gpu.errors import StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.steps.fabric import params

# The head of /proc/driver/nvidia/params as the driver writes it: "Name: value" a line.
PARAMS = ("ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: {}\n"
          "DeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n")


def root_with(tmp_path, text: str | None) -> Root:
    if text is not None:
        (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
        (tmp_path / "proc/driver/nvidia/params").write_text(text)
    return Root(str(tmp_path))


@pytest.mark.parametrize("text, value", [(PARAMS.format(0), 0), (PARAMS.format(1), 1),
                                         ("RmLogonRC: 1\n", None), (None, None)])
def test_modify_device_files_is_read_from_the_loaded_module_s_params(tmp_path, text, value):
    assert params.modify_device_files(root_with(tmp_path, text)) == value


def test_zero_fails_naming_the_parameter_the_fabric_and_what_to_do_instead(tmp_path):
    with pytest.raises(StepFailed) as err:
        params.refuse_without_device_files(root_with(tmp_path, PARAMS.format(0)),
                                           "4 NVSwitch(es)")
    said = str(err.value)
    assert said.startswith("ModifyDeviceFiles: 0 in /proc/driver/nvidia/params")
    for words in ("NVreg_ModifyDeviceFiles=0", "4 NVSwitch(es)", "NV_ERR_INVALID_STATE",
                  "the fabric manager was not started",
                  "cdi.disable_hooks: [disable-device-node-modification]"):
        assert words in said


@pytest.mark.parametrize("text", [PARAMS.format(1), None, "ModifyDeviceFiles: x\n"])
def test_one_or_no_value_lets_the_fabric_manager_start(tmp_path, text):
    params.refuse_without_device_files(root_with(tmp_path, text), "4 NVSwitch(es)")
