"""The attestation gate (podvm_gpu/steps/cc/attest/gate.py) and runner (run.py) with the nvattest
stand-in on a PATH of their own: the unit under systemd (a fake systemd-run that records its
argv and runs the command after ``--``), the limit, Protected PCIe, the record and the kept
output."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from podvm_gpu.config.model import ConfidentialComputingConfig, Config
from podvm_gpu.errors import StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner
from podvm_gpu.model import PciDevice, Status
from podvm_gpu.steps.cc.attest import gate
from podvm_gpu.steps.cc.attest import run as nvattest
from podvm_gpu.steps.context import BootContext

STANDIN = Path(__file__).resolve().parent / "nvattest_standin.py"
DRIVER = "550.54.15"
SW = [f"{i:016X}" for i in range(1, 5)]
GP = [f"{i:016X}" for i in range(16, 24)]


def pci(i: int, cls: str = "030200") -> PciDevice:
    return PciDevice(f"0000:{i + 16:02x}:00.0", "10de", "2335", cls, "nvidia", "H200")


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A root, a bin/ with the stand-in as nvattest (and fakes of systemd-run, systemctl and
    nvidia-smi that log their argv), and a function making a BootContext."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    log = tmp_path / "calls.jsonl"
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    (bin_dir / "nvattest").write_text(
        f"#!{sys.executable}\nimport os, sys\nos.environ['NVATTEST_STANDIN_PLAN'] = {str(plan)!r}\n"
        f"sys.path.insert(0, {str(STANDIN.parent)!r})\nimport nvattest_standin\n"
        "sys.exit(nvattest_standin.main(sys.argv[1:]))\n")
    logger = (f"#!{sys.executable}\nimport json, os, signal, subprocess, sys, time\n"
              f"open({str(log)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n"
              f"STATE = {str(tmp_path / 'units')!r}\nos.makedirs(STATE, exist_ok=True)\n")
    # systemd-run --no-block: the command runs detached, its stdout and stderr to the files
    # StandardOutput=/StandardError= name, its exit status kept for systemctl show
    (bin_dir / "systemd-run").write_text(logger + """
unit = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--unit="))
props = dict(a[len("--property="):].split("=", 1) for a in sys.argv if a.startswith("--property="))
argv = sys.argv[sys.argv.index("--") + 1:]
since = time.monotonic_ns() // 1000
if os.fork() == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    with open(props["StandardOutput"][5:], "w") as out, open(props["StandardError"][5:], "w") as err:
        child = subprocess.Popen(argv, stdout=out, stderr=err)
        open(f"{STATE}/{unit}.pid", "w").write(str(child.pid))
        rc = child.wait()
    open(f"{STATE}/{unit}.rc", "w").write(str(rc))
    os._exit(0)
open(f"{STATE}/{unit}.since", "w").write(str(since))
""")
    (bin_dir / "systemctl").write_text(logger + """
verb, unit = sys.argv[1], sys.argv[2]
if verb == "show":
    since = open(f"{STATE}/{unit}.since").read() if os.path.exists(f"{STATE}/{unit}.since") else "0"
    if os.path.exists(f"{STATE}/{unit}.rc"):
        rc = int(open(f"{STATE}/{unit}.rc").read())
        code = f"code=killed ; status={-rc}" if rc < 0 else f"code=exited ; status={rc}"
        print(f"ActiveState=active\\nSubState=exited\\nInactiveExitTimestampMonotonic={since}\\n"
              f"ExecStart={{ path=x ; argv[]=x ; {code} }}")
    else:
        print(f"ActiveState=active\\nSubState=running\\nInactiveExitTimestampMonotonic={since}")
elif verb == "stop" and os.path.exists(f"{STATE}/{unit}.pid"):
    try:
        os.kill(int(open(f"{STATE}/{unit}.pid").read()), signal.SIGKILL)
    except ProcessLookupError:
        pass
""")
    (bin_dir / "nvidia-smi").write_text(logger)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PODVM_GPU_SUPERVISOR", "spawn")

    def make(plan_doc: dict, gpus: int = 1, switches: int = 0, budget: float = 60.0, **cc):
        plan.write_text(json.dumps(plan_doc))
        config = Config(confidential_computing=ConfidentialComputingConfig(**cc))
        runner = Runner(env={"PATH": str(bin_dir)}, deadline=time.monotonic() + budget)
        ctx = BootContext(Root(str(root)), config, runner, Status(), time.monotonic() + budget,
                          gpus=[pci(i) for i in range(gpus)],
                          nvswitches=[pci(16 + i, "068000") for i in range(switches)])
        ctx.driver_version = DRIVER
        return ctx

    make.calls = lambda: [json.loads(line) for line in log.read_text().splitlines()] \
        if log.exists() else []
    make.root = root
    return make


def test_a_pass_records_every_device_and_keeps_the_output_0644(world):
    ctx = world({"gpus": [{"driver": DRIVER}] * 2}, gpus=2)
    said = gate.attest_before_ready(ctx, "not-ready", guest="Intel TDX (test)")
    record = ctx.status.attestation
    assert said == "attested (2 devices, nvattest local verifier)"
    assert record["result"] == "passed" and record["nvattest_version"] == "1.2.2"
    assert len(record["nonce"]) == 64 and [d["index"] for d in record["devices"]] == [0, 1]
    kept = world.root / "run/podvm-gpu/nvattest-gpu.json"
    assert oct(kept.stat().st_mode & 0o777) == "0o644"
    doc = json.loads(kept.read_text())
    assert {c["eat_nonce"] for c in doc["claims"]} == {record["nonce"]}
    from podvm_gpu.steps.cc.attest.verdict import claims_sha256
    assert record["runs"][0]["claims_sha256"] == claims_sha256(doc["claims"])
    assert record["runs"][0]["where"] == "child"


def test_every_boot_passes_a_fresh_nonce(world):
    nonces = set()
    for _ in range(2):
        ctx = world({"gpus": [{"driver": DRIVER}]})
        gate.attest_before_ready(ctx, "not-ready", guest="TDX")
        nonces.add(ctx.status.attestation["nonce"])
    assert len(nonces) == 2


def test_under_systemd_nvattest_runs_in_a_unit_of_its_own_with_network(world, monkeypatch):
    monkeypatch.setenv("PODVM_GPU_SUPERVISOR", "systemd")
    ctx = world({"gpus": [{"driver": DRIVER}]}, ocsp_url="http://proxy:8080/ocsp")
    gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    run = next(c for c in world.calls() if c[0].endswith("systemd-run"))
    assert ctx.status.attestation["result"] == "passed"
    assert ctx.status.attestation["runs"][0]["where"].startswith("unit podvm-gpu-nvattest-gpu-")
    assert {"--no-block", "--property=After=network-online.target",
            "--property=Wants=network-online.target",
            "--property=RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
            "--property=RuntimeMaxSec=50", "--property=RemainAfterExit=yes"} <= set(run)
    assert not (world.root / "run/podvm-gpu/.nvattest-gpu.stdout").exists(), "read and removed"
    after = run[run.index("--") + 1:]
    assert after[0].endswith("/nvattest") and after[1:4] == ["attest", "--device", "gpu"]
    assert after[-2:] == ["--ocsp-url", "http://proxy:8080/ocsp"]
    assert not any(p.startswith("--property=IPAddressDeny") for p in run)


def test_a_hung_unit_is_stopped_and_the_reason_says_killed(world, monkeypatch):
    monkeypatch.setenv("PODVM_GPU_SUPERVISOR", "systemd")
    ctx = world({"gpu": {"hang": True}}, attestation_timeout_s=1.0, attestation_per_device_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    assert time.monotonic() - t0 < 8
    assert "nvattest attest --device gpu timed out after 1.5 s, killed" in str(err.value)
    assert any(c[1:3] == ["stop", c[2]] and c[2].startswith("podvm-gpu-nvattest-gpu-")
               for c in world.calls() if c[0].endswith("systemctl"))


def test_the_budget_cuts_the_limit_and_the_reason_says_so(world):
    ctx = world({"gpu": {"hang": True}}, budget=1.5)
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    assert "killed: the boot budget is spent" in str(err.value)


def test_a_failure_with_the_state_found_ready_runs_srs_0(world):
    ctx = world({"gpu": {"measres_fail": [0]}, "gpus": [{"driver": DRIVER}]})
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "ready", guest="TDX")
    assert ["conf-compute", "-srs", "0"] in [c[1:] for c in world.calls()]
    assert str(err.value).endswith("; the ready state found ready was set back to not-ready")


def test_a_failure_with_the_state_not_ready_runs_no_srs(world):
    ctx = world({"gpu": {"code": 2}})
    with pytest.raises(StepFailed):
        gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    assert not [c for c in world.calls() if "-srs" in c]


@pytest.mark.parametrize("mode, guest, wanted", [
    ("auto", None, "not attested (nvattest not installed)"),
    ("off", "TDX", "not attested (attestation off)"),
])
def test_policy_without_nvattest(world, mode, guest, wanted):
    ctx = world({}, attestation=mode)
    os.unlink(ctx.runner.env["PATH"] + "/nvattest")
    assert gate.attest_before_ready(ctx, "not-ready", guest=guest) == wanted
    assert ctx.status.warnings


@pytest.mark.parametrize("mode, guest", [("auto", "Intel TDX"), ("required", None)])
def test_policy_requires_nvattest_and_fails_closed(world, mode, guest):
    ctx = world({}, attestation=mode)
    os.unlink(ctx.runner.env["PATH"] + "/nvattest")
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest=guest)
    assert "nvattest: not found on PATH" in str(err.value)
    assert f"confidential_computing.attestation: {mode}" in str(err.value)


def test_initdata_requirement_overrides_attestation_off(world):
    ctx = world({"gpus": [{"driver": DRIVER}]}, attestation="off")
    said = gate.attest_before_ready(ctx, "not-ready", guest=None, required_by="the pod's initdata")
    assert said.startswith("attested")


def _ppcie_plan(gpu_pdis=None, switch_pdi=None):
    return {"gpus": [{"driver": DRIVER, "switch_pdis": SW if gpu_pdis is None else gpu_pdis}] * 8,
            "nvswitches": [{"pdi": (switch_pdi if switch_pdi and i == 3 else SW[i]),
                            "gpu_pdis": GP} for i in range(4)]}


def test_protected_pcie_attests_the_switches_with_the_same_nonce(world):
    ctx = world(_ppcie_plan(), gpus=8, switches=4)
    said = gate.attest_before_ready(ctx, "not-ready", guest="TDX", ppcie=True)
    record = ctx.status.attestation
    assert said == "attested (12 devices, nvattest local verifier)"
    assert [r["device"] for r in record["runs"]] == ["gpu", "nvswitch"]
    switches = json.loads((world.root / "run/podvm-gpu/nvattest-nvswitch.json").read_text())
    assert {c["eat_nonce"] for c in switches["claims"]} == {record["nonce"]}
    assert any("lock state is not checked" in w for w in ctx.status.warnings)


def test_protected_pcie_wrong_topology_fails(world):
    ctx = world(_ppcie_plan(switch_pdi="00000000000000FF"), gpus=8, switches=4)
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest="TDX", ppcie=True)
    assert "Protected PCIe topology: nvswitch 3: x-nvidia-switch-pdi" in str(err.value)


def test_protected_pcie_a_missing_switch_claim_fails(world):
    plan = _ppcie_plan()
    plan["nvswitch"] = {"claims": 3}
    ctx = world(plan, gpus=8, switches=4)
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest="TDX", ppcie=True)
    assert "3 nvswitch claim(s) for 4 nvswitch(s) on PCI" in str(err.value)


def test_the_command_takes_the_config_paths_under_the_root():
    cc = ConfidentialComputingConfig(relying_party_policy="/etc/p.rego", rim_dir="/var/rims",
                                     rim_url="https://rim.example")
    argv = nvattest.command("gpu", "ab" * 32, cc, Root("/tmp/world"))
    assert argv == ["nvattest", "attest", "--device", "gpu", "--verifier", "local", "--nonce",
                    "ab" * 32, "--format", "json", "--relying-party-policy",
                    "/tmp/world/etc/p.rego", "--rim-store", "dir", "--rim-dir",
                    "/tmp/world/var/rims", "--rim-url", "https://rim.example"]


def test_metrics_agree_with_the_record(world):
    from podvm_gpu.metrics.families import attestation_families

    ctx = world({"gpus": [{"driver": DRIVER}] * 2}, gpus=2)
    gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    families = {f.name: f for f in attestation_families({"attestation": ctx.status.attestation})}
    result = {s.labels["result"]: s.value for s in families["podvm_gpu_attestation_result"].samples}
    assert result == {"passed": 1, "failed": 0, "not-run": 0, "off": 0}
    devices = {s.labels["type"]: s.value for s in families["podvm_gpu_attestation_devices"].samples}
    assert devices == {"gpu": 2, "nvswitch": 0}
    duration = families["podvm_gpu_attestation_duration_seconds"].samples[0].value
    assert duration == ctx.status.attestation["duration_s"] > 0
    assert attestation_families({"attestation": None}) == []


class _Facts:
    def __init__(self, ctx, failed_at=None):
        self.root, self.config, self.runner = ctx.root, ctx.config, ctx.runner
        self.gpus, self.nvswitches = ctx.gpus, ctx.nvswitches
        self.failed_at = failed_at

    def not_reached(self, step):
        return None


def test_check_attest_runs_a_fresh_one_and_writes_nothing(world):
    from podvm_gpu.steps.cc.attest.check import fresh_row

    ctx = world({"gpus": [{"driver": DRIVER}]})
    (world.root / "sys/module/nvidia").mkdir(parents=True)
    (world.root / "sys/module/nvidia/version").write_text(DRIVER + "\n")
    row = fresh_row(_Facts(ctx))
    assert row.result == "pass" and row.detail.startswith("--attest: passed now: 1 device(s)")
    assert not (world.root / "run/podvm-gpu").exists()
    assert not [c for c in world.calls() if "-srs" in c]
    ctx = world({"gpu": {"nonce": "foreign"}})
    row = fresh_row(_Facts(ctx))
    assert row.result == "fail" and "not the nonce this boot passed" in row.detail


def test_check_attest_skips_a_gpu_that_is_simply_not_confidential_unless_required(world):
    """Issue 35 item 21: the real nvattest 1.2.2 on an H200 with CC off answers NVAT 509 "GPU is
    neither in CC nor in PPCIe mode", exit 253 (../shared/nvattest.md, last section): nothing
    failed on a VM that needs no attestation; where the config or the pod's initdata requires
    it, the row fails naming who requires it."""
    from podvm_gpu.status import StatusFile
    from podvm_gpu.steps.cc.attest.check import fresh_row

    row = fresh_row(_Facts(world({"gpu": {"code": 509}})))
    assert row.result == "skip", row
    assert row.detail == ("--attest: not attested: the GPU is not in CC or Protected PCIe mode "
                          "(nvattest: NVAT 509, GPU is neither in CC nor in PPCIe mode)")
    row = fresh_row(_Facts(world({"gpu": {"code": 509}}, attestation="required")))
    assert row.result == "fail", row
    assert "attestation required (confidential_computing.attestation: required)" in row.detail
    ctx = world({"gpu": {"code": 509}})
    ctx.status.initdata = {"path": "/run/peerpod/initdata", "attestation_required": True}
    StatusFile(ctx.root).write(ctx.status)
    row = fresh_row(_Facts(ctx))
    assert row.result == "fail" and "the pod's initdata (/run/peerpod/initdata" in row.detail, row
    # any other failure stays a failure
    assert fresh_row(_Facts(world({"gpu": {"code": 500}}))).result == "fail"


def test_check_row_from_the_record_fails_when_the_kept_output_changed(world):
    from podvm_gpu.status import StatusFile
    from podvm_gpu.steps.cc.attest.check import record_row

    ctx = world({"gpus": [{"driver": DRIVER}]})
    gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    StatusFile(ctx.root).write(ctx.status)
    assert record_row(_Facts(ctx)).result == "pass"
    kept = world.root / "run/podvm-gpu/nvattest-gpu.json"
    doc = json.loads(kept.read_text())
    doc["claims"][0]["measres"] = "fail"
    kept.write_text(json.dumps(doc))
    row = record_row(_Facts(ctx))
    assert row.result == "fail" and "does not match the record's claims_sha256" in row.detail


@pytest.mark.parametrize("args", [["check", "--attest", "--json"], ["check", "--json", "--attest=x"]])
def test_check_attest_on_the_command_line(tmp_path, args):
    """``check --attest`` is a flag of both parsers (the fast one, argparse for the rest); on a
    VM without a GPU its row is a skip, and nothing is written."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "podvm_gpu", *args, "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    if args[-1] == "--attest=x":  # a flag takes no value: a usage error, exit 2
        assert done.returncode == 2 and "--attest" in done.stderr
        return
    row = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "attestation")
    assert row["result"] == "skip" and list(tmp_path.iterdir()) == []
