"""Every nvidia-smi command line the agent runs, run by NVIDIA's real nvidia-smi builds.

The builds are Debian's (tests/realsmi/fetch.py: bookworm 535.261.03 and bookworm-security's 535,
trixie's tesla-535 535.274.02 and 550.163.01, experimental's 555.58.02), unmodified, against the
fake NVML (tests/fake_nvml) describing the state, run as nobody (tests/realsmi/smi.py). Their
output goes through the agent's own readers and decisions (the fabric wait and probe, the
health gate, the MIG diagnosis, the CC readers) and each test asserts the decision. The command
lines are listed from the code: :func:`test_the_suite_runs_every_nvidia_smi_call_of_the_agent`
fails when the agent gains an nvidia-smi call this suite does not run. The scenario harness's own
answers are held against the real output at the end.
"""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import fake_nvml
import pytest
from boot.image import unavailable
from realsmi import fetch, smi
from smi_facts import smi_facts as smi_facts_of

from podvm_gpu.config.load import validate
from podvm_gpu.config.model import Config
from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.gpufacts import health as gpu_health
from podvm_gpu.gpufacts import judge, words
from podvm_gpu.gpufacts import smi as smi_back_end
from podvm_gpu.host.fs import Root
from podvm_gpu.model import PciDevice, Status
from podvm_gpu.steps import Skipped
from podvm_gpu.steps.cc import classify
from podvm_gpu.steps.cc import query as cc_query
from podvm_gpu.steps.cc import step as cc_step
from podvm_gpu.steps.cdi import health
from podvm_gpu.steps.cdi import step as cdi_step
from podvm_gpu.steps.context import BootContext
from podvm_gpu.steps.fabric import step as fabric

PACKAGE = Path(__file__).resolve().parents[1] / "podvm_gpu"

FABRIC = smi_back_end.fabric_argv()
REMAP = smi_back_end.remap_argv()
ECC = smi_back_end.ecc_argv()
MIG_MODE = ["nvidia-smi", "--query-gpu=index,mig.mode.current", "--format=csv,noheader"]
MIG_LGI = ["nvidia-smi", "mig", "-lgi"]
CC_F = ["nvidia-smi", "conf-compute", "-f"]
CC_GRS = ["nvidia-smi", "conf-compute", "-grs"]
CC_SRS = ["nvidia-smi", "conf-compute", "-srs", "1"]
CC_SRS0 = ["nvidia-smi", "conf-compute", "-srs", "0"]  # issue 26: a failed attestation sets it back
# the CC classification's queries (steps/cc/classify.py QUERIES), asked by query.read_finding
# and check's row with a variable option
CC_QUERIES = [["nvidia-smi", "conf-compute", q] for q in ("-f", "-d", "-e", "-mgm")]
RESET = smi_back_end.reset_argv()  # issue 28: the health gate's own queries
ACTION = smi_back_end.action_argv()
FULL_Q = ["nvidia-smi", "-q"]  # issue 28: the rack-scale kind's cliques
FABRIC_HEALTH = smi_back_end.fabric_health_argv()  # issue 33: 580's health summary, a query of its own
VBIOS = smi_back_end.vbios_argv()  # issue 37: the VBIOS an NVAT 104 (RIM not found) names
# Each argv list written in the agent's code (ast.unparse of the list) -> the command line(s) run.
# Issue 33: they are all in the nvidia-smi back end (podvm_gpu/gpufacts/smi.py).
SITES = {
    "['nvidia-smi', f\"--query-remapped-rows={','.join(REMAP_FIELDS)}\", CSV]": REMAP,
    "['nvidia-smi', f\"--query-gpu={','.join(fields)}\", CSV]": None,  # QUERY_GPU below
    "['nvidia-smi', 'mig', '-lgi']": MIG_LGI,
    "['nvidia-smi', 'conf-compute', *args]": None,  # the conf_compute calls below
    "['nvidia-smi', '-q']": FULL_Q,
}
# the --query-gpu builder's argvs, each from its function
QUERY_GPU = {smi_back_end.fabric_argv: FABRIC, smi_back_end.fabric_health_argv: FABRIC_HEALTH,
             smi_back_end.ecc_argv: ECC,
             smi_back_end.reset_argv: RESET, smi_back_end.action_argv: ACTION,
             smi_back_end.mig_mode_argv: MIG_MODE, smi_back_end.vbios_argv: VBIOS}
CC_CALLS = {("-grs",): CC_GRS, ("-srs", "1"): CC_SRS}
RUN = [FABRIC, REMAP, ECC, MIG_MODE, MIG_LGI, *CC_QUERIES, CC_GRS, CC_SRS, CC_SRS0, RESET, ACTION, FULL_Q,
       FABRIC_HEALTH, VBIOS]

GPU0, GPU1 = "0000:18:00.0", "0000:28:00.0"  # fake_nvml.gpu(0) and gpu(1)
ALL_CALLS = ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo",
             "nvmlDeviceGetPciInfoExt", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors",
             "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetGpuFabricInfo",
             "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetIndex", "nvmlDeviceGetMigMode",
             "nvmlDeviceGetArchitecture")


def lost_after_handle(gpu: int) -> dict:
    """Every device call on GPU ``gpu`` answers GPU_IS_LOST (15) once its handle is taken."""
    return {f"{call}.{gpu}": 15 for call in ALL_CALLS}


# state -> (GPUs, describe() keywords)
STATES = {
    "healthy": ([fake_nvml.gpu(0, **{"fabric.state": 3, "mig": 0})], {"cc": "on"}),
    "remap-pending": ([fake_nvml.gpu(0, **{"remap.pending": 1})], {}),
    "remap-failure": ([fake_nvml.gpu(0, **{"remap.failure": 1, "remap.uncorrectable": 1})], {}),
    "ecc-volatile": ([fake_nvml.gpu(0, **{"ecc.dbe_vol": 5})], {}),
    "retire-pending": ([fake_nvml.gpu(0, **{"retired.pending": 1})], {}),
    "lost-at-handle": ([fake_nvml.gpu(0, lost=1)], {}),
    "lost-after-handle": ([fake_nvml.gpu(0)], {"error": lost_after_handle(0)}),
    "one-of-two-lost-at-handle": ([fake_nvml.gpu(0), fake_nvml.gpu(1, lost=1)], {}),
    "one-of-two-lost-after-handle": ([fake_nvml.gpu(0), fake_nvml.gpu(1)],
                                     {"error": lost_after_handle(1)}),
    "fabric-not-started": ([fake_nvml.gpu(0, **{"fabric.state": 1})], {}),
    "fabric-in-progress": ([fake_nvml.gpu(0, **{"fabric.state": 2})], {}),
    "fabric-completed-error": ([fake_nvml.gpu(0, **{"fabric.state": 3, "fabric.status": 23})], {}),
    "mig-on": ([fake_nvml.gpu(0, mig=1)], {}),
    "mig-on-with-instances": ([fake_nvml.gpu(0, mig=1, **{"mig.instances": 2})], {}),
    "init-9": ([fake_nvml.gpu(0)], {"init_error": 9}),
    "init-12": ([fake_nvml.gpu(0)], {"init_error": 12}),
    "init-18": ([fake_nvml.gpu(0)], {"init_error": 18}),
    "init-3": ([fake_nvml.gpu(0)], {"init_error": 3}),
}


@pytest.fixture(scope="session")
def builds() -> list[fetch.Build]:
    """Every build, fetched (tests/realsmi/fetch.py); fails under CI, skips elsewhere."""
    for tool in ("setpriv", "gcc"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is needed to run the real nvidia-smi")
    try:
        found = fetch.builds()
    except (fetch.FetchFailed, OSError) as err:
        unavailable(f"cannot fetch NVIDIA's nvidia-smi builds: {err}")
    assert {b.branch for b in found} == {535, 550, 555}, found
    return found


@pytest.fixture(scope="session")
def world():
    """A folder nobody can read (the fake, its descriptions) and write (the CC ready state);
    the host's /dev before and after the session must be the same."""
    before = smi.dev_entries()
    base = smi.shared_dir(Path(tempfile.mkdtemp(prefix="realsmi-")))
    built = fake_nvml.build(base)
    for path in (built.parent, built):
        path.chmod(0o755)
    lib = built.parent
    yield SimpleNamespace(base=base, lib=lib)
    shutil.rmtree(base, ignore_errors=True)
    assert smi.dev_entries() == before, "running nvidia-smi changed the host's /dev"
    assert not os.path.exists("/dev/nvidiactl") or "nvidiactl" in before


class RealRunner:
    """The agent's Runner interface (run(argv, timeout=, check=)), answered by one real build
    in one state; the argvs it was asked are kept."""

    def __init__(self, build: fetch.Build, description: Path, lib: Path):
        self.build, self.description, self.lib, self.asked = build, description, lib, []
        self.timeouts: dict[str, float] = {}

    def which(self, tool: str) -> str | None:
        """Only nvidia-smi is installed here (no nvattest: a regular VM attests nothing)."""
        return str(self.build.binary) if tool == "nvidia-smi" else None

    def why_missing(self, tool: str) -> str:
        return f"{tool} is not installed (not on PATH)"

    def run(self, argv, *, timeout=None, check=True):
        from podvm_gpu.host.proc import Completed

        assert argv[0] == "nvidia-smi", argv
        self.asked.append(list(argv))
        started = time.monotonic()
        said = smi.run(self.build.binary, list(argv[1:]), self.description, self.lib)
        done = Completed(argv=list(argv), returncode=said.returncode, stdout=said.stdout,
                         stderr=said.stderr, duration_s=time.monotonic() - started)
        if check and said.returncode != 0:
            raise CommandError(argv, said.returncode, said.stdout, said.stderr)
        return done


def describe(world, build: fetch.Build, name: str, gpus: list[dict], **kw) -> Path:
    version = f"12.{build.upstream}"
    path = world.base / f"{build.ident}-{name}.desc"
    kw = dict(kw)
    cc = kw.pop("cc", "off")
    ready = world.base / f"{build.ident}-{name}.ready"
    ready.unlink(missing_ok=True)  # each description starts not ready (cc.ready 0)
    extra = {"cc.ready_file": str(ready)}
    fake_nvml.describe(path, gpus, cc=cc, cc_ready=0, driver_version=build.upstream,
                       nvml_version=version, **extra, **kw)
    path.chmod(0o644)
    return path


def context(runner: RealRunner, n_gpus: int, **config) -> BootContext:
    cfg = validate(config, "test") if config else Config()
    gpus = [PciDevice(a, "10de", "2330", "030200", "nvidia", "H100 SXM5 80GB")
            for a in (GPU0, GPU1)[:n_gpus]]
    return BootContext(Root("/nonexistent-root"), cfg, runner, Status(),
                       time.monotonic() + 60, gpus=gpus)


def in_state(world, build, state: str):
    gpus, kw = STATES[state]
    runner = RealRunner(build, describe(world, build, state, gpus, **kw), world.lib)
    return runner, context(runner, len(gpus))


# --- the command lines, from the code -----------------------------------------------------------

def agent_argv_sites() -> tuple[set[str], set[tuple[str, ...]]]:
    """Every list literal starting with "nvidia-smi" in podvm_gpu/ (unparsed), and the
    literal arguments of every ``conf_compute(ctx, ...)`` call (steps/cc/query.py's helper;
    ``conf_compute(ctx, query)`` asks each of CC_QUERIES)."""
    lists, cc_calls = set(), set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                    and node.elts[0].value == "nvidia-smi":
                lists.add(ast.unparse(node))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "conf_compute" \
                    and all(isinstance(a, ast.Constant) for a in node.args[1:]):
                cc_calls.add(tuple(ast.literal_eval(a) for a in node.args[1:]))
    return lists, cc_calls


def test_the_suite_runs_every_nvidia_smi_call_of_the_agent():
    lists, cc_calls = agent_argv_sites()
    assert lists == set(SITES), "an nvidia-smi call this suite does not run (add it to SITES)"
    assert cc_calls == set(CC_CALLS)
    wanted = [argv for argv in SITES.values() if argv] + list(CC_CALLS.values()) + CC_QUERIES
    assert all(argv in RUN for argv in wanted)
    assert all(build() == argv and argv in RUN for build, argv in QUERY_GPU.items())
    assert [smi_back_end.conf_compute_argv(*args) for args in [("-grs",), ("-srs", "1"), ("-srs", "0")]] \
        == [CC_GRS, CC_SRS, CC_SRS0]
    assert REMAP in RUN and ECC in RUN


def test_fetched_builds_are_the_pinned_ones_or_their_branch_s_current(builds):
    for build in builds:
        assert build.binary.is_file() and os.access(build.binary, os.X_OK)
        pin = next(p for p in fetch.PINS if (p.suite, p.package) == (build.suite, build.package))
        assert build.upstream.startswith(pin.branch + ".")
        print(f"{build.suite} {build.package}={build.version} (pinned {pin.version or 'current'})")


# --- the health gate ----------------------------------------------------------------------------

HEALTH = {  # state -> what the gate's StepFailed says (None: passes)
    "healthy": None,
    "remap-pending": "a row remap is pending (remapped_rows.pending 1): GPU reset needed",
    "remap-failure": "row remapping failed (remapped_rows.failure 1)",
    "ecc-volatile": "5 uncorrectable ECC error(s) since the driver loaded",
    "retire-pending": "a page retirement is pending (retired_pages.pending Yes)",
    "lost-at-handle": "Unable to determine the device handle for GPU0000:18:00.0: GPU is lost.",
    "lost-after-handle": "GPU #0 of NVML's list is lost",
    "one-of-two-lost-at-handle": "for GPU0000:28:00.0: GPU is lost",
    "one-of-two-lost-after-handle": "GPU #1 of NVML's list is lost",
    "init-9": "nvidia-smi cannot communicate with the NVIDIA driver (exit 9",
    "init-12": "exit 12 (NVML library not found)",
    "init-18": "Driver/library version mismatch NVML library version: ",
}


@pytest.mark.parametrize("state", list(HEALTH) + ["init-3"])
def test_health_gate_decides_on_the_real_output(builds, world, state):
    for build in builds:
        runner, ctx = in_state(world, build, state)
        want = HEALTH.get(state)
        if want is None:
            said = health.gate(ctx)
            if state == "healthy":
                # issue 28: every real build accepts reset_status.* (the fake NVML does not serve
                # the private calls behind it: [N/A]) and refuses gpu_recovery_action
                # (and what it read of ECC: the real builds' "0, No")
                assert said == ("health: 00000000:18:00.0 remap pending 0, failure 0; "
                                "00000000:18:00.0 volatile uncorrectable ECC 0, retirement "
                                "pending No; 00000000:18:00.0 reset status N/A; recovery action "
                                "not offered by this nvidia-smi"), build
                assert not ctx.status.warnings
            else:  # init 3: Failed to initialize NVML: N/A, exit 3: not read, a warning
                assert said == "health: not read"
                assert any("exit 3 (not supported): Failed to initialize NVML: N/A" in w
                           for w in ctx.status.warnings), (build, ctx.status.warnings)
            continue
        with pytest.raises(StepFailed) as failed:
            health.gate(ctx)
        assert want in str(failed.value), (build.ident, str(failed.value))
        assert runner.asked[0] == REMAP


def test_remapper_reads_yes_no_as_the_field_reports_it_and_1_0_as_the_real_program():
    for failure in ("Yes", "1"):
        found = gpu_health.judge_remapper(
            [["00000000:18:00.0", "No" if failure == "Yes" else "0", failure]], False)
        assert [f.kind for f in found if f.level != words.OK] == ["remap-failed"]
    found = gpu_health.judge_remapper([["00000000:18:00.0", "[Unknown Error]", "[Unknown Error]"]],
                                      False)
    assert [(f.level, f.kind) for f in found if f.level != words.OK] == [(words.WARN, "unread-value")]


# --- the fabric ---------------------------------------------------------------------------------

def fabric_ctx(world, build, state: str):
    gpus, kw = STATES[state]
    runner = RealRunner(build, describe(world, build, state, gpus, **kw), world.lib)
    return runner, context(runner, len(gpus), fabricmanager={
        "ready_timeout_s": 0.4, "per_gpu_s": 0, "poll_s": 0.1})


def test_fabric_wait_ends_when_the_real_program_says_completed_success(builds, world):
    for build in builds:
        runner, ctx = fabric_ctx(world, build, "healthy")
        states = fabric.wait_for_fabric(ctx, None)
        assert [tuple(s) for s in states] == [("00000000:18:00.0", "Completed", "Success")]
        assert ctx.nvml_seen == {"00000000:18:00.0"}
        assert runner.asked == [FABRIC]


@pytest.mark.parametrize("state,want", [
    ("fabric-not-started", ("timed out after 0.4 s waiting for the NVLink fabric (wait 0.4 s + "
                            "0 s x 1 GPU(s)): State Not Started, Status N/A on 1 GPU(s)")),
    ("fabric-in-progress", "State In Progress, Status N/A on 1 GPU(s)"),
    ("fabric-completed-error", "fabric unhealthy: State Completed, Status Insufficient Resources"),
    ("lost-at-handle", ("nvidia-smi exit 15 (GPU is lost): Unable to determine the device "
                        "handle for GPU0000:18:00.0: GPU is lost.")),
    ("lost-after-handle", ("1 GPU(s) lost (nvidia-smi printed [GPU is lost] for it; not "
                           "answering: 0000:18:00.0)")),
    ("one-of-two-lost-after-handle", "not answering: 0000:28:00.0"),
    ("one-of-two-lost-at-handle", "for GPU0000:28:00.0: GPU is lost"),
    ("init-9", "nvidia-smi cannot communicate with the NVIDIA driver (exit 9"),
    ("init-18", "exit 18 (driver/library version mismatch)"),
])
def test_fabric_wait_fails_naming_the_cause_from_the_real_output(builds, world, state, want):
    for build in builds:
        _, ctx = fabric_ctx(world, build, state)
        with pytest.raises(StepFailed) as failed:
            fabric.wait_for_fabric(ctx, None)
        assert want in str(failed.value), (build.ident, str(failed.value))


def test_fabric_managed_outside_the_vm_and_in_progress_is_never_ready(builds, world):
    for build in builds:
        _, ctx = fabric_ctx(world, build, "fabric-in-progress")
        with pytest.raises(StepFailed, match="waiting for the NVLink fabric.*In Progress"):
            fabric.probe_outside(ctx)
        _, ctx = fabric_ctx(world, build, "mig-on")  # no fabric: [N/A], [N/A]
        with pytest.raises(Skipped, match="report no NVLink fabric"):
            fabric.probe_outside(ctx)


def test_every_real_build_refuses_the_old_fabric_query(builds, world):
    for build in builds:
        runner, _ = in_state(world, build, "healthy")
        done = runner.run(["nvidia-smi", "-q", "-d", "FABRIC"], check=False)
        assert (done.stdout, done.returncode) == ("Failed to parse --display/-d flags\n", 2)


# --- MIG ----------------------------------------------------------------------------------------

def test_mig_diagnosis_on_the_real_output(builds, world):
    for build in builds:
        _, ctx = in_state(world, build, "healthy")
        assert cdi_step.mig_problem(ctx) is None
        runner, ctx = in_state(world, build, "mig-on")
        said = cdi_step.mig_problem(ctx)
        assert said == ("MIG mode is enabled on GPU 0 but no GPU instances exist (nvidia-smi mig "
                        "-lgi exit 6 (not found (no GPU listed)): No GPU instances found: Not Found); "
                        "create GPU instances "
                        "or disable MIG mode"), (build.ident, said)
        assert runner.asked == [MIG_MODE, MIG_LGI]
        runner, ctx = in_state(world, build, "mig-on-with-instances")
        assert cdi_step.mig_problem(ctx) is None
        assert "|   0  MIG 1g.10gb         19        2          1:1     |" in \
            runner.run(MIG_LGI).stdout


# --- CC texts and the CC classification (steps/cc/classify.py) ---------------------------------

def test_cc_readers_on_the_real_output(builds, world):
    for build in builds:
        runner, _ = in_state(world, build, "healthy")  # CC on, not ready, ready state in a file
        done = runner.run(CC_F, check=False)
        assert (smi_back_end.parse_cc_mode(done.output), done.returncode) == ("on", 0)
        grs = runner.run(CC_GRS, check=False)
        assert smi_back_end.parse_ready_state(grs.output) == "not-ready"
        srs = runner.run(CC_SRS, check=False)
        assert (srs.stdout, srs.returncode) == ("", 0)
        assert smi_back_end.parse_ready_state(runner.run(CC_GRS, check=False).output) == "ready"
        # a failed attestation sets a found-ready state back (steps/cc/attest/gate.py)
        srs = runner.run(CC_SRS0, check=False)
        assert (srs.stdout, srs.returncode) == ("", 0)
        assert smi_back_end.parse_ready_state(runner.run(CC_GRS, check=False).output) == "not-ready"
        for state in ("lost-after-handle", "lost-at-handle", "init-9"):
            runner, _ = in_state(world, build, state)
            for argv, reader in ((CC_F, smi_back_end.parse_cc_mode), (CC_GRS, smi_back_end.parse_ready_state)):
                done = runner.run(argv, check=False)
                assert done.returncode in (9, 15), (state, done)
                assert reader(done.output, done.returncode) is None, (state, argv)
        # lost after its handle: the words say "No CC capable devices found.", the status 15
        done = in_state(world, build, "lost-after-handle")[0].run(CC_F, check=False)
        assert done.stdout == ("NVML: Unable to get architecture: GPU is lost\n"
                               "No CC capable devices found.\n")


def real_finding(runner):
    return classify.from_smi(cc_query.answers(
        lambda q: runner.run(["nvidia-smi", "conf-compute", q], check=False)))


def test_cc_classification_and_step_on_the_real_output(builds, world):
    """Every CC mode the fake NVML can describe, through the real builds, into the classification
    and the step: 535 has no -mgm (exit 2: no multi-GPU mode), so it cannot show Protected PCIe;
    a lost GPU (exit 15) is lost, never 'not CC capable'; -srs 1 runs only for a confidential GPU."""
    for build in builds:
        old = build.branch == 535
        for cc, label in (("on", "on"), ("devtools", "devtools"), ("off", "off"),
                          ("ppcie", "off" if old else "ppcie")):
            runner = RealRunner(build, describe(world, build, f"cc-{cc}", [fake_nvml.gpu(0)], cc=cc),
                                world.lib)
            found = real_finding(runner)
            assert (found.label, found.unreadable) == (label, {}), (build.ident, cc, found.to_dict())
            assert found.multi_gpu == (judge.MGM_NOT_OFFERED if old else
                                       judge.MGM_PPCIE if cc == "ppcie" else judge.MGM_NONE)
            ctx = context(runner, 1, confidential_computing={"set_ready_state": True})
            if label in ("on", "ppcie"):
                said = cc_step.run(ctx)  # a regular VM without nvattest: set, said unattested
                assert "ready state set to ready; not attested (nvattest not installed)" in said, \
                    (build.ident, cc, said)
            elif label == "devtools":
                with pytest.raises(StepFailed, match="DevTools Mode: ON"):
                    cc_step.run(ctx)
            else:
                with pytest.raises(Skipped):
                    cc_step.run(ctx)
            assert smi_back_end.parse_ready_state(runner.run(CC_GRS, check=False).output) == \
                ("ready" if label in ("on", "ppcie") else "not-ready"), (build.ident, cc)
        for state in ("lost-after-handle", "lost-at-handle", "one-of-two-lost-at-handle"):
            found = real_finding(in_state(world, build, state)[0])
            assert found.lost and "exit 15" in found.lost, (build.ident, state, found.to_dict())
            assert classify.decide(found, None).outcome == classify.FAIL
        found = real_finding(in_state(world, build, "init-9")[0])
        assert found.no_driver and classify.decide(found, None).outcome == classify.FAIL


# --- the scenario harness says what the real program says ---------------------------------------

def test_the_scenario_harness_prints_what_the_real_program_prints(builds, world):
    from scenarios import effects as fx
    from scenarios.fake_tool import HEALTHY, _query_csv, cc_ready_text, refusal

    nvml_fabric = {"completed": {"fabric.state": 3}, "in-progress": {"fabric.state": 2},
                   "not-started": {"fabric.state": 1},
                   "insufficient-resources": {"fabric.state": 3, "fabric.status": 23}}
    for build in builds:
        for name, fields in nvml_fabric.items():
            runner = RealRunner(build, describe(world, build, f"h-{name}",
                                                [fake_nvml.gpu(0, **fields)]), world.lib)
            real = runner.run(FABRIC).stdout
            assert _query_csv(FABRIC, [GPU0], [GPU0], fx.FABRIC_STATES[name]) == real, name
        runner, _ = in_state(world, build, "mig-on")  # no fabric
        assert _query_csv(FABRIC, [GPU0], [GPU0], fx.FABRIC_NOT_SUPPORTED) == \
            runner.run(FABRIC).stdout
        healthy = runner.run(REMAP).stdout
        assert _query_csv(REMAP, [GPU0], [GPU0], fx.FABRIC_NOT_SUPPORTED,
                          REMAP[1].split("=", 1)[1]) == healthy
        assert HEALTHY["remapped_rows.pending"] == healthy.split(", ")[1]
        for argv in (["nvidia-smi", "-q", "-d", "FABRIC"],
                     ["nvidia-smi", "--query-gpu=pci.bus_id,fabric.clique_id", "--format=csv"],
                     ["nvidia-smi", "--query-gpu=index,fabric.cluster_uuid", "--format=csv"]):
            done = runner.run(argv, check=False)
            assert refusal(argv) == (done.returncode, done.stdout), argv
        runner, _ = in_state(world, build, "healthy")
        assert runner.run(CC_GRS).stdout == cc_ready_text("not-ready")
        runner.run(CC_SRS)
        assert runner.run(CC_GRS).stdout == cc_ready_text("ready")


# --- check's rows -------------------------------------------------------------------------------

def facts(runner: RealRunner, tmp_path: Path) -> SimpleNamespace:
    """What check's row-remapper and fabric-outside rows read of ``facts``."""
    return SimpleNamespace(root=Root(str(tmp_path)), runner=runner, config=Config(),
                           not_reached=lambda step: None, needs_driver=lambda row: None)


@pytest.mark.parametrize("state,result,detail", [
    ("healthy", "pass", "00000000:18:00.0 remap pending 0, failure 0"),
    ("remap-failure", "fail", "row remapping failed (remapped_rows.failure 1)"),
    ("remap-pending", "fail", "a row remap is pending (remapped_rows.pending 1)"),
    ("lost-at-handle", "fail", "for GPU0000:18:00.0: GPU is lost."),
    ("one-of-two-lost-after-handle", "fail", "GPU #1 of NVML's list is lost"),
    ("init-18", "fail", "exit 18 (driver/library version mismatch)"),
    ("init-3", "warn", "not read (nvidia-smi --query-remapped-rows="),
])
def test_check_row_remapper_on_the_real_output(builds, world, tmp_path, state, result, detail):
    for build in builds:
        gpus, kw = STATES[state]
        runner = RealRunner(build, describe(world, build, state, gpus, **kw), world.lib)
        row = cdi_step.row_remapper_row(facts(runner, tmp_path))
        assert (row.result, detail in row.detail) == (result, True), (build.ident, row)


@pytest.mark.parametrize("state,result,detail", [
    ("fabric-in-progress", "fail", "not ready: 00000000:18:00.0: State In Progress, Status N/A"),
    ("fabric-completed-error", "fail", "State Completed, Status Insufficient Resources"),
    ("healthy", "pass", "Completed/Success on 1 GPU(s)"),
    ("mig-on", "skip", "no NVSwitch on PCI"),
    ("lost-after-handle", "fail", "State GPU is lost"),
    ("lost-at-handle", "fail", "exit 15 (GPU is lost)"),
    ("init-9", "fail", "exit 9 (driver not loaded)"),
    ("init-3", "warn", "exit 3 (not supported): Failed to initialize NVML: N/A"),
])
def test_check_fabric_managed_outside_the_vm_on_the_real_output(builds, world, tmp_path, state,
                                                                 result, detail):
    for build in builds:
        gpus, kw = STATES[state]
        runner = RealRunner(build, describe(world, build, state, gpus, **kw), world.lib)
        row = fabric._outside_row(facts(runner, tmp_path))
        assert (row.result, detail in row.detail) == (result, True), (build.ident, row)


# --- issue 28: reset status, recovery action, the rack-scale cliques ----------------------------

def test_every_real_build_answers_reset_status_and_refuses_the_recovery_action(builds, world):
    """What the scenario harness answers for them (tests/scenarios/fake_tool.py) is what every
    real build prints: the refusal word for word, exit 2; reset status accepted."""
    for build in builds:
        runner, _ = in_state(world, build, "healthy")
        done = runner.run(ACTION, check=False)
        assert (done.stdout, done.returncode) == (
            'Field "gpu_recovery_action" is not a valid field to query.\n\n', 2), build.ident
        done = runner.run(RESET, check=False)
        assert done.returncode == 0 and done.stdout.startswith("00000000:18:00.0, "), build.ident
        found = gpu_health.read_recovery(gpu_health.ask, runner, 10, False)
        assert [f.level for f in found] == [words.OK] * len(found), build.ident


def test_every_real_build_refuses_the_fabric_health_summary_as_not_offered(builds, world):
    """Issue 33: 580 lists fabric.health.summary; the Debian builds (535-555) refuse it, exit 2,
    and the query of its own is then "not offered", never a warning, never the fabric's
    failure."""
    for build in builds:
        runner, ctx = fabric_ctx(world, build, "healthy")
        done = runner.run(FABRIC_HEALTH, check=False)
        assert (done.stdout, done.returncode) == (
            'Field "fabric.health.summary" is not a valid field to query.\n\n', 2), build.ident
        assert fabric.health_summary(ctx) == "health summary not offered by this nvidia-smi"
        assert ctx.status.warnings == []



def test_full_q_is_run_by_no_test_here_but_the_rack_kinds_reader_is_held_to_real_text():
    """The fake NVML does not serve all a full ``-q`` asks for (every build ends it with
    ``Internal NVML error``, exit 255): the cliques' reader is held to the 535/550/555 Fabric
    blocks of nvidia-smi-real.md in tests/test_rack_fabric.py, and a failed ``-q`` is said, never
    a failure (fabric_kind.rack_cliques)."""
    from podvm_gpu.steps.fabric import fabric_kind

    class Failing:
        @staticmethod
        def run(argv, timeout=None):
            raise CommandError(argv, 255, "Internal NVML error\n", "")

    ctx = SimpleNamespace(runner=Failing, harmless_timeout=lambda tool: 5)
    said = fabric_kind.rack_cliques(ctx, fabric_kind.Fabric(fabric_kind.RACK, [], [], []))
    assert said.startswith("clique and cluster UUID not read (nvidia-smi -q: exit 255")


@pytest.mark.parametrize("code", [f.nvml for f in words.FAILURES])
def test_the_failure_tables_observed_exit_status_is_what_every_build_exits_with(builds, world, code):
    """Issue 33: the failure table keeps nvidia-smi's exit status as observed apart from NVML's
    return code (gpufacts/words.py FAILURES). Every build whose NVML initialisation returns
    ``code``, asked the remapper, exits with the table's observed status (NVML 1, 22, 28 and
    999 as 255; 25 to 29, learnt here)."""
    observed = {}
    for build in builds:
        runner = RealRunner(build, describe(world, build, f"rc-{code}", [fake_nvml.gpu(0)],
                                            init_error=code), world.lib)
        done = runner.run(REMAP, check=False)
        observed[build.ident] = done.returncode
        assert done.stdout.startswith("Failed to initialize NVML: ") or code in (9, 12), done.stdout

    assert observed == dict.fromkeys(observed, words.NVML_RETURN[code].smi_exit)


# --- issue 33: the two back ends give the same facts ------------------------------------------

_NVML_CHILD = """
import json, sys
from podvm_gpu.gpufacts.facts import nvml_facts
from podvm_gpu.gpufacts.nvml import NvmlReader
from podvm_gpu.host.fs import Root
from podvm_gpu.readers import find_nvml, find_nvml_elsewhere
r = NvmlReader(Root(sys.argv[1]), 20, find=(find_nvml, find_nvml_elsewhere)).read("full")
print(json.dumps({"up": r.up, "message": r.message,
                  "gpus": [nvml_facts(g)._asdict() for g in r.gpus]}))
"""
# the facts both back ends read (the recovery action: no Debian build offers it; the fabric
# health summary: not read through NVML)
COMPARED = ("lost", "remap_pending", "remap_failure", "ecc_volatile", "retired_pending",
            "fabric_state", "fabric_success")


def smi_facts(runner) -> dict:
    """Per GPU, the values the nvidia-smi back end reads (gpufacts/smi.py smi_facts)."""
    return {bus: {name: getattr(facts, name).value for name in COMPARED}
            for bus, facts in smi_facts_of(runner, 10).items()}


def nvml_facts(root) -> dict:
    """The same through the NVML back end (gpufacts/facts.py nvml_facts; pynvml in a child:
    NVML is process-wide)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _NVML_CHILD, str(root)], capture_output=True,
                          text=True, timeout=60, env=fake_nvml.metrics_env(root / "fake.desc"))
    assert done.returncode == 0, done.stderr
    reading = json.loads(done.stdout)
    assert reading["up"], reading["message"]
    return {gpu["bus"]: {name: gpu[name][0] for name in COMPARED} for gpu in reading["gpus"]}


@pytest.mark.parametrize("state", ["healthy", "remap-pending", "remap-failure", "ecc-volatile",
                                   "retire-pending", "fabric-in-progress",
                                   "fabric-completed-error"])
def test_the_nvidia_smi_and_nvml_back_ends_read_the_same_facts(builds, world, state, tmp_path):
    """Issue 33: one tests/fake_nvml state, read through every real nvidia-smi build (the boot's
    and check's back end) and through pynvml (the exporter's), gives equal facts (the value
    types of gpufacts/facts.py): bus ids, lost, remap pending and failure, the volatile
    uncorrectable count, the pending retirement, the fabric state and whether it succeeded."""
    gpus, kw = STATES[state]
    library = next(world.lib.glob("libnvidia-ml.so*"))
    root = fake_nvml.make_root(tmp_path / "root", library, gpus=len(gpus))
    seen_by_nvml = None
    for build in builds:
        description = describe(world, build, f"equal-{state}", gpus, **kw)
        runner = RealRunner(build, description, world.lib)
        if seen_by_nvml is None:
            (root / "fake.desc").write_text(description.read_text())
            seen_by_nvml = nvml_facts(root)
        assert smi_facts(runner) == seen_by_nvml, build.ident
    assert seen_by_nvml, "the GPUs were read"
