"""The exporter's pure parts: settings, addresses, names, the DCGM counter types."""

from __future__ import annotations

import pytest

from podvm_gpu.config.metrics import MetricsConfigError, MetricsSettings, parse_listen
from podvm_gpu.errors import ConfigError
from podvm_gpu.gpufacts.nvml import GpuReading, NvmlReading, cc_safe, reason_of
from podvm_gpu.gpufacts.words import bus_id as pci_bus_id
from podvm_gpu.metrics.exporter import nvml_gate, render, type_dcgm_counters
from podvm_gpu.metrics.families import DCGM_COUNTERS, DCGM_FIELDS, dcgm_families
from podvm_gpu.metrics.health_families import COUNTERS as EXP_COUNTERS


def test_defaults_are_loopback_auto_and_no_textfile():
    s = MetricsSettings.from_mapping(None)
    assert s.to_dict() == {"profile": "auto", "listen": "127.0.0.1:9400", "textfile": False,
                           "textfile_path": "/run/podvm-gpu/metrics.prom",
                           "textfile_interval_s": 30.0, "nvml_timeout_s": 5.0, "web_config": ""}


@pytest.mark.parametrize("section, key, message", [
    ({"profil": "auto"}, "metrics.profil", "unknown key"),
    ({"profile": "safe"}, "metrics.profile", "must be one of auto, full, cc-safe, not 'safe'"),
    ({"listen": "localhost:9400"}, "metrics.listen", "the host must be an IP address"),
    ({"listen": "::1:9400"}, "metrics.listen", "write an IPv6 address in brackets, [::1]:9400"),
    ({"listen": "[127.0.0.1]:9400"}, "metrics.listen", "only an IPv6 address goes in brackets"),
    ({"listen": "127.0.0.1:0"}, "metrics.listen", "port 1-65535"),
    ({"listen": 9400}, "metrics.listen", "must be a string"),
    ({"textfile": "yes"}, "metrics.textfile", "must be true or false"),
    ({"textfile_path": "metrics.prom"}, "metrics.textfile_path", "absolute file path"),
    ({"nvml_timeout_s": True}, "metrics.nvml_timeout_s", "number of seconds"),
    ({"nvml_timeout_s": 0}, "metrics.nvml_timeout_s", "more than 0"),
    ({"nvml_timeout_s": float("inf")}, "metrics.nvml_timeout_s", "more than 0"),
    ({"textfile_interval_s": 7200}, "metrics.textfile_interval_s", "at most 3600"),
    ([1], "metrics", "must be a mapping"),
])
def test_a_bad_value_names_its_key(section, key, message):
    with pytest.raises(MetricsConfigError) as err:
        MetricsSettings.from_mapping(section)
    assert err.value.key_path == key
    assert message in err.value.message
    assert str(err.value).startswith(f"{key}: ")
    assert isinstance(err.value, ConfigError), "the CLI's config error handling applies"


def test_settings_are_values():
    assert MetricsSettings.from_mapping({"profile": "full"}) == MetricsSettings(profile="full")
    assert MetricsSettings() != MetricsSettings(textfile=True)
    assert len({MetricsSettings(), MetricsSettings()}) == 1


def test_listen_addresses():
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::]:9400") == ("::", 9400)
    assert parse_listen("[fd00::5]:80") == ("fd00::5", 80)
    assert parse_listen("127.0.0.1:0", allow_any_port=True) == ("127.0.0.1", 0)
    assert MetricsSettings(listen="").listen == "", "no HTTP server"


@pytest.mark.parametrize("given, nvml", [("0000:01:00", "00000000:01:00.0"),
                                         ("0000:3b:00.1", "00000000:3B:00.1"),
                                         ("00000000:C3:00.0", "00000000:C3:00.0"),
                                         ("garbage", "garbage")])
def test_pci_addresses_take_nvmls_form(given, nvml):
    assert pci_bus_id(given) == nvml


def test_reason_words_come_from_pynvmls_error_classes():
    import pynvml

    assert reason_of(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) == "driver-not-loaded"
    assert reason_of(pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)) == \
        "lib-rm-version-mismatch"
    assert reason_of(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "gpu-is-lost"
    assert reason_of(pynvml.NVMLError(12345)) == "error"


@pytest.mark.parametrize("profile, mode, safe", [
    ("auto", "off", False), ("auto", "unsupported", False), ("auto", "on", True),
    ("auto", "devtools", True), ("auto", "ppcie", True), ("auto", None, True),
    ("full", "on", False), ("cc-safe", "off", True)])
def test_profile_decision(profile, mode, safe):
    assert cc_safe(profile, mode) is safe


@pytest.mark.parametrize("status, reason", [
    (None, "no-status"), ({"state": "running"}, "boot-running"),
    ({"state": "no-gpu", "reason": "no NVIDIA GPU"}, "no-gpu"),
    ({"state": "failed", "reason": "modules: Xid 79"}, "boot-failed")])
def test_nvml_is_gated_on_a_ready_boot(status, reason):
    assert nvml_gate(status, persistenced_up=True)[0] == reason
    assert nvml_gate({"state": "ready"}, persistenced_up=False)[0] == "persistenced-not-running"
    assert nvml_gate({"state": "ready"}, persistenced_up=True) is None


def reading_with_every_field() -> NvmlReading:
    reading = NvmlReading(True)
    reading.driver_version = "550.54.15"
    g = GpuReading(0)
    g.up, g.uuid, g.name, g.pci_bus_id = True, "GPU-1", "NVIDIA H100", "00000000:04:00.0"
    g.values = {name: 1 for name in DCGM_FIELDS if name != "DCGM_FI_DEV_XID_ERRORS"}
    reading.gpus = [g]
    return reading


def test_cc_safe_families_have_no_full_profile_field_even_when_read():
    names = {f.name for f in dcgm_families(reading_with_every_field(), "h", {}, "cc-safe")}
    assert names == {n for n, (_, _, p) in DCGM_FIELDS.items() if p == "cc-safe"}


def test_only_the_dcgm_counter_type_lines_change():
    text = render(dcgm_families(reading_with_every_field(), "h", {}, "full"))
    raw = text.replace(b" counter\n", b" untyped\n")
    assert type_dcgm_counters(raw) == text
    assert text.count(b" counter\n") == len(DCGM_COUNTERS - EXP_COUNTERS)  # those: health_families
    assert [line for line in text.splitlines() if not line.startswith(b"#")] == \
        [line for line in raw.splitlines() if not line.startswith(b"#")]


def test_plain_command_lines_are_parsed_without_argparse_and_the_rest_goes_to_it():
    from podvm_gpu.cli import fast_args

    assert fast_args(["metrics", "--root", "/r", "--listen=0.0.0.0:9400", "--textfile"]) == (
        "metrics", {"root_dir": "/r", "config": None, "listen": "0.0.0.0:9400", "serve": False,
                    "openmetrics": False, "textfile": True, "pod_labels": False})
    assert fast_args(["metrics", "--pod-labels"])[1]["pod_labels"] is True  # issue 28
    assert fast_args(["metrics", "--serve", "--config", "/etc/x.yaml"])[1]["config"] == \
        "/etc/x.yaml"
    for other in (["--help"], ["--listen"], ["--root", "--serve"], ["extra"], ["--json"]):
        assert fast_args(["metrics", *other]) is None, other


def test_kernel_log_records_say_whether_the_log_could_be_read(tmp_path):
    from podvm_gpu.config.metrics import MetricsSettings
    from podvm_gpu.host.fs import Root
    from podvm_gpu.metrics.exporter import Exporter

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("6,1,10,-;virtio_net virtio0: up\n"
                                       "14,2,20,-;a program's line, not the kernel's\n"
                                       "6,3,30,-;NVRM: loading NVIDIA UNIX Open Kernel Module\n")
    read = {f.name: f for f in Exporter(Root(tmp_path), MetricsSettings()).families(with_nvml=False)}
    assert read["podvm_gpu_kernel_log_records"].samples[0].value == 2
    (tmp_path / "dev/kmsg").unlink()
    unread = {f.name: f for f in Exporter(Root(tmp_path), MetricsSettings()).families(with_nvml=False)}
    assert unread["podvm_gpu_kernel_log_records"].samples[0].value == 0


def test_the_default_listen_address_is_one_parse_listen_accepts():
    # MetricsSettings skips parsing the default (boot builds the settings on every GPU boot)
    from podvm_gpu.config.metrics import DEFAULT_LISTEN, parse_listen

    assert parse_listen(DEFAULT_LISTEN) == ("127.0.0.1", 9400)
