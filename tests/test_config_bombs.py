"""Hostile and careless config files (issue 29, items 1, 4, 8 and 20): a number too large for a
float, a negative one, a thousand aliases, a NUL or an ESC in a string. Every command says which
key is wrong in one line, none prints a traceback, and boot still ends in a final state with the
status, the unavailable spec and the console line (docs/interface.md 3.3 and 7)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from schemas import assert_status_conforms
from test_boot_start import with_console

REPO = Path(__file__).resolve().parents[1]
HUGE = "1" + "0" * 309  # 10**309: beyond any float (math.isfinite raised OverflowError)


def seconds_keys() -> list[str]:
    """Every key of the config that is a number of seconds, dotted (from the model itself)."""
    from podvm_gpu.config.model import DEFAULT_TIMEOUTS, Config

    keys = [f"timeouts.{tool}" for tool in sorted(DEFAULT_TIMEOUTS)[:2]]
    for name, (check, _default) in Config.FIELDS.items():
        if name.endswith("_s"):
            keys.append(name)
        elif hasattr(check, "FIELDS"):
            keys += [f"{name}.{k}" for k in check.FIELDS if k.endswith("_s")]
    return keys + ["metrics.textfile_interval_s", "metrics.nvml_timeout_s"]


def nested(dotted: str, value: str) -> str:
    """``a.b: value`` as YAML text, the value written as is."""
    head, _, rest = dotted.partition(".")
    return f"{head}: {value}\n" if not rest else f"{head}:\n  {rest}: {value}\n"


def podvm_gpu(*args: str, root: Path, timeout: float = 60,
              memory_bytes: int | None = None) -> subprocess.CompletedProcess:
    """The program, as a child, under ``root``; ``memory_bytes``: its address space limit."""
    def limit():
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return subprocess.run([sys.executable, "-m", "podvm_gpu", *args, "--root", str(root)],
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)


def write_config(root: Path, text: str) -> Path:
    path = root / "etc/podvm-gpu/config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def boot_with_console(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """Boot under ``root`` with ``<root>/dev/kmsg`` a FIFO (test_boot_start.with_console);
    returns the run and what reached the console."""
    return with_console(root, lambda: podvm_gpu("boot", *args, root=root))


def assert_failed_boot(root: Path, done: subprocess.CompletedProcess, console: str,
                       reason_has: str) -> dict:
    """A boot that ended ``failed`` at the config step, with every trace a failed boot leaves."""
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "OverflowError" not in done.stderr, done.stderr
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert_status_conforms(status)
    assert status["state"] == "failed" and status["reason"].startswith("config: "), status
    assert reason_has in status["reason"], status["reason"]
    spec = yaml.safe_load((root / "var/run/cdi/nvidia.yaml").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert env == ["PODVM_GPU_STATE=failed", f"PODVM_GPU_REASON={status['reason']}"]
    assert f"failed: {status['reason']}" in console, console
    return status


@pytest.mark.parametrize("sign", ["", "-"], ids=["huge", "huge-negative"])
@pytest.mark.parametrize("key", seconds_keys())
def test_a_number_beyond_a_float_in_any_seconds_key_is_refused_by_key(tmp_path, key, sign):
    """Item 1: ``budget_s: 1`` followed by 309 zeros crashed every command with OverflowError."""
    from podvm_gpu.config.load import parse_config
    from podvm_gpu.errors import ConfigError

    text = nested(key, sign + HUGE)
    with pytest.raises(ConfigError) as err:
        parse_config(text, "c.yaml")
    assert f"c.yaml: {key}: " in str(err.value)
    assert "integer of 310 digits" in str(err.value) or "more than 0" in str(err.value)


def test_a_huge_budget_ends_the_boot_failed_with_status_spec_and_console_line(tmp_path):
    write_config(tmp_path, f"budget_s: {HUGE}\n")
    done, console = boot_with_console(tmp_path)
    assert_failed_boot(tmp_path, done, console, "budget_s: must be greater than 0")


@pytest.mark.parametrize("args", [("check",), ("check", "--json"), ("check", "--image"),
                                  ("config",), ("config", "--json"), ("metrics",),
                                  ("boot", "--dry-run"), ("boot", "--dry-run", "--json")])
@pytest.mark.parametrize("value", [HUGE, "-" + HUGE])
def test_no_command_prints_a_traceback_for_a_huge_number(tmp_path, args, value):
    write_config(tmp_path, f"persistenced:\n  per_gpu_s: {value}\n")
    done = podvm_gpu(*args, root=tmp_path)
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "OverflowError" not in out, out
    assert "persistenced.per_gpu_s" in out, out
    assert done.returncode in (1, 2), out  # metrics: an invalid config is 2 (interface 1.3)


def aliases_bomb(string_bytes: int, aliases: int) -> str:
    return ("persistenced: {args: [&s \"" + "x" * string_bytes + "\", "
            + ", ".join(["*s"] * aliases) + "]}\n")


@pytest.mark.parametrize("args", [("config",), ("config", "--compile"), ("config", "--json"),
                                  ("check",), ("metrics",), ("boot", "--dry-run")])
def test_yaml_aliases_are_refused_under_a_memory_limit(tmp_path, args):
    """Item 4: a 90 KB file of aliases to one long string made 200 MB of output and of compiled
    file; the commands run here under a 400 MiB address space limit."""
    path = write_config(tmp_path, aliases_bomb(60_000, 15_000))
    assert path.stat().st_size < 150_000
    done = podvm_gpu(*args, root=tmp_path, memory_bytes=400 << 20)
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "MemoryError" not in out, out[:2000]
    # check's table wraps a detail at its width (issue 35 item 3): the lines joined
    assert "persistenced.args.1: a YAML alias (*name): aliases are not taken" in \
        " ".join(out.split()), out[:2000]
    assert len(out) < 10_000
    assert not (tmp_path / "etc/podvm-gpu/config.yaml.compiled.json").exists()


def test_a_boot_with_aliases_ends_failed_naming_the_alias(tmp_path):
    write_config(tmp_path, aliases_bomb(1000, 100))
    done, console = boot_with_console(tmp_path)
    assert_failed_boot(tmp_path, done, console, "a YAML alias")


@pytest.mark.parametrize("text, key", [
    ("a: &x {budget_s: 3}\n<<: *x\n", "<<"),
    ("budget_s: &b 3\ntimeouts: {modprobe: *b}\n", "timeouts.modprobe"),
    ("? &k budget_s\n: 3\nx: {*k : 4}\n", "x.budget_s"),
])
def test_every_alias_is_refused_with_its_place(text, key):
    from podvm_gpu.config.load import parse_config
    from podvm_gpu.errors import ConfigError

    with pytest.raises(ConfigError, match=f"c.yaml: {key}: a YAML alias"):
        parse_config(text, "c.yaml")


def test_an_anchor_without_an_alias_is_still_taken():
    from podvm_gpu.config.load import parse_config

    assert parse_config("budget_s: &b 3\n", "c.yaml").budget_s == 3.0


@pytest.mark.parametrize("key, value", [
    ("metrics.textfile_path", r'"/run/podvm-gpu/a\0b.prom"'),
    ("metrics.web_config", r'"/etc/a\0b.yml"'),
    ("tools.modprobe", r'"/sbin/mod\0probe"'),
    ("persistenced.args", r'["--x\0"]'),
    ("fabricmanager.config_file", r'"/etc/\eb"'),
    ("modules.parameters", r'{nvidia: {NVreg_X: "a\eb"}}'),
])
def test_a_control_character_in_any_string_is_refused_by_key(key, value):
    """Items 8 and 20: a NUL in metrics.textfile_path passed ``config`` and later broke the
    exporter and boot; an ESC reached terminals and /dev/kmsg raw."""
    from podvm_gpu.config.load import parse_config
    from podvm_gpu.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config(nested(key, value), "c.yaml")
    message = str(err.value)
    said = "NUL character (\\x00)" if "\\0" in value else "control character (\\x1b)"
    assert message.startswith(f"c.yaml: {key}") and said in message, message
    assert "\0" not in message and "\x1b" not in message
    # one problem, counted once: a NUL in a path was also "not an absolute path" (and 1 more)
    assert "more)" not in message, message


def test_a_key_with_a_control_character_is_one_problem_not_also_an_unknown_key():
    from podvm_gpu.config.load import parse_config
    from podvm_gpu.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config('tools: {"modprobe\\e": /sbin/modprobe}\nbudget_s: 0\n', "c.yaml")
    assert str(err.value) == ("c.yaml: tools.modprobe\\x1b: a key with a control character "
                              "(\\x1b) (and 1 more)"), str(err.value)


def test_an_esc_in_a_key_never_reaches_a_terminal_the_console_or_the_spec_raw(tmp_path):
    """Item 20: ESC and NUL from a config key were printed raw by boot, config and metrics and
    written to /dev/kmsg; the unavailable spec's env held \\u0000."""
    write_config(tmp_path, '"k\\e[2J\\0": 1\nmetrics: {textfile: true, textfile_path: '
                           '"/run/podvm-gpu/a\\0.prom"}\n')
    done, console = boot_with_console(tmp_path)
    status = assert_failed_boot(tmp_path, done, console, "k\\x1b[2J\\x00: a key with a "
                                                         "control character (\\x1b)")
    spec_text = (tmp_path / "var/run/cdi/nvidia.yaml").read_text()
    for text in (done.stdout, done.stderr, console, spec_text, json.dumps(status)):
        assert "\x1b" not in text and "\0" not in text and "\\u0000" not in text, text
    for args in (("config",), ("metrics",), ("check",), ("boot", "--dry-run")):
        other = podvm_gpu(*args, root=tmp_path)
        assert "\x1b" not in other.stdout + other.stderr, args
        assert "\0" not in other.stdout + other.stderr, args
        assert "Traceback" not in other.stdout + other.stderr, args


def test_a_cpu_boot_does_not_fail_because_the_textfile_cannot_be_written(tmp_path):
    """Item 8: with metrics.textfile on, a textfile write that raised anything but OSError
    ended a no-gpu boot ``failed: detect: internal error: ValueError``. Whatever the write
    raises is a log line; the state stays the boot's."""
    code = ("import sys\n"
            "import podvm_gpu.metrics.command as m\n"
            "def broken(*a, **k):\n"
            "    raise ValueError('embedded null byte')\n"
            "m.write_boot_textfile = broken\n"
            "from podvm_gpu.cli import main\n"
            f"sys.exit(main(['boot', '--root', {str(tmp_path)!r}]))\n")
    write_config(tmp_path, "metrics: {textfile: true}\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "no-gpu"
    assert "warning: metrics: cannot write /run/podvm-gpu/metrics.prom: internal error: " \
           "ValueError: embedded null byte" in done.stderr
