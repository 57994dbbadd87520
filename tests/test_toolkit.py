"""nvidia-ctk's version and the spec's hooks (podvm_gpu/steps/cdi/toolkit.py, issue 36): the
version read once and recorded, IMEX and ``cdi.disable_hooks`` refused before nvidia-ctk runs
when it is older than 1.18.0, each hook binary the spec names asked for its own list (its
``--help`` COMMANDS, issue 42: from 1.18.0 an unknown hook only warns) and, before 1.18.0, once
per hook name (the real 1.20.0 spec of tests/data/real/h200-580); a hook missing from the list or
refused failing the step naming the hook, the binary's version and nvidia-ctk's. The words of
the real programs: ../shared/nvidia-ctk-real.md, tests/data/real/nvidia-ctk-help. Boot-level:
C70-C75, P30-P33."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from podvm_gpu import nvidia_ctk
from podvm_gpu.cdi.parse import parse_spec
from podvm_gpu.config.load import ConfigError, parse_config
from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Completed, Runner
from podvm_gpu.model import Status
from podvm_gpu.steps.cdi import step, toolkit
from podvm_gpu.steps.context import BootContext

DATA = Path(__file__).parent / "data"
REAL_SPEC = DATA / "real/h200-580/nvidia-ctk-1.20.0-cdi-generate.json"
# the real programs' words (nvidia-ctk-real.md: 1.17.8 against 1.20.0)
CTK_1_20 = "NVIDIA Container Toolkit CLI version 1.20.0\ncommit: 1d1bd5a\n"
CTK_1_17 = "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80\n"
HOOKS_1_17 = ("update-ldcache", "create-symlinks", "chmod", "enable-cuda-compat")


class Tools:
    """A runner that answers ``nvidia-ctk --version`` with ``version`` (None: exit 1) and
    refuses the generation (the tests stop there or look at what was asked)."""

    def __init__(self, version: str | None):
        self.version, self.ran, self.timeouts = version, [], {}

    def run(self, argv, check=True, timeout=None, **_):
        self.ran.append(list(argv))
        if argv == nvidia_ctk.VERSION_ARGV:
            if self.version is None:
                raise CommandError(argv, 1, "", 'level=error msg="flag provided but not '
                                   'defined: -version"\n')
            return Completed(argv, 0, self.version, "", 0.01)
        raise CommandError(argv, 1, "", 'level=error msg="stop here"\n')


def context(tmp_path, config: str = "", runner=None) -> BootContext:
    return BootContext(Root(str(tmp_path)), parse_config(config, "config.yaml"),
                       runner or Tools(CTK_1_20), Status(), time.monotonic() + 60)


# --- the version ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, version", [
    (CTK_1_20, "1.20.0"), (CTK_1_17, "1.17.8"),
    ("NVIDIA CDI Hook version 1.17.8\ncommit: f202b80\n", "1.17.8"),
    ("NVIDIA Container Toolkit CLI version 1.19.0-rc.1\n", "1.19.0-rc.1"),
    ("NVIDIA Container Toolkit CLI version unknown\ncommit: unknown\n", None),  # no -X version
    ("", None)])
def test_the_version_line_is_read_as_urfave_cli_prints_it(text, version):
    found = nvidia_ctk.parse_version(text)
    assert (found.text if found else None) == version


def test_the_version_is_read_once_and_recorded_in_the_status(tmp_path):
    ctx = context(tmp_path)
    with pytest.raises(StepFailed, match="stop here"):
        step.generate(ctx)
    assert ctx.status.nvidia_ctk_version == "1.20.0"
    assert ctx.status.to_dict()["nvidia_ctk_version"] == "1.20.0"
    assert [a for a in ctx.runner.ran if a == nvidia_ctk.VERSION_ARGV] == [nvidia_ctk.VERSION_ARGV]
    assert ctx.runner.ran[1][:3] == ["nvidia-ctk", "cdi", "generate"]


def test_an_unreadable_version_is_a_warning_and_the_features_are_tried(tmp_path):
    ctx = context(tmp_path, "cdi: {disable_hooks: [disable-device-node-modification]}\n",
                  Tools(None))
    with pytest.raises(StepFailed, match="stop here"):
        step.generate(ctx)
    assert ctx.status.nvidia_ctk_version is None
    assert any("nvidia-ctk --version: exit 1: flag provided but not defined" in w
               and "tried" in w for w in ctx.status.warnings), ctx.status.warnings
    assert "--disable-hook=disable-device-node-modification" in ctx.runner.ran[1]


@pytest.mark.parametrize("config, feature", [
    ("imex: {channels: [0]}\n", "IMEX channels (cdi generate --mode=imex)"),
    ("cdi: {disable_hooks: [all]}\n", "cdi.disable_hooks (cdi generate --disable-hook)")])
def test_1_17_8_with_a_feature_of_1_18_fails_before_nvidia_ctk_generates(tmp_path, config,
                                                                           feature):
    ctx = context(tmp_path, config, Tools(CTK_1_17))
    with pytest.raises(StepFailed) as err:
        step.generate(ctx)
    assert str(err.value).startswith(f"{feature} needs nvidia-ctk 1.18.0 or later; this image "
                                     "has nvidia-ctk 1.17.8")
    assert ctx.runner.ran == [nvidia_ctk.VERSION_ARGV]  # never nvidia-ctk's own error


def test_both_features_on_1_17_8_name_the_first_and_count_the_other(tmp_path):
    ctx = context(tmp_path, "imex: {channels: [0]}\ncdi: {disable_hooks: [all]}\n",
                  Tools(CTK_1_17))
    with pytest.raises(StepFailed, match=r"has nvidia-ctk 1\.17\.8 \(and cdi.disable_hooks\)"):
        step.generate(ctx)


def test_1_18_0_and_later_take_both_features(tmp_path):
    ctx = context(tmp_path, "imex: {channels: [0]}\ncdi: {disable_hooks: [all]}\n",
                  Tools("NVIDIA Container Toolkit CLI version 1.18.0\n"))
    with pytest.raises(StepFailed, match="stop here"):
        step.generate(ctx)


# --- cdi.disable_hooks ------------------------------------------------------------------------

def test_disable_hooks_are_passed_in_order_as_flags_of_the_generation(tmp_path):
    ctx = context(tmp_path, "cdi: {disable_hooks: [update-application-profile, "
                            "disable-device-node-modification]}\n")
    assert nvidia_ctk.generate_nvml_argv(ctx.root, ctx.config.cdi.disable_hooks)[5:7] == [
        "--disable-hook=update-application-profile", "--disable-hook=disable-device-node-modification"]
    assert context(tmp_path).config.cdi.disable_hooks == ()
    default = context(tmp_path)
    assert "--disable-hook" not in " ".join(nvidia_ctk.generate_nvml_argv(default.root,
                                                                          default.config.cdi.disable_hooks))


@pytest.mark.parametrize("value, words", [
    ("[bogus]", "cdi.disable_hooks.0: must be one of all, chmod, create-symlinks"),
    ("[all, all]", "cdi.disable_hooks: hook all is listed twice"),
    ("all", "cdi.disable_hooks: must be a list of hook names, not a string"),
    ("[1]", "cdi.disable_hooks.0: must be a non-empty string, not an integer")])
def test_bad_disable_hooks_are_refused_by_key(value, words):
    with pytest.raises(ConfigError) as err:
        parse_config(f"cdi: {{disable_hooks: {value}}}\n", "c.yaml")
    assert words in str(err.value)


# --- the hooks of a spec ----------------------------------------------------------------------

def test_the_hook_names_of_the_real_1_20_0_spec_are_args_1_once_each():
    spec = parse_spec(REAL_SPEC.read_text(), source="real")
    asked = nvidia_ctk.hooks_to_ask(spec)
    assert [name for _path, name in asked] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache",
        "disable-device-node-modification", "update-application-profile"]
    assert all(middle == [] for middle in asked.values())


def test_under_nvidia_ctk_hook_the_name_is_args_2():
    raw = json.loads(REAL_SPEC.read_text())
    for hook in raw["containerEdits"]["hooks"]:
        hook["path"] = "/usr/bin/nvidia-ctk"
        hook["args"] = ["nvidia-ctk", "hook", *hook["args"][1:]]
    asked = nvidia_ctk.hooks_to_ask(parse_spec(json.dumps(raw), source="t"))
    assert ("/usr/bin/nvidia-ctk", "disable-device-node-modification") in asked
    assert set(map(tuple, asked.values())) == {("hook",)}


HELP = DATA / "real/nvidia-ctk-help"


def help_text(version: str, known, with_version: bool = True) -> str:
    """``--help`` in the shape of the real builds' (tests/data/real/nvidia-ctk-help)."""
    width = max(len(n) for n in (*known, "help, h")) + 2
    lines = ["NAME:", "   NVIDIA CDI Hook - Command to structure files", ""]
    if with_version:
        lines += ["VERSION:", f"   {version}", "commit: 0123abc", ""]
    lines += ["COMMANDS:", *[f"   {n.ljust(width)}does {n}" for n in (*known, "help, h")], "",
              "GLOBAL OPTIONS:", "   --help, -h     show help", ""]
    return "\n".join(lines)


def hook_binary(root: Path, path: str, version: str, known=HOOKS_1_17,
                help_version: bool = True) -> None:
    """A hook binary that answers as NVIDIA's does: ``--help`` its COMMANDS (and VERSION);
    ``<name> --help`` exit 0 for a name it knows, else before 1.18.0 exit 3 ``No help topic for
    '<name>'``, from 1.18.0 a warning and exit 0; ``--version`` its version line; as
    ``nvidia-ctk`` (a path ending so), ``hook ...`` the same."""
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    listing = target.parent / f".{target.name}.help"
    listing.write_text(help_text(version, known, help_version))
    unknown = ("echo \"No help topic for '$1'\" >&2\nexit 3\n"
               if nvidia_ctk.parse_version(f"version {version}").number < nvidia_ctk.SINCE_1_18 else
               "echo \"level=warning msg=\\\"Unsupported CDI hook: $1\\\"\" >&2\nexit 0\n")
    target.write_text("#!/bin/sh\n"
                      f'[ "$1" = --version ] && {{ echo "NVIDIA CDI Hook version {version}"; exit 0; }}\n'
                      '[ "$1" = hook ] && shift\n'
                      f'[ "$1" = --help ] && {{ {shutil.which("cat")} "{listing}"; exit 0; }}\n'
                      f'case "$1" in {"|".join(known)}) exit 0;; esac\n' + unknown)
    os.chmod(target, 0o755)


def real_spec_at(path: str):
    raw = json.loads(REAL_SPEC.read_text())
    for hook in raw["containerEdits"]["hooks"]:
        hook["path"] = path
    return parse_spec(json.dumps(raw), source="t")


def test_a_hook_the_root_s_binary_refuses_fails_naming_it_and_both_versions(tmp_path):
    hook_binary(tmp_path, "/usr/bin/nvidia-cdi-hook", "1.17.8")
    ctx = context(tmp_path, runner=Runner())
    with pytest.raises(StepFailed) as err:
        toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"),
                            nvidia_ctk.parse_version(CTK_1_20))
    said = str(err.value)
    assert said.startswith("the spec names hook disable-device-node-modification, which "
                           "/usr/bin/nvidia-cdi-hook (nvidia-cdi-hook 1.17.8) does not know "
                           "(exit 3: No help topic for 'disable-device-node-modification')")
    assert "nvidia-ctk 1.20.0" in said and "cdi.disable_hooks" in said
    binary = str(tmp_path / "usr/bin/nvidia-cdi-hook")
    asked = sorted(argv[1] for argv in ctx.runner.calls if argv[0] == binary and
                   argv[2:] == ["--help"])
    assert asked == sorted(["create-symlinks", "enable-cuda-compat", "update-ldcache",
                            "disable-device-node-modification", "update-application-profile"])
    # its list first (the version in its help: 1.17.8, so each name is asked too), once each
    assert ctx.runner.calls.count([binary, "--help"]) == 1


@pytest.mark.parametrize("version", ["1.17.8", "1.18.2", "1.19.1", "1.20.0"])
def test_the_real_builds_help_gives_their_hooks_and_version(version):
    """What each real hook binary says of itself is what the version table says it has."""
    text = (HELP / f"{version}-nvidia-cdi-hook--help.txt").read_text()
    got = nvidia_ctk.help_version(text)
    assert got is not None and got.text == version
    assert nvidia_ctk.parse_commands(text) == nvidia_ctk.hooks_of(got.number)
    under_ctk = (HELP / f"{version}-nvidia-ctk-hook--help.txt").read_text()
    assert nvidia_ctk.parse_commands(under_ctk) == nvidia_ctk.hooks_of(got.number)
    assert nvidia_ctk.help_version(under_ctk) is None  # nvidia-ctk hook --help: no VERSION


def test_the_version_table_has_each_hook_where_the_real_builds_have_it():
    assert nvidia_ctk.written_hooks((1, 17, 8)) == ("update-ldcache", "create-symlinks",
                                                 "enable-cuda-compat")
    assert nvidia_ctk.written_hooks((1, 19, 1)) == nvidia_ctk.written_hooks((1, 18, 2)) == (
        "update-ldcache", "create-symlinks", "enable-cuda-compat",
        "disable-device-node-modification")
    assert "update-application-profile" in nvidia_ctk.written_hooks((1, 20, 0))
    assert nvidia_ctk.parse_commands("NAME:\n   x\n") is None  # no COMMANDS section


@pytest.mark.parametrize("version", ["1.18.2", "1.19.1"])
def test_a_hook_missing_from_a_1_18_binary_s_list_fails_naming_it(tmp_path, version):
    """1.18 and 1.19 answer ``update-application-profile --help`` with a warning and exit 0
    (tests/data/real/nvidia-ctk-help): only their list shows they lack it."""
    hook_binary(tmp_path, "/usr/bin/nvidia-cdi-hook", version,
                HOOKS_1_17 + ("disable-device-node-modification",))
    ctx = context(tmp_path, runner=Runner())
    with pytest.raises(StepFailed) as err:
        toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"),
                            nvidia_ctk.parse_version(CTK_1_20))
    said = str(err.value)
    assert said.startswith("the spec names hook update-application-profile, which "
                           f"/usr/bin/nvidia-cdi-hook (nvidia-cdi-hook {version}) does not have "
                           "(its --help lists update-ldcache, create-symlinks, chmod, "
                           "enable-cuda-compat, disable-device-node-modification)"), said
    assert "containers would start without it" in said and "nvidia-ctk 1.20.0" in said
    binary = str(tmp_path / "usr/bin/nvidia-cdi-hook")
    assert ctx.runner.calls == [[binary, "--help"]]  # no name asked: its answer says nothing


def test_under_nvidia_ctk_hook_the_list_is_its_hook_help_and_the_version_its_own(tmp_path):
    hook_binary(tmp_path, "/usr/bin/nvidia-ctk", "1.18.2",
                HOOKS_1_17 + ("disable-device-node-modification",), help_version=False)
    raw = json.loads(REAL_SPEC.read_text())
    for hook in raw["containerEdits"]["hooks"]:
        hook["path"], hook["args"] = "/usr/bin/nvidia-ctk", ["nvidia-ctk", "hook",
                                                             *hook["args"][1:]]
    ctx = context(tmp_path, runner=Runner())
    with pytest.raises(StepFailed, match=r"^the spec names hook update-application-profile, "
                       r"which /usr/bin/nvidia-ctk \(nvidia-ctk 1.18.2\) does not have \(its "
                       "hook --help lists"):
        toolkit.check_hooks(ctx, parse_spec(json.dumps(raw), source="t"), None)
    binary = str(tmp_path / "usr/bin/nvidia-ctk")
    assert ctx.runner.calls == [[binary, "hook", "--help"], [binary, "--version"]]


def test_a_binary_of_unknown_version_is_asked_by_name_and_its_list_still_decides(tmp_path):
    # no VERSION in its help, a --version without one: both checks run; the names answer 0
    target = tmp_path / "usr/bin/nvidia-cdi-hook"
    target.parent.mkdir(parents=True)
    help_file = tmp_path / "help.txt"
    help_file.write_text(help_text("", HOOKS_1_17, with_version=False))
    target.write_text(f"#!/bin/sh\n[ \"$1\" = --help ] && exec {shutil.which('cat')} "
                      f"{help_file}\nexit 0\n")
    target.chmod(0o755)
    ctx = context(tmp_path, runner=Runner())
    with pytest.raises(StepFailed, match=r"disable-device-node-modification, which "
                       r"/usr/bin/nvidia-cdi-hook \(nvidia-cdi-hook, version unknown\) does "
                       "not have"):
        toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"), None)
    assert len(asked_names(ctx, str(target))) == 5


def test_a_1_20_binary_whose_list_holds_every_hook_passes_with_one_call(tmp_path):
    hook_binary(tmp_path, "/usr/bin/nvidia-cdi-hook", "1.20.0",
                HOOKS_1_17 + ("disable-device-node-modification", "update-application-profile"))
    ctx = context(tmp_path, runner=Runner())
    assert toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"), None) == 5
    assert ctx.runner.calls == [[str(tmp_path / "usr/bin/nvidia-cdi-hook"), "--help"]]


def test_a_hook_binary_that_does_not_answer_in_time_fails_the_check(tmp_path):
    target = tmp_path / "usr/bin/nvidia-cdi-hook"
    target.parent.mkdir(parents=True)
    target.write_text("#!/bin/sh\nexec sleep 30\n")
    os.chmod(target, 0o755)
    ctx = context(tmp_path, "timeouts: {nvidia-ctk: 0.3}\n", runner=Runner())
    ctx.runner.timeouts = {"nvidia-ctk": 0.3}
    started = time.monotonic()
    with pytest.raises(StepFailed, match="hook create-symlinks could not be checked: "
                                         "/usr/bin/nvidia-cdi-hook did not answer"):
        toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"), None)
    assert time.monotonic() - started < 5


def test_a_hung_version_query_is_cut_at_its_timeout_and_only_warns(tmp_path):
    """A stuck ``nvidia-ctk --version`` costs at most its bound (the harmless-call time, cut
    to the tool's timeout), then the boot goes on: a warning, no version."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ctk = bin_dir / "nvidia-ctk"
    ctk.write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 30\n")
    ctk.chmod(0o755)
    runner = Runner(timeouts={"nvidia-ctk": 0.5}, env={"PATH": str(bin_dir)})
    ctx = context(tmp_path, runner=runner)
    started = time.monotonic()
    assert toolkit.read_version(ctx) is None
    assert time.monotonic() - started < 5
    assert ctx.status.nvidia_ctk_version is None
    assert any(w.startswith("cdi: nvidia-ctk --version: ") and "timed out" in w
               for w in ctx.status.warnings), ctx.status.warnings


def test_a_boot_that_ends_during_the_hook_check_raises_in_the_step_s_thread(tmp_path,
                                                                           monkeypatch):
    """A signal or another step's failure cancels the runner while the hook check asks: the
    Cancelled of the asking threads is raised by the check itself, never left unhandled in a
    helper thread (it printed a Traceback on boot's stderr: test_boot_ends, SIGTERM during the
    confidential-computing step with cdi in flight)."""
    import threading

    from podvm_gpu.errors import Cancelled

    class Cancelling:
        timeouts: dict = {}

        def run(self, argv, **_):
            raise Cancelled("SIGTERM")

    unhandled = []
    monkeypatch.setattr(threading, "excepthook", unhandled.append)
    ctx = context(tmp_path, runner=Cancelling())
    with pytest.raises(Cancelled):
        toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"), None)
    assert unhandled == []


def test_the_hook_binary_gets_only_the_environment_nvidia_ctk_gets(tmp_path):
    """nvidia-cdi-hook is a urfave/cli program as nvidia-ctk is (every flag can come from a
    variable): run by its absolute path it gets PATH, LD_LIBRARY_PATH, LD_PRELOAD and
    LC_ALL=C only."""
    seen = tmp_path / "env.txt"
    target = tmp_path / "usr/bin/nvidia-cdi-hook"
    target.parent.mkdir(parents=True)
    target.write_text(f"#!/bin/sh\n{shutil.which('env')} >> {seen}\nexit 0\n")
    target.chmod(0o755)
    runner = Runner(env={"PATH": "/usr/bin:/bin", "NVIDIA_CTK_DEBUG": "true",
                         "NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS": "all", "HOME": "/root"})
    ctx = context(tmp_path, runner=runner)
    toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"), None)
    names = {line.split("=", 1)[0] for line in seen.read_text().splitlines()}
    assert names <= {"PATH", "LC_ALL", "PWD", "SHLVL", "_"}, names  # sh adds PWD, SHLVL, _
    assert "NVIDIA_CTK_DEBUG" not in names and "HOME" not in names


# --- asked while the generation runs (issue 38) -------------------------------------------------

HOOKS_1_20 = HOOKS_1_17 + ("disable-device-node-modification", "update-application-profile")


def asked_names(ctx, binary: str) -> list[str]:
    return sorted(argv[1] for argv in ctx.runner.calls if argv[0] == binary and
                  argv[2:] == ["--help"])


def listed(ctx, binary: str) -> int:
    return ctx.runner.calls.count([binary, "--help"])


@pytest.mark.parametrize("ctk, config, expected, lists", [
    (CTK_1_20, "", (), 1),  # 1.18 and later: the list decides, no name is asked
    # P30: 1.17.8's spec names its three hooks; a 1.17 binary refuses by name
    (CTK_1_17, "", ("create-symlinks", "enable-cuda-compat", "update-ldcache"), 1),
    (CTK_1_17, "cdi: {disable_hooks: [update-ldcache]}\n", ("create-symlinks",
                                                            "enable-cuda-compat"), 1),
    (CTK_1_20, "cdi: {disable_hooks: [all]}\n", (), 0),  # --disable-hook=all: no hook
    (None, "", (), 0)])  # the version unknown: nothing foreseen, the check asks after the spec
def test_the_list_and_for_1_17_the_names_are_asked_while_the_generation_runs(
        tmp_path, ctk, config, expected, lists):
    hook_binary(tmp_path, "/usr/bin/nvidia-cdi-hook", "1.20.0", HOOKS_1_20)
    ctx = context(tmp_path, config, runner=Runner())
    toolkit.start_hook_asks(ctx, nvidia_ctk.parse_version(ctk) if ctk else None)
    for early in list(ctx.early.values()):
        early.result()
    binary = str(tmp_path / "usr/bin/nvidia-cdi-hook")
    assert asked_names(ctx, binary) == sorted(expected)
    assert listed(ctx, binary) == lists


def test_the_check_takes_the_early_answers_and_asks_nothing_twice(tmp_path):
    # nvidia-ctk 1.17.8 foresaw its three hooks by name and the list; the binary is 1.20.0,
    # so its list decides all five and nothing more is asked after the generation
    hook_binary(tmp_path, "/usr/bin/nvidia-cdi-hook", "1.20.0", HOOKS_1_20)
    ctx = context(tmp_path, runner=Runner())
    toolkit.start_hook_asks(ctx, nvidia_ctk.parse_version(CTK_1_17))
    for early in list(ctx.early.values()):
        early.result()
    before = len(ctx.runner.calls)
    assert toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"), None) == 5
    assert len(ctx.runner.calls) == before == 4
    assert ctx.early == {}


def test_a_1_17_binary_is_asked_after_the_generation_what_1_20_did_not_foresee(tmp_path):
    hook_binary(tmp_path, "/usr/bin/nvidia-cdi-hook", "1.17.8")
    raw = json.loads(REAL_SPEC.read_text())
    raw["containerEdits"]["hooks"] = [dict(h, path="/usr/bin/nvidia-cdi-hook")
                                      for h in raw["containerEdits"]["hooks"]
                                      if h["args"][1] in HOOKS_1_17]
    ctx = context(tmp_path, runner=Runner())
    toolkit.start_hook_asks(ctx, nvidia_ctk.parse_version(CTK_1_20))
    assert toolkit.check_hooks(ctx, parse_spec(json.dumps(raw), source="t"), None) == 3
    binary = str(tmp_path / "usr/bin/nvidia-cdi-hook")
    assert asked_names(ctx, binary) == ["create-symlinks", "enable-cuda-compat",
                                        "update-ldcache"]
    assert listed(ctx, binary) == 1 and ctx.early == {}


def test_an_early_refusal_fails_the_check_as_a_late_one_would(tmp_path):
    hook_binary(tmp_path, "/usr/bin/nvidia-cdi-hook", "1.17.8")
    ctx = context(tmp_path, runner=Runner())
    toolkit.start_hook_asks(ctx, nvidia_ctk.parse_version(CTK_1_20))
    with pytest.raises(StepFailed, match="^the spec names hook disable-device-node-modification, "
                                         r"which /usr/bin/nvidia-cdi-hook \(nvidia-cdi-hook "
                                         "1.17.8\\) does not know"):
        toolkit.check_hooks(ctx, real_spec_at("/usr/bin/nvidia-cdi-hook"),
                            nvidia_ctk.parse_version(CTK_1_20))


def test_a_hook_elsewhere_is_asked_after_the_generation(tmp_path):
    hook_binary(tmp_path, "/opt/toolkit/nvidia-cdi-hook", "1.20.0", HOOKS_1_20)
    ctx = context(tmp_path, runner=Runner())
    toolkit.start_hook_asks(ctx, nvidia_ctk.parse_version(CTK_1_20))  # no /usr/bin binary: none
    assert ctx.early == {}
    assert toolkit.check_hooks(ctx, real_spec_at("/opt/toolkit/nvidia-cdi-hook"), None) == 5


def test_the_early_version_read_is_the_one_the_step_takes(tmp_path):
    ctx = context(tmp_path)
    toolkit.start_version_read(ctx)
    assert toolkit.read_version(ctx).text == "1.20.0"
    assert ctx.runner.ran == [nvidia_ctk.VERSION_ARGV]  # asked once, early
    assert ctx.status.nvidia_ctk_version == "1.20.0" and ctx.early == {}


def test_the_early_version_reads_failure_is_the_same_warning(tmp_path):
    ctx = context(tmp_path, runner=Tools(None))
    toolkit.start_version_read(ctx)
    assert ctx.status.warnings == []  # nothing said before the cdi step reads it
    assert toolkit.read_version(ctx) is None
    assert any(w.startswith("cdi: nvidia-ctk --version: exit 1") for w in ctx.status.warnings)


def test_the_health_gate_and_the_hook_asks_start_once_the_generation_is_in_flight(tmp_path,
                                                                                    monkeypatch):
    """The generation is the boot's longest lane: its process starts first, then what runs
    beside it (the health gate's queries, the hook asks), in the step's own order."""
    from podvm_gpu.steps.cdi import health

    order = []

    class Generating(Tools):
        def run(self, argv, check=True, timeout=None, on_start=None, **_):
            if argv[:3] == ["nvidia-ctk", "cdi", "generate"]:
                order.append("generate started")
                on_start()
                raise CommandError(argv, 1, "", 'level=error msg="stop here"\n')
            return super().run(argv, check=check, timeout=timeout)

    monkeypatch.setattr(health, "gate", lambda ctx: order.append("health gate") or "")
    monkeypatch.setattr(toolkit, "start_hook_asks",
                        lambda ctx, version: order.append(f"hook asks for {version}"))
    ctx = context(tmp_path, runner=Generating(CTK_1_20))
    with pytest.raises(StepFailed, match="stop here"):
        step.run(ctx)
    assert order[0] == "generate started"
    assert sorted(order[1:]) == ["health gate", "hook asks for 1.20.0"]


def test_a_generation_that_never_starts_reads_no_health(tmp_path, monkeypatch):
    from podvm_gpu.steps.cdi import health

    monkeypatch.setattr(health, "gate", lambda ctx: pytest.fail("the gate ran"))
    ctx = context(tmp_path, "imex: {channels: [0]}\n", runner=Tools(CTK_1_17))
    with pytest.raises(StepFailed, match="needs nvidia-ctk 1.18.0"):
        step.run(ctx)
