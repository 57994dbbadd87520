"""check is read-only: it runs on a read-only root and makes only query calls (contract section 5).

After the real boot of a field case, ``podvm-gpu check`` runs again with the root bind-mounted
read-only in a private mount namespace (``unshare -m``): a write would fail with EROFS. Every call
it made to the fake tools is recorded by the harness and must be one of the read-only queries.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from scenarios.expect import report
from scenarios.world import DATA, SHARED, World, load_case

HERE = os.path.dirname(os.path.abspath(__file__))
# The only argv prefixes check may use: queries that change nothing.
READ_ONLY_QUERIES = (
    ("nvidia-smi", "-q"),
    ("nvidia-smi", "conf-compute", "-f"),
    ("nvidia-smi", "conf-compute", "-d"),
    ("nvidia-smi", "conf-compute", "-e"),
    ("nvidia-smi", "conf-compute", "-mgm"),
    ("nvidia-smi", "conf-compute", "-grs"),
    ("nvidia-smi", "--query-gpu="),
    ("nvidia-smi", "--query-remapped-rows="),
    ("nv-fabricmanager", "--version"),
    ("modinfo", "-F", "version"),
    ("nvidia-ctk", "cdi", "list"),
)


def is_query(argv: list[str]) -> bool:
    for prefix in READ_ONLY_QUERIES:
        head, last = list(prefix[:-1]), prefix[-1]
        if argv[:len(head)] == head and len(argv) > len(head) and argv[len(head)].startswith(last):
            return True
    return False


def case(name: str):
    for folder in (SHARED / "cases", DATA / "cases"):
        if (folder / name).exists():
            return load_case(folder / name)
    raise FileNotFoundError(name)


def unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return os.system("unshare -m --propagation private true >/dev/null 2>&1") == 0


@pytest.mark.parametrize("name", ["P03-hgx-h200-8gpu-4nvswitch-ready.yaml",
                                  "C21-cc-ready-state-not-ready.yaml",
                                  "C23-fabricmanager-version-mismatch.yaml"])
def test_check_runs_on_a_read_only_root_and_only_queries(name, monkeypatch):
    if not unshare_works():
        if os.environ.get("CI"):
            pytest.fail("unshare -m (root, util-linux) is needed for this test in CI")
        pytest.skip("needs root and unshare -m")
    the_case = case(name)
    with World(the_case) as world:
        world.run("boot")
        wrapper = f"unshare -m --propagation private {sys.executable} " \
                  f"{os.path.join(HERE, 'readonly_root.py')} -- {sys.executable} -m podvm_gpu"
        monkeypatch.setenv("PODVM_GPU_CMD", wrapper)
        run = world.run("check")
        problems = []
        try:
            doc = json.loads(run.stdout)
        except ValueError:
            doc = None
            problems.append("check did not print its JSON document (did it try to write?)")
        expected = the_case.expect.get("check", {}).get("exit", 0)
        if run.rc != expected:
            problems.append(f"check exit {run.rc}, expected {expected}")
        if doc is not None:
            failing = sorted(c["name"] for c in doc["checks"] if c["result"] == "fail")
            wanted = sorted(the_case.expect.get("check", {}).get("fails", []))
            if not set(wanted) <= set(failing):
                problems.append(f"failing checks {failing}, expected at least {wanted}")
        writes = [c.argv for c in run.calls if not is_query(c.argv)]
        if writes:
            problems.append(f"check made calls that are not read-only queries: {writes}")
        if run.root_changes:
            problems.append(f"check changed files under the root: {run.root_changes}")
        if problems:
            pytest.fail(report(world, run, problems), pytrace=False)


def test_the_read_only_root_really_stops_writes(monkeypatch):
    """Negative control: boot, which must write its status, fails on the read-only root."""
    if not unshare_works():
        if os.environ.get("CI"):
            pytest.fail("unshare -m (root, util-linux) is needed for this test in CI")
        pytest.skip("needs root and unshare -m")
    with World(case("P02-one-h100-pcie-ready.yaml")) as world:
        wrapper = f"unshare -m --propagation private {sys.executable} " \
                  f"{os.path.join(HERE, 'readonly_root.py')} -- {sys.executable} -m podvm_gpu"
        monkeypatch.setenv("PODVM_GPU_CMD", wrapper)
        run = world.run("boot")
        assert run.rc == 1
        assert "Read-only file system" in run.stderr
        assert run.calls == []
