"""Config bombs as properties (issue 29 items 1 and 4): a number of any size or sign in any
seconds key, and YAML documents of anchors and aliases, in-process and through the real command
under a memory limit. Every input ends in a valid config or a ConfigError naming the file and the
key, never another exception (OverflowError, MemoryError); boot ends in a final state with the
status and the unavailable spec; memory stays bounded."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier import examples

from podvm_gpu.config.fields import yaml_float
from podvm_gpu.config.load import parse_config
from podvm_gpu.errors import ConfigError
from reliability.test_properties import check_config

REPO = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=examples(300, 100), deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow])
COMMAND = settings(max_examples=examples(20, 5), deadline=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow])
SECONDS_KEYS = ["budget_s", "timeouts.modprobe", "timeouts.nvidia-smi",
                "persistenced.ready_timeout_s", "persistenced.per_gpu_s",
                "fabricmanager.ready_timeout_s", "fabricmanager.per_gpu_s", "fabricmanager.poll_s",
                "nvlink5.ib_wait_s", "nvlink5.nvlsm_ready_timeout_s", "detect.late_gpu_wait_s",
                "metrics.textfile_interval_s", "metrics.nvml_timeout_s"]
# sizes from the ordinary to beyond any float (10**309) and to YAML's 4300-digit limit
NUMBERS = (st.integers(-(10**20), 10**20)
           | st.integers(1, 4400).flatmap(lambda digits: st.sampled_from(
               [10**digits, -(10**digits), 10**digits + 7]))
           | st.floats(allow_nan=False))


def nested(dotted: str, value: str) -> str:
    head, _, rest = dotted.partition(".")
    return f"{head}: {value}\n" if not rest else f"{head}:\n  {rest}: {value}\n"


def written(number) -> str:
    """``number`` as YAML reads it back (a float in YAML 1.1's form; an integer past Python's
    4300-digit conversion limit as its digits)."""
    if isinstance(number, float):
        return yaml_float(number)
    return str(number) if abs(number) < 10**4299 else "1" + "0" * 4400


@FAST
@given(st.sampled_from(SECONDS_KEYS), NUMBERS)
def test_a_number_of_any_size_in_any_seconds_key_is_taken_or_refused_by_key(key, number):
    try:
        config = parse_config(nested(key, written(number)), "cfg.yaml")
    except ConfigError as err:
        text = str(err)
        assert text.startswith(f"cfg.yaml: {key}: ") or text.startswith("cfg.yaml: not valid "
                                                                         "YAML"), text
        assert "\n" not in text and len(text) < 1000
    else:
        check_config(config)


def alias_document(draw_anchors: list[str], uses: int, size: int) -> str:
    """Anchored values and ``uses`` aliases to them, in the keys a config has."""
    lines = ["persistenced:", "  args:"]
    for i, value in enumerate(draw_anchors):
        lines.append(f"    - &a{i} \"{value * size}\"")
    for j in range(uses):
        lines.append(f"    - *a{j % len(draw_anchors)}")
    return "\n".join(lines) + "\n"


@FAST
@given(st.lists(st.text(alphabet="xyz", min_size=1, max_size=3), min_size=1, max_size=4),
       st.integers(1, 3000), st.integers(1, 2000))
def test_aliases_are_refused_with_bounded_memory(anchors, uses, size):
    text = alias_document(anchors, uses, size)
    tracemalloc.start()
    try:
        parse_config(text, "cfg.yaml")
    except ConfigError as err:
        assert "persistenced.args." in str(err) and "args.[" not in str(err) and "a YAML alias" in str(err), str(err)
    else:
        raise AssertionError("an alias was taken")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    # the parse holds the text and its nodes, never a copy per alias
    assert peak < 40 * len(text) + (8 << 20), (peak, len(text))


def command(args: list[str], root: str, memory_bytes: int = 400 << 20):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return subprocess.run([sys.executable, "-m", "podvm_gpu", *args, "--root", root],
                          capture_output=True, text=True, timeout=60, preexec_fn=limit,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)


@COMMAND
@given(st.one_of(
    st.tuples(st.sampled_from(SECONDS_KEYS), NUMBERS).map(lambda kn: nested(kn[0], written(kn[1]))),
    st.tuples(st.integers(1, 60_000), st.integers(1, 20_000)).map(
        lambda su: alias_document(["x"], su[1], su[0]))))
def test_through_the_commands_a_bomb_ends_in_a_final_state_under_a_memory_limit(text):
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "etc/podvm-gpu").mkdir(parents=True)
        (root / "etc/podvm-gpu/config.yaml").write_text(text)
        for args in (["config"], ["config", "--compile"], ["boot", "--dry-run"], ["check"],
                     ["metrics"]):
            done = command(args, str(root))
            out = done.stdout + done.stderr
            assert "Traceback" not in out and "MemoryError" not in out, out[-2000:]
            assert done.returncode in (0, 1, 2), out[-2000:]
            assert len(out) < 20_000
        boot = command(["boot"], str(root))
        assert "Traceback" not in boot.stderr, boot.stderr[-2000:]
        status = json.loads((root / "run/podvm-gpu/status.json").read_text())
        assert status["state"] in ("no-gpu", "failed") and status["finished_at"], status
        assert boot.returncode == (0 if status["state"] == "no-gpu" else 1)
        spec = (root / "var/run/cdi/nvidia.yaml").read_text()
        assert f"PODVM_GPU_STATE={status['state']}" in spec
        compiled = root / "etc/podvm-gpu/config.yaml.compiled.json"
        assert not compiled.exists() or compiled.stat().st_size < 4 * len(text) + 4096
