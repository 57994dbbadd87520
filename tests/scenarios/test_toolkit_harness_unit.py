"""The harness's nvidia-ctk and nvidia-cdi-hook by version (toolkit_ctk.py, issue 36), held to
the real builds' words (../shared/nvidia-ctk-real.md, 1.17.8 against 1.20.0) and to the real
1.20.0 spec of tests/data/real/h200-580."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import toolkit_ctk as tk

REAL_SPEC = Path(__file__).resolve().parents[1] / \
    "data/real/h200-580/nvidia-ctk-1.20.0-cdi-generate.json"
GENERATE = ["nvidia-ctk", "cdi", "generate", "--mode=nvml", "--format=json"]


def hook_names(text: str) -> list[str]:
    spec = json.loads(text)
    return [h["args"][1] for h in spec["containerEdits"].get("hooks", [])]


def test_versions_default_to_1_20_0_and_take_one_or_each_binary():
    assert tk.versions(None) == {"nvidia-ctk": "1.20.0", "nvidia-cdi-hook": "1.20.0"}
    assert tk.versions("1.17.8") == {"nvidia-ctk": "1.17.8", "nvidia-cdi-hook": "1.17.8"}
    assert tk.versions({"nvidia-cdi-hook": "1.17.8"})["nvidia-ctk"] == "1.20.0"
    for bad in ("1.17", {"nvidia-smi": "1.0.0"}, 1.17):
        with pytest.raises(ValueError):
            tk.versions(bad)


@pytest.mark.parametrize("version, line", [
    ("1.20.0", "NVIDIA Container Toolkit CLI version 1.20.0"),
    ("1.17.8", "NVIDIA Container Toolkit CLI version 1.17.8")])
def test_version_is_the_real_first_line(version, line):
    rc, out, _err = tk.ctk_answer(["nvidia-ctk", "--version"], version)
    assert rc == 0 and out.splitlines()[0] == line


def test_1_17_8_refuses_the_flags_and_the_mode_of_1_18_as_the_real_build():
    assert tk.ctk_answer(GENERATE + ["--disable-hook=all"], "1.17.8")[::2] == (
        1, 'level=error msg="flag provided but not defined: -disable-hook"\n')
    # the agent's IMEX argv: 1.17.8 has --class and refuses the mode (the real build, run)
    assert tk.ctk_answer(["nvidia-ctk", "cdi", "generate", "--mode=imex", "--class=imex-channel",
                          "--format=json"], "1.17.8") == (
        1, "", 'level=error msg="invalid discovery mode: imex"\n')
    assert tk.ctk_answer(GENERATE + ["--enable-hook=chmod"], "1.17.8")[2].endswith(
        '"flag provided but not defined: -enable-hook"\n')
    assert tk.ctk_answer(GENERATE + ["--disable-hook=all"], "1.20.0") is None
    assert tk.ctk_answer(GENERATE, "1.17.8") is None  # a rule answers it


def test_the_hook_binary_refuses_what_its_version_lacks_with_exit_3():
    argv = ["nvidia-cdi-hook", "disable-device-node-modification", "--help"]
    assert tk.hook_answer(argv, "1.17.8") == (
        3, "", "No help topic for 'disable-device-node-modification'\n")
    assert tk.hook_answer(argv, "1.20.0")[0] == 0
    assert tk.hook_answer(["nvidia-cdi-hook", "update-ldcache", "--help"], "1.17.8")[0] == 0
    assert tk.hook_answer(["nvidia-cdi-hook", "--version"], "1.17.8")[1].startswith(
        "NVIDIA CDI Hook version 1.17.8\n")


def test_the_real_spec_keeps_every_hook_on_1_20_and_loses_the_new_ones_on_1_17_8():
    text = REAL_SPEC.read_text()
    assert tk.filter_spec(text, GENERATE, "1.20.0") is text  # unchanged, byte for byte
    assert hook_names(tk.filter_spec(text, GENERATE, "1.17.8")) == [
        "create-symlinks", "create-symlinks", "enable-cuda-compat", "update-ldcache"]


def test_disable_hook_takes_its_hooks_out_and_all_takes_every_hook():
    text = REAL_SPEC.read_text()
    out = tk.filter_spec(text, GENERATE + ["--disable-hook=disable-device-node-modification"],
                         "1.20.0")
    assert "disable-device-node-modification" not in hook_names(out)
    assert "update-application-profile" in hook_names(out)
    assert "hooks" not in json.loads(tk.filter_spec(text, GENERATE + ["--disable-hook=all"],
                                                    "1.20.0"))["containerEdits"]


FIXTURES = Path(__file__).resolve().parents[1] / "data/fixtures/nvidia-ctk"


def capture(name: str) -> tuple[list[str], int, str, str]:
    """(argv, exit, stderr, stdout) of a capture of the real binaries (README there)."""
    text = (FIXTURES / name).read_text()
    argv = text.split("# argv: ", 1)[1].split("\n", 1)[0].split()
    rc = int(text.split("# exit: ", 1)[1].split("\n", 1)[0])
    err, out = text.split("# stderr:\n", 1)[1].split("# stdout:\n", 1)
    return argv, rc, err, out


@pytest.mark.parametrize("name, version", [
    ("version-1.17.8.txt", "1.17.8"), ("version-1.20.0.txt", "1.20.0"),
    ("hook-version-1.17.8.txt", "1.17.8"), ("generate-1.17.8-imex.txt", "1.17.8"),
    ("generate-1.17.8-disable-hook.txt", "1.17.8"),
    ("hook-1.17.8-disable-device-node-modification.txt", "1.17.8"),
    ("hook-1.17.8-update-application-profile.txt", "1.17.8")])
def test_the_stand_ins_answer_as_the_real_builds_did(name, version):
    """Exit status and stderr as captured; stdout's first line (the version line, the usage
    line; the help text after it is not played)."""
    argv, rc, err, out = capture(name)
    answer = tk.ctk_answer(argv, version) if argv[0] == "nvidia-ctk" else \
        tk.hook_answer(argv, version)
    assert answer[0] == rc and answer[2] == err, answer
    assert answer[1].split("\n", 1)[0] == out.split("\n", 1)[0]
    if name.startswith("version") or name.startswith("hook-version"):  # whole but the commit
        assert answer[1].split("commit:")[0] == out.split("commit:")[0]


# --- issue 42: each release's parser, and the hook binary's own list --------------------------

HELP = Path(__file__).resolve().parents[1] / "data/real/nvidia-ctk-help"
NEEDS = "flag needs an argument: --output="


@pytest.mark.parametrize("version", ["1.18.2", "1.19.1"])
def test_an_empty_output_last_is_refused_by_1_18_and_1_19(version):
    rc, _out, err = tk.ctk_answer(GENERATE + ["--output="], version)
    assert (rc, err) == (1, f'Incorrect Usage: {NEEDS}\n\nlevel=error msg="{NEEDS}"\n')


def test_1_19_refuses_it_anywhere_and_1_18_takes_the_next_word(tmp_path, monkeypatch):
    roots = ["--driver-root=/w", "--dev-root=/w"]
    assert tk.ctk_answer(GENERATE + ["--output=", *roots], "1.19.1")[0] == 1
    rc, _out, err = tk.ctk_answer(GENERATE + ["--output=", *roots], "1.18.2")
    assert rc == 1 and "ERROR_LIBRARY_NOT_FOUND" in err
    monkeypatch.chdir(tmp_path)
    assert tk.ctk_answer(GENERATE + ["--output=", "--disable-hook=chmod"], "1.18.2") == (0, "", "")
    assert (tmp_path / "--disable-hook=chmod.json").exists()  # as the real 1.18.2 did
    for version in ("1.17.8", "1.20.0"):  # empty, the spec on stdout: a rule answers
        assert tk.empty_output(GENERATE + ["--output=", *roots], version) is None
    assert tk.ctk_answer(GENERATE + roots, "1.19.1") is None  # the agent's argv: no --output


@pytest.mark.parametrize("version", ["1.17.8", "1.18.2", "1.19.1", "1.20.0"])
def test_the_help_lists_the_real_builds_commands_in_their_shape(version):
    rc, out, _err = tk.hook_answer(["nvidia-cdi-hook", "--help"], version)
    real = (HELP / f"{version}-nvidia-cdi-hook--help.txt").read_text()
    commands = [line for line in real.split("COMMANDS:\n")[1].split("\n\n")[0].splitlines()]
    assert rc == 0 and out.split("COMMANDS:\n")[1].split("\n\n")[0].splitlines() == commands
    assert f"VERSION:\n   {version}\n" in out
    real_ctk = (HELP / f"{version}-nvidia-ctk-hook--help.txt").read_text()
    rc, out, _err = tk.ctk_answer(["nvidia-ctk", "hook", "--help"], version)
    assert out.split("COMMANDS:\n")[1].split("\n\n")[0] == \
        real_ctk.split("COMMANDS:\n")[1].split("\n\n")[0]


@pytest.mark.parametrize("version, rc", [("1.17.8", 3), ("1.18.2", 0), ("1.19.1", 0),
                                         ("1.20.0", 0)])
def test_a_hook_the_version_lacks_is_refused_before_1_18_and_warned_after(version, rc):
    got = tk.hook_answer(["nvidia-cdi-hook", "update-application-profile", "--help"], version)
    real = (HELP / f"{version}-nvidia-cdi-hook-update-application-profile--help.txt").read_text()
    assert got[0] == rc
    if version in ("1.18.2", "1.19.1"):
        assert got[2] in real and "Unsupported CDI hook: update-application-profile" in real
