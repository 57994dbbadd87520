"""Issue 47 item 2: a file name that is not UTF-8 never makes boot write a status.json its own
readers refuse. The real boot runs (a CPU VM under umockdev) with a stray spec in /var/run/cdi or
a ``--config`` path whose name holds any bytes; then every reader takes what it wrote: ``status``,
``status --wait`` (short timeout), check's ``status`` row, the exporter's ``podvm_gpu_boot_state``
and the watch unit's ``ExecCondition=podvm-gpu status``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

from conftest import product_env, umockdev_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podvm_gpu.check.vm import status_row
from podvm_gpu.host.fs import Root
from podvm_gpu.metrics import families
from podvm_gpu.metrics.exporter import render
from podvm_gpu.status import load_status, run_status

LAUNCHER = ("import os, runpy, sys; sys.argv = ['podvm-gpu'] + [os.fsdecode(bytes.fromhex(a)) "
            "for a in sys.argv[1:]]; runpy.run_module('podvm_gpu', run_name='__main__')")
NAME_BYTES = st.binary(min_size=1, max_size=8).filter(lambda b: b"/" not in b and b"\0" not in b)


def _boot(root: str, *args: str) -> subprocess.CompletedProcess:
    empty = os.path.join(root, "..", "empty-bin")
    os.makedirs(empty, exist_ok=True)
    # umockdev-run refuses an argument that is not UTF-8: the arguments travel as hex and the
    # launcher gives the product the bytes, as a shell would
    argv = [shutil.which("umockdev-run"), "-d", str(umockdev_tree("cpu-vm")), "--",
            sys.executable, "-c", LAUNCHER,
            *(os.fsencode(a).hex() for a in ["boot", "--root", root, *args])]
    return subprocess.run(argv, capture_output=True, timeout=60,
                          env=product_env(PATH=os.path.abspath(empty)))


def _quiet(call):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        rc = call()
    return rc, out.getvalue()


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(where=st.sampled_from(["spec", "config"]), name=NAME_BYTES)
def test_every_reader_accepts_the_status_boot_wrote_whatever_bytes_a_file_name_holds(
        umockdev_run, where, name):
    top = tempfile.mkdtemp(prefix="pg47-")
    try:
        root = os.path.join(top, "root")
        os.makedirs(os.path.join(root, "var/run/cdi"))
        args: list[str] = []
        if where == "spec":
            with open(os.path.join(os.fsencode(root), b"var/run/cdi", b"other" + name + b".yaml"),
                      "wb") as f:
                f.write(b"cdiVersion: 0.5.0\nkind: example.com/x\ndevices: []\n")
        else:
            config = os.path.join(os.fsencode(top), b"config" + name + b".yaml")
            with open(config, "wb") as f:
                f.write(b"budget_S: 30\n")
            args = ["--config", os.fsdecode(config)]
        done = _boot(root, *args)
        assert b"Traceback" not in done.stderr, done.stderr
        raw = open(os.path.join(root, "run/podvm-gpu/status.json"), "rb").read()
        raw.decode("utf-8")  # strict: no lone surrogate, no byte that is not UTF-8
        doc = json.loads(raw)
        state = doc["state"]
        assert state == ("no-gpu" if where == "spec" else "failed"), doc
        want = 0 if state == "no-gpu" else 1
        # status, and the watch unit's ExecCondition= (podvm-gpu status: 0 runs the watcher)
        assert _quiet(lambda: run_status(root))[0] == want
        rc, out = _quiet(lambda: run_status(root, json_out=True))
        assert rc == want and json.loads(out)["state"] == state
        assert _quiet(lambda: run_status(root, wait=True, timeout=0.5))[0] == want
        assert load_status(Root(root))["state"] == state
        row = status_row(types.SimpleNamespace(root=Root(root)))
        assert "unreadable" not in row.detail, row
        scrape = render(families.boot_families(load_status(Root(root)), None)).decode()
        assert f'podvm_gpu_boot_state{{state="{state}"}} 1.0' in scrape, scrape
        spec = open(os.path.join(root, "var/run/cdi/nvidia.yaml"), "rb").read()
        spec.decode("utf-8")
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _failed_by_the_watcher(root: str) -> None:
    from podvm_gpu.model import State, Status
    from podvm_gpu.status import StatusFile

    StatusFile(Root(root)).finish(Status(), State.FAILED,
                                  "watch: GPU 0000:00:04.0: Xid 79 (fallen off the bus)")


def test_after_watch_clear_the_status_row_says_to_run_the_boot_again(tmp_path):
    """Issue 47 item 8: after ``watch --clear`` (no watch.json) check still said "replace the
    VM"; it says to run the boot again, as ``--clear`` itself prints."""
    from podvm_gpu.watchfile import VERSION, save

    _failed_by_the_watcher(str(tmp_path))
    save(Root(str(tmp_path)), {"version": VERSION, "finding": {"reason": "watch: x"}})
    standing = status_row(types.SimpleNamespace(root=Root(str(tmp_path))))
    assert "replace the VM" in standing.hint
    os.unlink(tmp_path / "run/podvm-gpu/watch.json")
    cleared = status_row(types.SimpleNamespace(root=Root(str(tmp_path))))
    assert cleared.result == "fail"
    assert "cleared" in cleared.detail and "run the boot again" in cleared.hint, cleared
    assert "replace the VM" not in cleared.hint


def test_status_on_a_root_boot_refused_says_so(tmp_path):
    """Issue 47 item 19: on a root boot refused (mode 0777) ``status`` said "boot has not run";
    it says that boot refused the root, as check's row does."""
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o777)
    rc, out = _quiet(lambda: run_status(str(root)))
    assert rc == 3
    assert "boot refuses to write under" in out and "has not run" not in out, out
