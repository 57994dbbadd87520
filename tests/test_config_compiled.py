"""The compiled config (docs/interface.md 2.6; issue 29 items 13 and 25): settings edited by
hand with ``source`` kept are found and ignored with a warning, and ``check --image`` does not
call them current; with config.yaml a link, ``check --image`` looks for the compiled file where
``config --compile`` writes it and boot reads it (beside the link's target)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def podvm_gpu(*args: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "podvm_gpu", *args, "--root", str(root)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def row(check_output: str, name: str) -> str:
    """The row ``name`` of check's table, its detail's wrapped lines joined (issue 35 item 3:
    the table fits its width, continuation lines are indented)."""
    lines = check_output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[1:2] == [name])
    end = start + 1
    while end < len(lines) and lines[end][:1] == " ":
        end += 1
    return " ".join(" ".join(lines[start:end]).split())


def compiled_root(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("budget_s: 100\n")
    assert podvm_gpu("config", "--compile", root=tmp_path).returncode == 0
    return config, Path(f"{config}.compiled.json")


def test_settings_edited_with_the_source_kept_are_ignored_with_a_warning(tmp_path):
    """``config`` said budget_s 5.0 while the YAML said 100, and check --image called the
    compiled file current."""
    config, compiled = compiled_root(tmp_path)
    doc = json.loads(compiled.read_text())
    doc["settings"]["budget_s"] = 5
    compiled.write_text(json.dumps(doc))

    done = podvm_gpu("config", "--json", root=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["settings"]["budget_s"] == 100.0
    assert f"warning: {compiled} was edited after it was compiled" in done.stderr

    image = podvm_gpu("check", "--image", root=tmp_path)
    line = row(image.stdout, "config-compiled")
    assert line.startswith("warn") and "was edited after it was compiled" in line, line

    boot = podvm_gpu("boot", root=tmp_path)
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert boot.returncode == 0 and status["state"] == "no-gpu", boot.stderr
    assert any("was edited after it was compiled" in w for w in status["warnings"]), status


def test_a_compiled_file_left_as_compiled_is_current_and_used(tmp_path):
    from podvm_gpu.config.load import compiled_state

    config, compiled = compiled_root(tmp_path)
    assert compiled_state(str(config)) is None
    line = row(podvm_gpu("check", "--image", root=tmp_path).stdout, "config-compiled")
    assert line.startswith("pass") and "/etc/podvm-gpu/config.yaml.compiled.json is current" in line


def test_a_form_of_the_previous_format_is_stale(tmp_path):
    from podvm_gpu.config.load import compiled_state

    config, compiled = compiled_root(tmp_path)
    doc = json.loads(compiled.read_text())
    del doc["digest"]
    doc["format"] = "podvm-gpu config, compiled, 2"
    compiled.write_text(json.dumps(doc))
    assert "made from another version" in compiled_state(str(config))


def test_with_the_config_a_link_check_image_looks_where_compile_writes(tmp_path):
    real = tmp_path / "opt/conf/c.yaml"
    real.parent.mkdir(parents=True)
    real.write_text("budget_s: 100\n")
    link = tmp_path / "etc/podvm-gpu/config.yaml"
    link.parent.mkdir(parents=True)
    link.symlink_to("/opt/conf/c.yaml")  # absolute: taken under the root

    done = podvm_gpu("config", "--compile", root=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "opt/conf/c.yaml.compiled.json").exists()
    line = row(podvm_gpu("check", "--image", root=tmp_path).stdout, "config-compiled")
    assert line.startswith("pass") and "/opt/conf/c.yaml.compiled.json is current" in line, line

    # a compiled file beside the link (where nothing reads it) is named as such
    os.rename(tmp_path / "opt/conf/c.yaml.compiled.json",
              tmp_path / "etc/podvm-gpu/config.yaml.compiled.json")
    line = row(podvm_gpu("check", "--image", root=tmp_path).stdout, "config-compiled")
    assert line.startswith("warn"), line
    assert "/opt/conf/c.yaml.compiled.json is missing; /etc/podvm-gpu/config.yaml.compiled.json " \
           "is beside the link, where nothing reads it" in line, line
