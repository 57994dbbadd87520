"""Property-based inputs through the real command (issue 10): a few dozen examples each, since
every example is a process (and the fabric one a whole scenario world).

- config bytes on a CPU VM: ``failed`` naming the file exactly as the config reader's error
  says, or ``no-gpu`` when the reader takes it; never a traceback;
- status files: ``status`` and ``status --json`` exit as the contract says for what the file
  holds, ``--json`` prints one JSON document, ``check --json`` still reports;
- files in /var/run/cdi and /etc/cdi: the boot ends ``no-gpu`` with the unavailable spec, and
  afterwards no other file a CDI reader loads from /var/run/cdi defines nvidia.com/gpu unless
  a warning names it; /etc/cdi is never written;
- sysfs vendor/class/device values (umockdev, binary attributes): a final state, never
  ``ready`` (the world has no tools), ``no-gpu`` exactly when no well-formed NVIDIA GPU is there;
- fabric query texts (``--query-gpu=pci.bus_id,fabric.state,fabric.status`` rows, labelled as
  the real program prints them) on the HGX world (8 GPUs): ``ready`` exactly when every GPU of
  the VM reports State Completed and Status Success, and every line is a row.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import product_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenarios.world import World
from tier import examples

from podvm_gpu.config.load import load_config
from podvm_gpu.errors import ConfigError
from podvm_gpu.gpufacts.smi import fabric_argv
from reliability.faults import SCENARIOS, WAIT_S, final_state_problems
from reliability.test_properties import (
    FABRIC_VALUES,
    TEXT,
    documents,
    oracle_kind,
    spec_files,
    status_files,
    status_oracle,
)

COMMAND = settings(max_examples=examples(25, 6), deadline=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow,
                                          HealthCheck.function_scoped_fixture])
WORLDS = settings(COMMAND, max_examples=examples(12, 3))


def run(umockdev_run, tree: str, args: list[str], path: str, timeout: float = 60):
    """``python -m podvm_gpu ARGS`` under the umockdev tree file ``tree``."""
    return subprocess.run([umockdev_run, "-d", tree, "--", sys.executable, "-m", "podvm_gpu",
                           *args], capture_output=True, text=True, timeout=timeout,
                          env=product_env(PATH=path))


def no_traceback(done) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]


@pytest.fixture(scope="module")
def cpu_tree():
    from conftest import umockdev_tree

    return str(umockdev_tree("cpu-vm"))


def status_of(root: str) -> dict:
    return json.loads(Path(root, "run/podvm-gpu/status.json").read_text())


CONFIG_KEYS = ["budget_s", "timeouts", "tools", "unavailable_spec", "modules", "persistenced",
               "nvidia-ctk", "optional", "parameters"]


@COMMAND
@given(st.one_of(st.binary(max_size=300),
                 documents(CONFIG_KEYS).map(lambda d: yaml.safe_dump(d).encode()),
                 st.sampled_from([b"budget_s: 5\n", b"unavailable_spec: false\n", b""])))
def test_any_config_ends_no_gpu_or_failed_with_the_reader_s_own_error(umockdev_run, cpu_tree,
                                                                      empty_path, data):
    with tempfile.TemporaryDirectory(prefix="pgcfg") as root:
        config = Path(root, "etc/podvm-gpu/config.yaml")
        config.parent.mkdir(parents=True)
        config.write_bytes(data)
        config.chmod(0o644)
        try:
            settings_ = load_config(str(config), required=True, trusted=True)
            expected = None
        except ConfigError as err:
            settings_, expected = None, " ".join(str(err).split())
        done = run(umockdev_run, cpu_tree, ["boot", "--root", root], empty_path)

        no_traceback(done)
        status = status_of(root)
        if expected is None:
            assert done.returncode == 0 and status["state"] == "no-gpu", status
            spec = Path(root, "var/run/cdi/nvidia.yaml")
            assert spec.exists() == settings_.unavailable_spec
        else:
            want = f"config: {expected}"
            assert done.returncode == 1 and status["state"] == "failed"
            assert status["reason"] == want or (  # boot cuts a reason at 1000 characters
                len(want) > 1000 and status["reason"].startswith(want[:900])), status["reason"]


@COMMAND
@given(status_files())
def test_any_status_file_gives_the_contract_s_exit_code_and_json(umockdev_run, cpu_tree,
                                                                 empty_path, data):
    with tempfile.TemporaryDirectory(prefix="pgst") as root:
        Path(root, "run/podvm-gpu").mkdir(parents=True)
        Path(root, "run/podvm-gpu/status.json").write_bytes(data)
        want = status_oracle(data)
        plain = run(umockdev_run, cpu_tree, ["status", "--root", root], empty_path)
        as_json = run(umockdev_run, cpu_tree, ["status", "--root", root, "--json"], empty_path)
        check = run(umockdev_run, cpu_tree, ["check", "--root", root, "--json"], empty_path)

        for done in (plain, as_json, check):
            no_traceback(done)
        assert plain.returncode == as_json.returncode == want
        assert isinstance(json.loads(as_json.stdout), dict)
        rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
        assert check.returncode in (0, 1) and rows["status"]["result"] in ("pass", "warn", "fail")
        if want == 3:
            assert rows["status"]["result"] != "pass"


NAMES = st.sampled_from(["a.yaml", "b.json", "toolkit.yaml", "nvidia.yaml", "c.yml", "d.json"])


@COMMAND
@given(st.lists(st.tuples(st.sampled_from(["/var/run/cdi", "/etc/cdi"]), NAMES, spec_files()),
                max_size=4, unique_by=lambda f: f[:2]))
def test_any_cdi_folders_end_with_the_unavailable_spec_and_no_unreported_duplicate(
        umockdev_run, cpu_tree, empty_path, files):
    with tempfile.TemporaryDirectory(prefix="pgcdi") as root:
        for folder, name, data in files:
            path = Path(root, folder.lstrip("/"), name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        etc_before = {n: Path(root, "etc/cdi", n).read_bytes() for _f, n, _d in files
                      if _f == "/etc/cdi"}
        done = run(umockdev_run, cpu_tree, ["boot", "--root", root], empty_path)

        no_traceback(done)
        status = status_of(root)
        assert done.returncode == 0 and status["state"] == "no-gpu", status
        spec = yaml.safe_load(Path(root, "var/run/cdi/nvidia.yaml").read_text())
        assert [d["name"] for d in spec["devices"]] == ["unavailable"]
        folder = Path(root, "var/run/cdi")
        for path in folder.iterdir():
            if path.suffix in (".yaml", ".json") and path.name != "nvidia.yaml" \
                    and oracle_kind(path.read_bytes()) == "nvidia.com/gpu":
                assert any(f"/var/run/cdi/{path.name} could not be read" in w
                           for w in status["warnings"]), (path.name, status["warnings"])
        assert {n: Path(root, "etc/cdi", n).read_bytes() for n in etc_before} == etc_before


def attribute(name: str, value: bytes) -> str:
    """A umockdev attribute line holding any bytes (``H:`` is hex)."""
    return f"H: {name}={value.hex()}"


WELL_FORMED = {"vendor": [b"0x10de\n", b"0x8086\n"], "class": [b"0x030200\n", b"0x030000\n",
                                                                b"0x068000\n", b"0x020000\n"],
               "device": [b"0x2331\n", b"0x2335\n"]}


def sysfs_value(name: str) -> st.SearchStrategy:
    return st.one_of(st.sampled_from(WELL_FORMED[name]), st.binary(max_size=12),
                     TEXT.map(lambda t: t[:12].encode("utf-8", "surrogatepass")))


@COMMAND
@given(st.lists(st.fixed_dictionaries({k: sysfs_value(k) for k in WELL_FORMED}), min_size=1,
                max_size=3))
def test_any_sysfs_values_end_in_a_final_state_never_ready(umockdev_run, empty_path, devices):
    blocks = []
    for i, dev in enumerate(devices):
        address = f"0000:00:{i + 4:02x}.0"
        blocks.append("\n".join([f"P: /devices/pci0000:00/{address}", "E: SUBSYSTEM=pci",
                                 f"E: PCI_SLOT_NAME={address}",
                                 *(attribute(k, v) for k, v in dev.items())]) + "\n")
    well_formed = all(dev[k] in WELL_FORMED[k] for dev in devices for k in WELL_FORMED)
    gpu = any(dev["vendor"] == b"0x10de\n" and dev["class"] in (b"0x030200\n", b"0x030000\n")
              for dev in devices)
    with tempfile.TemporaryDirectory(prefix="pgsys") as root:
        tree = Path(root, "tree.umockdev")
        tree.write_text("\n".join(blocks))
        target = Path(root, "root")
        target.mkdir()
        done = run(umockdev_run, str(tree), ["boot", "--root", str(target)], empty_path)

        no_traceback(done)
        status = status_of(str(target))
        assert status["state"] in ("no-gpu", "failed") and status["finished_at"], status
        assert done.returncode == (0 if status["state"] == "no-gpu" else 1)
        if well_formed:
            assert (status["state"] == "failed") == gpu, status
            if gpu:  # no tools in this world: the first step that needs one fails
                assert status["reason"].startswith("modules: cannot run modprobe nvidia: "
                                                   "modprobe: not found on PATH"), status["reason"]


def fabric_answer(world: World, text: str) -> None:
    """Make the fabric query (fabric_argv) print ``text``; every other call goes to the
    world's fake nvidia-smi, moved into a folder of its own so that it still sees its own name."""
    bin_dir = Path(world.layout.bin)
    (bin_dir / ".orig").mkdir()
    original = bin_dir / ".orig" / "nvidia-smi"
    (bin_dir / "nvidia-smi").rename(original)
    answer = Path(world.layout.dir, "fabric.txt")
    answer.write_text(text)
    (bin_dir / "nvidia-smi").write_text(
        f'#!/bin/sh\nif [ "$*" = "{FABRIC_ARGS}" ]; then exec /bin/cat {answer}; fi\n'
        f'exec {original} "$@"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)


FABRIC_ARGS = " ".join(fabric_argv()[1:])
P03_GPUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
FABRIC_GPU = st.tuples(st.sampled_from(P03_GPUS + (0x01, 0x77)), FABRIC_VALUES,
                       st.integers(1, 40), st.sampled_from(["", "    Junk : line\n", "\n\n",
                                                            "Fabric\n", "GPU garbage\n"]))


@WORLDS
@given(st.lists(FABRIC_GPU, max_size=10, unique_by=lambda g: g[0]) | st.just(
    [(bus, ("Completed", "Success"), 34, "") for bus in P03_GPUS]))
def test_the_hgx_world_is_ready_exactly_when_every_gpu_reports_completed_and_success(gpus):
    scenario = next(s for s in SCENARIOS if s.name == "P03")
    text = ""  # the rows of --query-gpu=pci.bus_id,fabric.state,fabric.status, as the real
    for bus, (state, status), pad, junk in gpus:  # program labels them (nvidia-smi-real.md)
        values = ("[N/A]", "[N/A]") if state == "N/A" else (f"state  {state}", f"status {status}")
        text += f"{junk}00000000:{bus:02X}:00.0,{' ' * (pad % 3)}{values[0]}, {values[1]}\n"
    good = {bus for bus, (state, status), _p, _j in gpus
            if (state.lower(), status.lower()) == ("completed", "success")}
    # a line that is no row (junk) makes the whole answer unread
    want_ready = good >= set(P03_GPUS) and all(not junk.strip() for *_x, junk in gpus)
    with World(scenario.case()) as world:
        fabric_answer(world, text)
        run_ = world.run("boot")
        problems = final_state_problems(world, run_, budget_s=15)
        state = (run_.status or {}).get("state")

    assert not problems, problems
    assert (state == "ready") == want_ready, (state, run_.status.get("reason"), text)
    if not want_ready:
        assert run_.status["reason"].startswith("fabricmanager: "), run_.status["reason"]
        assert run_.wall_s < WAIT_S + 10
