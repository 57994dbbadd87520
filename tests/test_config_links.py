"""A link at the default config path, ``<root>/etc/podvm-gpu/config.yaml``, read by every
command as boot reads it (config.config_location): an entry there, a dangling link too, is a
config that must be read, and a link loop is an error, never a traceback. Before, ``config``
called a dangling link valid, ``check`` showed no ``config`` row and ``check --image`` skipped
it, so an image whose every GPU VM boots ``failed`` passed its build check; a loop crashed
``config``, ``check`` and ``metrics``.
"""

from __future__ import annotations

import json
import os

import pytest


@pytest.fixture(params=["dangling", "loop"])
def linked(request, tmp_path):
    """``(root, what the error must say)``."""
    root = tmp_path / "root"
    folder = root / "etc/podvm-gpu"
    folder.mkdir(parents=True)
    if request.param == "dangling":
        (folder / "config.yaml").symlink_to("nowhere.yaml")
        # issue 35 item 14: the config is named first, not only the target it leads to
        why = f"{folder}/config.yaml: a link to nothing ({folder}/nowhere.yaml: no such file)"
    else:
        (folder / "a").symlink_to("b")
        (folder / "b").symlink_to("a")
        (folder / "config.yaml").symlink_to("a")
        why = "config.yaml: cannot resolve: Too many levels of symbolic links"
    return root, why


def test_boot_ends_failed_on_it(linked, podvm, empty_path):
    root, why = linked
    done = podvm(["boot", "--root", str(root), "--json"], env={"PATH": empty_path})
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["reason"].startswith("config: "), done.stdout
    assert why in json.loads(done.stdout)["reason"], done.stdout


@pytest.mark.parametrize("args", [["config"], ["config", "--compile"], ["config", "--json"]])
def test_config_says_it_is_invalid(linked, podvm, args):
    root, why = linked
    done = podvm([*args, "--root", str(root)])
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert why in done.stdout + done.stderr
    if "--json" in args:
        assert json.loads(done.stdout)["valid"] is False


def test_check_fails_its_config_row(linked, podvm, empty_path):
    root, why = linked
    done = podvm(["check", "--root", str(root), "--json"], env={"PATH": empty_path})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    rows = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert rows["config"]["result"] == "fail" and why in rows["config"]["detail"], rows


def test_check_image_fails_on_it(linked, podvm, empty_path):
    root, why = linked
    done = podvm(["check", "--image", "--root", str(root), "--json"], env={"PATH": empty_path})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    rows = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert rows["config"]["result"] == "fail", rows
    assert rows["config-compiled"]["result"] == "fail", rows["config-compiled"]


def test_metrics_says_the_config_is_bad(linked, podvm):
    root, why = linked
    done = podvm(["metrics", "--root", str(root)])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert why in done.stderr


def test_check_on_a_vm_fails_a_config_others_may_write(tmp_path, podvm, empty_path):
    """Boot refuses it (it runs the tools a config names as root), so check's config row must
    fail too; an image's check leaves that to its trust row (the builder may still own it)."""
    config = tmp_path / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("budget_s: 100\n")
    os.chmod(config, 0o666)
    done = podvm(["check", "--root", str(tmp_path), "--json"], env={"PATH": empty_path})
    rows = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == 1
    assert rows["config"]["result"] == "fail" and "not trusted" in rows["config"]["detail"], rows
