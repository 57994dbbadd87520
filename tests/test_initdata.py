"""The pod's initdata (podvm_gpu/initdata.py): the schema of data."podvm-gpu.toml", the reader's
rules (docs/interface.md 2.7) and the boot's use of it (expected GPUs, model, attestation)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from podvm_gpu import initdata
from podvm_gpu.host.fs import Root

PATH = "/run/peerpod/initdata"


def doc(section: str | None) -> str:
    """An initdata document as cloud-api-adaptor keeps it, with the agent's file."""
    text = 'algorithm = "sha384"\nversion = "0.1.0"\n\n[data]\n"aa.toml" = \'\'\'\n[token_configs]\n\'\'\'\n'
    if section is not None:
        text += f'"podvm-gpu.toml" = \'\'\'\n{section}\'\'\'\n'
    return text


def test_the_agents_file_gives_its_requirements():
    found = initdata.parse(doc('expected_gpus = 8\ngpu_model = "H100"\nattestation_required = true\n'),
                           PATH)
    assert found == {"expected_gpus": 8, "gpu_model": "H100", "attestation_required": True,
                     "section": True}


def test_an_initdata_without_the_agents_file_adds_nothing():
    assert initdata.parse(doc(None), PATH) == {"expected_gpus": None, "gpu_model": None,
                                               "attestation_required": False, "section": False}


@pytest.mark.parametrize("section, wanted", [
    ("expected_gpus = 0\n", 'data."podvm-gpu.toml": expected_gpus: must be a whole number from 1 to 64, not 0'),
    ("expected_gpus = true\n", "expected_gpus: must be a whole number"),
    ('expected_gpus = "8"\n', "expected_gpus: must be a whole number"),
    ("gpu_model = 3\n", "gpu_model: must be a non-empty string"),
    ('attestation_required = "yes"\n', "attestation_required: must be true or false"),
    ('attestation = "off"\n', 'data."podvm-gpu.toml": attestation: unknown key'),
    ("expected_gpus = \n", 'data."podvm-gpu.toml": not TOML'),
])
def test_a_malformed_section_names_itself(section, wanted):
    with pytest.raises(initdata.InitdataError) as err:
        initdata.parse(doc(section), PATH)
    assert wanted in str(err.value) and str(err.value).startswith(PATH)


def test_a_document_that_is_not_toml_fails():
    with pytest.raises(initdata.InitdataError, match="not TOML"):
        initdata.parse("[data\n", PATH)


def test_reader_takes_the_digest_and_waits_bounded(tmp_path):
    root = tmp_path / "root"
    (root / "run/peerpod").mkdir(parents=True)
    t0 = time.monotonic()
    assert initdata.read(Root(str(root)), PATH, 0.3, time.monotonic() + 10) == (None, None)
    assert 0.3 <= time.monotonic() - t0 < 2
    (root / "run/peerpod/initdata").write_text(doc("expected_gpus = 1\n"))
    (root / "run/peerpod/initdata.digest").write_text("ab12 cd34\n")
    text, digest = initdata.read(Root(str(root)), PATH, 0, time.monotonic() + 10)
    assert "expected_gpus = 1" in text and digest == "ab12 cd34"


def test_reader_refuses_a_fifo_a_link_and_a_file_others_can_write(tmp_path):
    root = tmp_path / "root"
    (root / "run/peerpod").mkdir(parents=True)
    target = root / "run/peerpod/initdata"
    os.mkfifo(target)
    with pytest.raises(initdata.InitdataError, match="cannot read"):
        initdata.read(Root(str(root)), PATH, 0, time.monotonic() + 10)
    target.unlink()
    (root / "elsewhere").write_text(doc(None))
    target.symlink_to(root / "elsewhere")
    with pytest.raises(initdata.InitdataError, match="cannot read"):
        initdata.read(Root(str(root)), PATH, 0, time.monotonic() + 10)
    target.unlink()
    target.write_text(doc(None))
    target.chmod(0o666)
    with pytest.raises(initdata.InitdataError, match="not trusted"):
        initdata.read(Root(str(root)), PATH, 0, time.monotonic() + 10)


def test_a_cpu_vm_without_the_key_never_imports_the_reader(tmp_path):
    """The CPU fast path stays as it was: without initdata.path nothing is read or imported."""
    probe = ("import sys, podvm_gpu.cli as c; c.main(['boot', '--root', sys.argv[1]]); "
             "print('podvm_gpu.initdata' in sys.modules, 'tomllib' in sys.modules, file=sys.stderr)")
    root = tmp_path / "root"
    root.mkdir()
    done = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True,
                          text=True, timeout=60)
    assert done.stderr.split()[-2:] == ["False", "False"], done.stderr
    assert json.loads((root / "run/podvm-gpu/status.json").read_text())["initdata"] is None


def test_the_digest_goes_into_the_status_of_a_cpu_vm_whose_pod_expects_no_gpu(tmp_path):
    root = tmp_path / "root"
    (root / "run/peerpod").mkdir(parents=True)
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text("initdata: {path: /run/peerpod/initdata}\n")
    (root / "run/peerpod/initdata").write_text(doc("attestation_required = true\n"))
    (root / "run/peerpod/initdata.digest").write_text("9b1e" * 24 + "\n")
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert done.returncode == 0 and status["state"] == "no-gpu", done.stderr
    assert status["initdata"] == {"path": PATH, "digest": "9b1e" * 24, "section": True,
                                  "expected_gpus": None, "gpu_model": None,
                                  "attestation_required": True}


def test_a_cpu_vm_whose_pod_names_a_gpu_model_fails_as_one_that_counts_gpus(tmp_path):
    """Issue 35 item 19: gpu_model = "H100" on a VM with no GPU ended no-gpu (exit 0), while
    expected_gpus failed; attestation_required alone stays no-gpu (the test above)."""
    root = tmp_path / "root"
    (root / "run/peerpod").mkdir(parents=True)
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text("initdata: {path: /run/peerpod/initdata}\n")
    (root / "run/peerpod/initdata").write_text(doc('gpu_model = "H100"\n'))
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert (done.returncode, status["state"]) == (1, "failed"), done.stderr
    assert status["reason"] == ('initdata: the pod\'s initdata (/run/peerpod/initdata, '
                                'data."podvm-gpu.toml") expects GPU model \'H100\'; no NVIDIA GPU on PCI')


# --- the wait, named for what it is (issue 35 item 6) ------------------------------------------


def initdata_root(tmp_path, config: str):
    root = tmp_path / "root"
    (root / "run/peerpod").mkdir(parents=True)
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text(config)
    return root


def test_the_status_names_the_initdata_wait_and_a_signal_during_it_names_initdata(tmp_path):
    """During the wait status.json showed ``detect`` running with an empty message (stderr had
    said ``detect ok``), and Ctrl-C gave ``detect: interrupted by SIGINT``."""
    import signal

    root = initdata_root(tmp_path, "budget_s: 60\ninitdata: {path: /run/peerpod/initdata, "
                                   "wait_s: 30}\n")
    boot = subprocess.Popen([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        status_file, seen, deadline = root / "run/podvm-gpu/status.json", None, time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                seen = json.loads(status_file.read_text())
            except (OSError, ValueError):
                seen = None
            if seen and [s["name"] for s in seen["steps"]] == ["detect", "initdata"]:
                break
            time.sleep(0.05)
        assert seen and seen["state"] == "running", seen
        detect, wait = seen["steps"]
        assert detect["result"] == "ok" and detect["message"].startswith("no NVIDIA GPU"), detect
        assert wait["result"] == "running", wait
        assert re.fullmatch(r"waiting up to (29|30)\.\d\d s for the pod's initdata "
                            r"/run/peerpod/initdata", wait["message"]), wait
        boot.send_signal(signal.SIGINT)
        out, err = boot.communicate(timeout=30)
    finally:
        if boot.poll() is None:
            boot.kill()
            boot.wait()
    status = json.loads(status_file.read_text())
    assert boot.returncode == 1 and status["state"] == "failed", err
    assert status["reason"].startswith("initdata: interrupted by SIGINT"), status["reason"]
    assert [(s["name"], s["result"]) for s in status["steps"]] == [("detect", "ok"),
                                                                  ("initdata", "failed")]


def test_a_wait_cut_by_the_budget_says_the_time_it_waited(tmp_path):
    """``budget_s: 3`` and ``wait_s: 10`` warned "not there after 10 s" after 3 s."""
    from schemas import problems

    root = initdata_root(tmp_path, "budget_s: 3\ninitdata: {path: /run/peerpod/initdata, "
                                   "wait_s: 10}\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert done.returncode == 0 and status["state"] == "no-gpu", done.stderr
    assert problems(status) == [] and [s["name"] for s in status["steps"]] == ["detect"]
    [warning] = status["warnings"]
    found = re.fullmatch(r"initdata: /run/peerpod/initdata not there after (\d+\.\d\d) s "
                         r"\(initdata\.wait_s 10 s, cut to what the boot budget has left\): the "
                         r"pod carried none, no requirement added", warning)
    assert found, warning
    assert 2.0 <= float(found[1]) <= 3.0 and took < 6, (warning, took)
    assert "initdata skipped in " in done.stderr, done.stderr


def test_an_initdata_that_comes_during_the_wait_is_read_and_says_when(tmp_path):
    root = initdata_root(tmp_path, "initdata: {path: /run/peerpod/initdata, wait_s: 20}\n")
    boot = subprocess.Popen([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    (root / "run/peerpod/initdata").write_text(doc("attestation_required = true\n"))
    out, err = boot.communicate(timeout=30)
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert boot.returncode == 0 and status["state"] == "no-gpu" and status["warnings"] == [], err
    assert [s["name"] for s in status["steps"]] == ["detect"]
    assert status["initdata"]["attestation_required"] is True
    found = re.search(r"initdata ok in \d+\.\d+ s: read /run/peerpod/initdata after (\d+\.\d\d) s",
                      err)
    assert found and 0.5 <= float(found[1]) < 20, err
