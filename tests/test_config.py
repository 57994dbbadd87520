"""The optional config file (podvm_gpu.config; contract section 7).

Loading is pure file logic and runs on pyfakefs; the boot with a bad config is the real command
in a subprocess, under the CPU-VM umockdev tree so that it does not depend on this machine's PCI
devices (with a config file present, boot always takes the validated path).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from guards import must_finish_within

from podvm_gpu.config.load import load_config
from podvm_gpu.config.model import DEFAULT_TIMEOUTS, Config, timeouts_for
from podvm_gpu.errors import ConfigError, PodvmGpuError

PATH = "/etc/podvm-gpu/config.yaml"


@pytest.fixture
def config_file(fs):
    """Write a config file on the fake file system; returns the writer."""
    def write(text: str) -> str:
        fs.create_file(PATH, contents=text)
        return PATH

    return write


def load_error(text: str, config_file) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(config_file(text))
    return str(err.value)


# --- defaults --------------------------------------------------------------------------------

def test_defaults_when_there_is_no_file(fs):
    config = load_config(PATH)

    assert config == Config()
    assert config.budget_s == 240
    assert config.unavailable_spec is True
    # issue 26: the ready state is set at boot by default (after attestation in a confidential
    # guest); it was false before, a contract change (docs/interface.md 3.11, migration)
    assert config.confidential_computing.set_ready_state is True
    assert config.confidential_computing.attestation == "auto"
    # issue 46: per_gpu_s unset follows the GPUs' architecture (gpufacts/attach.py; 15 s Hopper)
    assert (config.persistenced.ready_timeout_s, config.persistenced.per_gpu_s) == (30, None)
    assert config.timeouts == {} and config.tools == {}


def test_the_old_ready_state_default_is_kept_by_saying_it(config_file):
    config = load_config(config_file("confidential_computing: {set_ready_state: false}\n"))
    assert config.confidential_computing.set_ready_state is False


@pytest.mark.parametrize("text, wanted", [
    ("confidential_computing: {attestation: sometimes}\n",
     "confidential_computing.attestation: must be one of auto, required, off, not 'sometimes'"),
    ("confidential_computing: {attestation: off}\n",  # YAML 1.1's off is a boolean: say so
     "confidential_computing.attestation: must be one of auto, required, off, not false (YAML "
     "reads an unquoted off as false: write 'off')"),
    ("timeouts: {nvattest: 30}\n",
     "timeouts.nvattest: nvattest's time limit is confidential_computing.attestation_timeout_s "
     "+ attestation_per_device_s per device, not timeouts"),
    ("confidential_computing: {ocsp_url: ftp://proxy}\n",
     "confidential_computing.ocsp_url: 'ftp://proxy' is not an http(s) URL"),
    ("confidential_computing: {relying_party_policy: policy.rego}\n",
     "confidential_computing.relying_party_policy: 'policy.rego' is not an absolute path"),
    ("confidential_computing: {attestation_timeout_s: 0}\n",
     "confidential_computing.attestation_timeout_s: must be greater than 0"),
])
def test_attestation_keys_are_checked(config_file, text, wanted):
    assert wanted in load_error(text, config_file)


def test_attestation_keys_are_taken(config_file):
    cc = load_config(config_file(
        "confidential_computing:\n  attestation: required\n  attestation_timeout_s: 90\n"
        "  attestation_per_device_s: 0\n  rim_dir: /var/lib/rims\n"
        "  ocsp_url: http://10.0.0.1:8080/ocsp\n  image_serves: true\n"
        "tools: {nvattest: /opt/nvat/bin/nvattest}\n")).confidential_computing
    assert (cc.attestation, cc.attestation_timeout_s, cc.attestation_per_device_s) == \
        ("required", 90.0, 0.0)
    assert (cc.rim_dir, cc.ocsp_url, cc.rim_url, cc.image_serves) == \
        ("/var/lib/rims", "http://10.0.0.1:8080/ocsp", None, True)


def test_an_empty_file_means_the_defaults(config_file):
    assert load_config(config_file("")) == Config()


def test_a_file_of_comments_means_the_defaults(config_file):
    assert load_config(config_file("# nothing set here\n")) == Config()


def test_the_fixed_keys_are_read(config_file):
    config = load_config(config_file(
        "budget_s: 30\n"
        "timeouts:\n  nvidia-smi: 5\n  nvidia-ctk: 10\n"
        "persistenced:\n  ready_timeout_s: 5\n  per_gpu_s: 1\n"
        "confidential_computing:\n  set_ready_state: true\n"
        "unavailable_spec: false\n"))

    assert config.budget_s == 30
    assert config.persistenced.ready_timeout_s == 5 and config.persistenced.per_gpu_s == 1
    assert config.confidential_computing.set_ready_state is True
    assert config.unavailable_spec is False
    assert timeouts_for(config)["nvidia-smi"] == 5
    assert timeouts_for(config)["modprobe"] == DEFAULT_TIMEOUTS["modprobe"]


def test_the_detect_section_defaults_to_no_expectation_and_a_60_s_late_gpu_wait(fs):
    detect = load_config(PATH).detect

    assert (detect.expected_gpus, detect.late_gpu_wait_s) == (0, 60)


def test_the_detect_section_is_read(config_file):
    detect = load_config(config_file("detect:\n  expected_gpus: 8\n  late_gpu_wait_s: 0\n")).detect

    assert (detect.expected_gpus, detect.late_gpu_wait_s) == (8, 0)  # 0: look once, no wait


@pytest.mark.parametrize("text, key, words", [
    ("detect: {expected_gpus: -1}\n", "detect.expected_gpus", "from 0 to 64, not -1"),
    ("detect: {expected_gpus: 65}\n", "detect.expected_gpus", "from 0 to 64, not 65"),
    ("detect: {expected_gpus: true}\n", "detect.expected_gpus", "whole number, not a boolean"),
    ("detect: {expected_gpus: 1.5}\n", "detect.expected_gpus", "whole number, not 1.5"),
    ("detect: {expected_gpus: '2'}\n", "detect.expected_gpus", "whole number, not a string"),
    ("detect: {late_gpu_wait_s: -1}\n", "detect.late_gpu_wait_s", "at least 0"),
    ("detect: {late_gpu_wait_s: 3601}\n", "detect.late_gpu_wait_s", "at most 3600"),
    ("detect: {late_gpu_wait_s: .inf}\n", "detect.late_gpu_wait_s", "finite"),
    ("detect: {gpus: 1}\n", "detect.gpus", "unknown key"),
    ("detect: 8\n", "detect", "must be a mapping of settings"),
])
def test_a_bad_detect_value_names_the_key(config_file, text, key, words):
    message = load_error(text, config_file)

    assert f"{PATH}: {key}: " in message and words in message, message


def test_the_config_is_frozen():
    with pytest.raises(AttributeError):
        Config().budget_s = 1  # type: ignore[misc]


# --- errors name the file and the key -------------------------------------------------------------

def test_unknown_top_level_key_names_file_and_key(config_file):
    message = load_error("budget_s: 30\nbudget: 10\n", config_file)

    assert PATH in message
    assert "budget" in message and "unknown key" in message
    assert isinstance(ConfigError(message), PodvmGpuError)


def test_unknown_nested_key_names_the_dotted_key(config_file):
    message = load_error("persistenced:\n  bogus: 1\n", config_file)

    assert PATH in message
    assert "persistenced.bogus" in message
    assert "unknown key" in message


def test_bad_value_names_the_key(config_file):
    message = load_error("persistenced:\n  per_gpu_s: -3\n", config_file)

    assert PATH in message and "persistenced.per_gpu_s" in message


def test_non_positive_budget_is_rejected(config_file):
    assert "budget_s" in load_error("budget_s: 0\n", config_file)


def test_a_bool_that_is_not_a_bool_is_rejected(config_file):
    assert "confidential_computing.set_ready_state" in load_error(
        "confidential_computing:\n  set_ready_state: maybe\n", config_file)


def test_a_tool_timeout_must_be_positive(config_file):
    assert "timeouts.nvidia-smi" in load_error("timeouts:\n  nvidia-smi: 0\n", config_file)


def test_a_tool_path_must_be_absolute(config_file):
    message = load_error("tools:\n  modprobe: sbin/modprobe\n", config_file)

    assert "tools" in message and "sbin/modprobe" in message


def test_more_errors_are_counted(config_file):
    message = load_error("budget_s: -1\nbogus: 1\nother: 2\n", config_file)

    assert "(and 2 more)" in message


@pytest.mark.parametrize("text, kind", [("- budget_s\n- 30\n", "list"), ("just text\n", "str"),
                                        ("42\n", "int")])
def test_a_file_that_is_not_a_mapping_is_rejected(config_file, text, kind):
    message = load_error(text, config_file)

    assert PATH in message and "mapping" in message and kind in message


def test_a_file_that_is_not_yaml_is_rejected_on_one_line(config_file):
    message = load_error("budget_s: [30\n", config_file)

    assert PATH in message and "YAML" in message
    assert "\n" not in message


def test_an_unreadable_config_is_an_error_not_the_defaults(fs):
    fs.create_dir(PATH)  # a folder where the file should be

    with pytest.raises(ConfigError) as err:
        load_config(PATH)
    assert PATH in str(err.value)


# --- boot with a bad config (the real command) --------------------------------------------------

def write_config(root, text: str):
    path = root / "etc" / "podvm-gpu" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_boot_with_an_unknown_key_fails_naming_file_and_key_and_writes_the_unavailable_spec(
        tmp_path, podvm, empty_path):
    root = tmp_path / "root"
    config = write_config(root, "budget_s: 60\npersistenced:\n  bogus: 1\n")

    done = podvm(["boot", "--root", str(root)], tree="cpu-vm", env={"PATH": empty_path})

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "failed"
    assert str(config) in status["reason"] and "persistenced.bogus" in status["reason"]
    assert "\n" not in status["reason"]
    spec = yaml.safe_load((root / "var/run/cdi/nvidia.yaml").read_text())
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    env = spec["devices"][0]["containerEdits"]["env"]
    assert "PODVM_GPU_STATE=failed" in env
    assert any("persistenced.bogus" in e for e in env if e.startswith("PODVM_GPU_REASON="))


def test_boot_with_a_bad_value_in_a_config_given_by_env_names_that_file(tmp_path, podvm,
                                                                        empty_path):
    root = tmp_path / "root"
    root.mkdir()
    config = tmp_path / "elsewhere.yaml"
    config.write_text("budget_s: -5\n")

    done = podvm(["boot", "--root", str(root)], tree="cpu-vm",
                 env={"PATH": empty_path, "PODVM_GPU_CONFIG": str(config)})

    assert done.returncode == 1
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "failed"
    assert str(config) in status["reason"] and "budget_s" in status["reason"]
    assert (root / "var/run/cdi/nvidia.yaml").exists()


def test_boot_with_a_valid_config_on_a_cpu_vm_ends_no_gpu(tmp_path, podvm, empty_path):
    root = tmp_path / "root"
    write_config(root, "budget_s: 60\n")

    done = podvm(["boot", "--root", str(root)], tree="cpu-vm", env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "no-gpu"
    assert (root / "var/run/cdi/nvidia.yaml").exists()


def test_unavailable_spec_false_writes_no_spec(tmp_path, podvm, empty_path):
    root = tmp_path / "root"
    write_config(root, "unavailable_spec: false\n")

    done = podvm(["boot", "--root", str(root)], tree="cpu-vm", env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    assert json.loads((root / "run/podvm-gpu/status.json").read_text())["state"] == "no-gpu"
    assert not (root / "var/run/cdi/nvidia.yaml").exists()


# --- hostile config files: a bounded regular UTF-8 file with strict values ------------------------
# Real files under tmp_path (pyfakefs has no FIFOs); each case is loaded in-process and then given
# to the real boot, which must end failed with the unavailable spec, never hang or take defaults.



def unblock_fifo(path) -> None:
    """Open and close a FIFO's writing end, so that a reader stuck in open() or read() goes on
    (a regression must not leave a process behind)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader: nothing is stuck


def _bytes(data: bytes):
    def make(path):
        path.write_bytes(data)
    return make


# id -> (make the config at the path, the key the message names or None, words it must hold)
HOSTILE_CONFIGS = {
    "not-utf8": (_bytes(b"budget_s: 30\n# caf\xe9 \xff\xfe\n"), None, "UTF-8"),
    "fifo": (os.mkfifo, None, "not a regular file"),
    "directory": (os.mkdir, None, "not a regular file"),
    # a valid config but for its size: one comment line of 1 MiB
    "over-1-mib": (_bytes(b"budget_s: 30\n#" + b"x" * (1 << 20) + b"\n"), None, "larger than"),
    "budget-inf": (_bytes(b"budget_s: .inf\n"), "budget_s", ""),
    "budget-true": (_bytes(b"budget_s: true\n"), "budget_s", ""),
    "budget-over-an-hour": (_bytes(b"budget_s: 4000\n"), "budget_s", ""),
    "timeout-of-an-unknown-tool": (_bytes(b"timeouts: {nonsuch: 5}\n"), "timeouts.nonsuch", ""),
    "path-of-an-unknown-tool": (_bytes(b"tools: {nonsuch: /bin/true}\n"), "tools.nonsuch", ""),
    "module-parameter-named-like-an-option": (
        _bytes(b"modules:\n  parameters:\n    nvidia:\n      --config: 1\n"),
        "modules.parameters", "--config"),
}


@pytest.mark.parametrize("case", HOSTILE_CONFIGS)
def test_load_config_rejects_a_hostile_file_naming_the_file_and_key(tmp_path, case):
    make, key, words = HOSTILE_CONFIGS[case]
    path = tmp_path / "config.yaml"
    make(path)

    try:
        with must_finish_within(5), pytest.raises(ConfigError) as err:
            load_config(str(path))
    finally:
        unblock_fifo(path)

    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert key is None or key in message
    assert words in message
    assert "\n" not in message


@pytest.mark.parametrize("case", HOSTILE_CONFIGS)
def test_boot_with_a_hostile_config_ends_failed_with_the_unavailable_spec(tmp_path, podvm,
                                                                          empty_path, case):
    make, key, words = HOSTILE_CONFIGS[case]
    root = tmp_path / "root"
    config = root / "etc" / "podvm-gpu" / "config.yaml"
    config.parent.mkdir(parents=True)
    make(config)

    try:
        # a FIFO opened for reading blocks until a writer comes: the boot must not wait for one
        done = podvm(["boot", "--root", str(root)], tree="cpu-vm", env={"PATH": empty_path},
                     timeout=5)
    finally:
        unblock_fifo(config)

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "failed"
    assert status["reason"].startswith(f"config: {config}: ")
    assert key is None or key in status["reason"]
    assert words in status["reason"]
    spec = yaml.safe_load((root / "var/run/cdi/nvidia.yaml").read_text())
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert "PODVM_GPU_STATE=failed" in spec["devices"][0]["containerEdits"]["env"]


def test_a_budget_of_exactly_an_hour_is_accepted(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("budget_s: 3600\ntimeouts: {nvidia-smi: 3600}\n")

    assert load_config(str(path)).budget_s == 3600


def test_a_config_of_exactly_1_mib_is_read(tmp_path):
    path = tmp_path / "config.yaml"
    head = b"budget_s: 30\n#"
    path.write_bytes(head + b"x" * ((1 << 20) - len(head) - 1) + b"\n")
    assert path.stat().st_size == 1 << 20

    assert load_config(str(path)).budget_s == 30


def test_a_module_parameter_value_of_two_words_is_rejected(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("modules:\n  parameters:\n    nvidia:\n      NVreg_X: 'a b'\n")

    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert "modules.parameters" in str(err.value) and "NVreg_X" in str(err.value)


# --- the compiled form: the YAML parsed at image build, used while the text is the same ---------

def test_a_compiled_config_is_read_without_pyyaml_and_gives_the_same_settings(tmp_path):
    from podvm_gpu.config.load import compile_config

    path = tmp_path / "config.yaml"
    path.write_text("budget_s: 200\npersistenced:\n  per_gpu_s: 20\n"
                    "modules: {parameters: {nvidia: {NVreg_EnableGpuFirmware: 1}}}\n")
    config, compiled = compile_config(str(path))
    assert compiled == f"{path}.compiled.json" and os.stat(compiled).st_mode & 0o777 == 0o644

    code = ("import sys; from podvm_gpu.config.load import load_config; c = load_config(sys.argv[1]); "
            "print(c.budget_s, c.persistenced.per_gpu_s, 'yaml' in sys.modules)")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["200.0", "20.0", "False"], done.stderr
    assert load_config(str(path)) == config


@pytest.mark.parametrize("change", ["edited", "compiled-garbled", "compiled-of-another-text"])
def test_a_stale_or_broken_compiled_form_is_ignored_and_the_yaml_decides(tmp_path, change):
    from podvm_gpu.config.load import compile_config, compiled_state

    path = tmp_path / "config.yaml"
    path.write_text("budget_s: 200\n")
    _, compiled = compile_config(str(path))
    if change == "edited":
        path.write_text("budget_s: 100\n")
    elif change == "compiled-garbled":
        Path(compiled).write_text('{"format": "podvm-gpu config, compiled, 1", "sou')
    else:
        doc = json.loads(Path(compiled).read_text())
        doc["settings"] = {"budget_s": 5}  # not what the text says: never believed
        Path(compiled).write_text(json.dumps(doc))
        path.write_text("budget_s: 200  \n")

    expected = 100 if change == "edited" else 200
    assert load_config(str(path)).budget_s == expected
    assert compiled_state(str(path)) is not None


def test_a_compiled_form_of_a_config_that_is_now_invalid_does_not_hide_the_error(tmp_path):
    """The compiled document is validated like the YAML: rules of a newer agent still apply."""
    from podvm_gpu.config.load import COMPILED_FORMAT

    path = tmp_path / "config.yaml"
    path.write_text("budget_s: 9999\n")
    Path(f"{path}.compiled.json").write_text(json.dumps(
        {"format": COMPILED_FORMAT, "source": "budget_s: 9999\n", "settings": {"budget_s": 9999}}))

    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert "budget_s" in str(err.value)


def test_compiling_an_invalid_config_writes_nothing(tmp_path):
    from podvm_gpu.config.load import compile_config

    path = tmp_path / "config.yaml"
    path.write_text("budget_s: -1\n")
    with pytest.raises(ConfigError):
        compile_config(str(path))
    assert not Path(f"{path}.compiled.json").exists()


def test_an_optional_module_the_agent_does_not_load_is_a_config_error(tmp_path):
    # the modules step loads only nvidia_modeset of this list: another name would be ignored
    path = tmp_path / "config.yaml"
    path.write_text("modules:\n  optional: [nvidia_modeset, nvidia_drm]\n")

    with pytest.raises(ConfigError, match=r"modules\.optional\.1: not an optional module: "
                                          r"'nvidia_drm'"):
        load_config(str(path))
    path.write_text("modules: {optional: []}\n")
    assert load_config(str(path)).modules.optional == ()


@pytest.mark.parametrize("text, said", [
    # found by a newcomer: "at most 3600 s, not 3600" (the value was rounded for display)
    ("budget_s: 3600.0001\n", "budget_s: must be greater than 0 and at most 3600 s, not 3600.0001"),
    ("persistenced: {args: ['']}\n", "persistenced.args.0: must be a non-empty string, not an empty one"),
    # PyYAML reads 1e3 (no dot) as text, which said only "not a string"
    ("budget_s: 1e3\n", "budget_s: must be a number of seconds, not a string ('1e3': YAML reads it "
                        "as text"),
])
def test_a_bad_value_is_named_as_the_file_has_it(text, said, config_file):
    assert said in load_error(text, config_file)


# --- what a newcomer found (issue 21 items 5, 6, 7, 10) -------------------------------------------

@pytest.mark.parametrize("text, key, lines", [
    ("budget_s: 1\nbudget_s: 2\n", "budget_s", (1, 2)),
    ("persistenced:\n  per_gpu_s: 1\n  args: [a]\n  per_gpu_s: 3\n", "persistenced.per_gpu_s", (2, 4)),
    ("modules:\n  parameters:\n    nvidia: {NVreg_X: 1, NVreg_X: 2}\n",
     "modules.parameters.nvidia.NVreg_X", (3, 3)),
])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(config_file, text, key, lines):
    """PyYAML keeps the last of two equal keys silently: the image's author meant one of them."""
    message = load_error(text, config_file)

    assert f"{PATH}: {key}: duplicate key (lines {lines[0]} and {lines[1]})" in message, message


def test_a_duplicate_key_fails_compile_and_a_form_compiled_before_that_rule_is_stale(tmp_path):
    from podvm_gpu.config.load import COMPILED_FORMAT, compile_config

    path = tmp_path / "config.yaml"
    path.write_text("budget_s: 1\nbudget_s: 2\n")
    with pytest.raises(ConfigError, match="duplicate key"):
        compile_config(str(path))
    # what an older version wrote for the same text (PyYAML's last value): ignored now
    (tmp_path / "config.yaml.compiled.json").write_text(json.dumps(
        {"format": "podvm-gpu config, compiled, 1", "source": path.read_text(),
         "settings": {"budget_s": 2}}))
    assert COMPILED_FORMAT != "podvm-gpu config, compiled, 1"
    with pytest.raises(ConfigError, match="duplicate key"):
        load_config(str(path))


@pytest.mark.parametrize("written", ["1e400", "1e-320", "1.0e3", "1e3", "2E2", "-5e1", "36e2"])
def test_the_hint_for_a_number_yaml_reads_as_text_is_a_value_the_parser_accepts(config_file,
                                                                                written, fs):
    """``budget_s: 1.0e3`` was told "write it with a dot, as 1.0e3", which YAML 1.1 reads as
    text too (its float needs a signed exponent): every hint is fed back here."""
    message = load_error(f"budget_s: {written}\n", config_file)

    assert "YAML reads it as text" in message, message
    hint = re.search(r"write it as (\S+?)\)", message)
    if hint is None:  # 1e400: no float can hold it, and the message says so
        assert "beyond any float" in message
        return
    fed_back = yaml.safe_load(f"budget_s: {hint.group(1)}\n")["budget_s"]
    assert isinstance(fed_back, float) and fed_back == float(written)
    fs.create_file("/again.yaml", contents=f"budget_s: {hint.group(1)}\n")
    try:
        load_config("/again.yaml")
    except ConfigError as err:  # in range or not, it is a number now
        assert "YAML reads it as text" not in str(err) and "must be" in str(err), err


def test_a_whole_number_written_with_a_fraction_says_what_was_written(config_file):
    message = load_error("detect: {expected_gpus: 1.0}\n", config_file)

    assert "detect.expected_gpus: must be a whole number, not 1.0" in message, message


def test_a_bad_module_parameter_value_names_its_key_once(config_file):
    message = load_error("modules: {parameters: {nvidia: {NVreg_X: 'a b'}}}\n", config_file)

    assert message.count("NVreg_X") == 1, message
    assert "modules.parameters.nvidia.NVreg_X: must be one word" in message, message


@pytest.mark.parametrize("text, said", [
    # one form of a list item's path: the validator's persistenced.args.1, never args.[1]
    ("persistenced:\n  args: [1, {a: 1, a: 2}]\n", "persistenced.args.1.a: duplicate key"),
    ("persistenced:\n  args: [x, *b]\n", "not valid YAML: found undefined alias at line 2, column"),
])
def test_config_errors_name_list_items_one_way_and_never_pyyaml_s_unicode_string(tmp_path, text, said):
    """Issue 35 item 14: persistenced.args.[1] beside persistenced.args.1, and PyYAML's
    'in "<unicode string>"' in the message."""
    from podvm_gpu.config.load import load_config
    from podvm_gpu.errors import ConfigError

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path), required=True)
    assert said in str(err.value), err.value
    assert "[1]" not in str(err.value) and "<unicode string>" not in str(err.value)


# --- config --json's settings fed back (issue 35 item 5) -------------------------------------


def _settings(tmp_path, capsys, text: str | None) -> dict:
    from podvm_gpu.cli import main

    path = tmp_path / "etc/podvm-gpu/config.yaml"
    if text is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    code = main(["config", "--root", str(tmp_path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["valid"], doc
    return doc["settings"]


def _leaves(settings: dict, path=()):
    """Every key path of the settings down to a value that is not a section."""
    for key, value in settings.items():
        if isinstance(value, dict) and value and key not in ("timeouts", "tools", "parameters"):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def test_config_json_settings_are_a_config_that_gives_the_same_settings(tmp_path, capsys):
    """``config --json``'s settings, fed back whole as the config file (JSON is YAML), are
    valid and give the same settings; so is each key alone. An explicit ``null`` was refused
    for the five keys whose documented default is null: ``relying_party_policy: must be a
    non-empty string, not empty (and 4 more)``."""
    defaults = _settings(tmp_path, capsys, None)
    assert _settings(tmp_path, capsys, json.dumps(defaults)) == defaults
    nulls = []
    for path, value in _leaves(defaults):
        doc = value
        for key in reversed(path):
            doc = {key: doc}
        assert _settings(tmp_path, capsys, json.dumps(doc)) == defaults, path
        nulls += [".".join(path)] if value is None else []
    assert nulls == ["persistenced.per_gpu_s", "confidential_computing.relying_party_policy",
                     "confidential_computing.rim_dir", "confidential_computing.rim_url",
                     "confidential_computing.ocsp_url", "initdata.path"]


def test_null_is_taken_where_the_default_is_null(config_file):
    assert load_config(config_file("initdata:\n  path: null\n")).initdata.path is None


def test_null_is_refused_where_the_default_is_not_null(config_file):
    assert "budget_s: must be a number of seconds, not empty" in \
        load_error("budget_s: null\n", config_file)


@pytest.mark.parametrize("written", ['budget_s: "5"', "budget_s: '2.5'", 'budget_s: "-5"',
                                     'budget_s: ".5"', 'budget_s: "1_0"',
                                     'detect: {expected_gpus: "2"}',
                                     'timeouts: {modprobe: "3"}'])
def test_a_number_in_quotes_is_told_to_drop_the_quotes(config_file, written):
    """``budget_s: "5"`` was told "write it as 5.0", as if the 5 were the problem: it is a
    string because it is quoted. The hint is the key and value as they should be written,
    and fed back it is a number."""
    message = load_error(written + "\n", config_file)
    value = written.rpartition(": ")[2].strip("}").strip("'\"")
    hint = re.search(r'\("(.+)" is quoted; write it without quotes: (\S+): (\S+)\)$', message)
    assert hint and hint.group(1) == value == hint.group(3), message
    assert "YAML reads it as text" not in message and "write it as" not in message, message
    fed_back = yaml.safe_load(f"{hint.group(2)}: {hint.group(3)}\n")[hint.group(2)]
    assert isinstance(fed_back, (int, float)) and not isinstance(fed_back, bool), fed_back


@pytest.mark.parametrize("written", ['detect: {expected_gpus: "2.0"}', 'budget_s: "."',
                                     'budget_s: ".inf"', 'budget_s: "five"'])
def test_text_that_is_no_such_number_when_unquoted_gets_no_quotes_hint(config_file, written):
    """Without its quotes 2.0 is no whole number, ``.`` text, ``.inf`` no finite one."""
    message = load_error(written + "\n", config_file)
    assert "is quoted" not in message and "must be" in message, message


@pytest.mark.parametrize("section", ["persistenced", "detect", "confidential_computing"])
@pytest.mark.parametrize("written", ["null", "", "~"])
def test_a_section_given_as_null_is_said_to_be_null_not_empty(config_file, section, written):
    """``persistenced: null`` said "must be a mapping of settings, not empty": the section is
    null, and the way to its defaults is to leave it out (``metrics: null`` alone is the
    defaults: the exporter's own rule, docs/interface.md 7)."""
    message = load_error(f"{section}: {written}\n", config_file)
    assert message.endswith(f"{section}: must be a mapping of settings, not null (leave "
                            f"{section} out, or write {section}: {{}}, for its defaults)"), message
    os.unlink(PATH)
    assert load_config(config_file(f"{section}: {{}}\n")) == Config()


def test_the_watch_interval_has_a_floor_of_a_tenth_of_a_second(config_file):
    """Issue 47 item 16: ``watch.interval_s: 0.001`` ran nvidia-smi back to back."""
    assert "watch.interval_s: must be at least 0.1" in load_error(
        "watch:\n  interval_s: 0.001\n", config_file)


def test_the_watch_interval_floor_itself_is_taken(config_file):
    assert load_config(config_file("watch:\n  interval_s: 0.1\n")).watch.interval_s == 0.1


@pytest.mark.parametrize("text, words", [
    ("budget_S: 30\n", "budget_S: unknown key (did you mean budget_s?)"),
    ("watch:\n  intervall_s: 3\n", "watch.intervall_s: unknown key (did you mean interval_s?)"),
    ("metrics:\n  profil: full\n", "metrics.profil: unknown key (did you mean profile?)"),
    ("zzzzzz: 1\n", "zzzzzz: unknown key")])
def test_an_unknown_key_suggests_the_nearest_known_one(config_file, text, words):
    """Issue 47 item 20: ``budget_S: unknown key`` gave no suggestion; none where none is near."""
    said = load_error(text, config_file)
    assert said.endswith(words), said


def test_a_nul_byte_in_the_config_is_said_in_the_agents_words_with_line_and_column(config_file):
    """Issue 47 item 23: PyYAML's ``... not allowed in "<unicode string>", position 13``."""
    said = load_error("budget_s: 30\nx\x00: 1\n", config_file)
    assert said.endswith("not valid YAML: a NUL character (\\x00) at line 2, column 2: YAML "
                         "takes no control characters"), said
    assert "unicode string" not in said and "position" not in said
