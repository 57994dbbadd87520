"""The ``check`` rows of issue 17 on a running VM (contract section 5.1), through the real command:
each case's world is booted by the real ``podvm-gpu boot`` under the scenario harness (umockdev,
the case's fake tools), then ``podvm-gpu check --json`` runs on what that boot left.

- ``row-remapper``: the remapper per GPU, judged as the health gate judges it (S24-S27);
- ``module-lock``: ``kernel.modules_disabled`` and ``modules.lock_after_boot`` (S33);
- ``guest-tee``: the guest's TEE from the kernel's interfaces (S20, S30);
- ``modules``: the cause the boot's modules step gives, the driver's own words (S20, S23);
- ``confidential-computing``: dev-tools (``conf-compute -d``: ``DevTools Mode: ON``) judged as
  the boot judges it (S30, S31);
- ``confidential-computing``: several confidential GPUs judged by boot's multi-GPU rule
  (steps/cc/multigpu.py, issue 45: S450, S451);
- ``attestation``: not reached after a boot that failed before the CC step (C05, issue 35).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from scenarios.world import DATA, OWN_CASES, SHARED, World, load_case

pytestmark = pytest.mark.usefixtures("umockdev_run")


def case(prefix: str):
    for folder in (OWN_CASES, SHARED / "cases", DATA / "cases"):
        found = sorted(folder.glob(f"{prefix}-*.yaml"))
        if found:
            return load_case(found[0])
    raise FileNotFoundError(prefix)


def booted_check(the_case, after_boot=None) -> dict[str, dict]:
    """Boot the case's world, then ``check --json``: its rows by name."""
    with World(the_case) as world:
        world.run("boot")
        if after_boot:
            after_boot(world)
        run = world.run("check")
        assert run.rc in (0, 1), run.stderr
        return {row["name"]: row for row in json.loads(run.stdout)["checks"]}


def test_a_row_remapping_failure_fails_the_row_naming_the_gpu():
    row = booted_check(case("S24"))["row-remapper"]
    assert row["result"] == "fail", row
    assert row["detail"].startswith("GPU 00000000:00:04.0: row remapping failed"), row
    assert "replac" in row["hint"]


def test_a_pending_remap_fails_the_row_as_it_fails_the_boot():
    row = booted_check(case("S25"))["row-remapper"]
    assert row["result"] == "fail", row
    assert "GPU 00000000:00:04.0: a row remap is pending" in row["detail"]
    assert "GPU reset needed" in row["detail"] and "reset the GPU" in row["hint"]


def test_a_pending_remap_with_reset_pending_warns_is_a_warning():
    row = booted_check(case("S26"))["row-remapper"]
    assert row["result"] == "warn", row
    assert "a row remap is pending" in row["detail"] and "health.reset_pending_warns" in row["detail"]


def test_a_gpu_without_a_remapper_is_na_and_a_healthy_one_passes():
    row = booted_check(case("S27"))["row-remapper"]
    assert row["result"] == "skip", row
    assert "00000000:00:04.0 remapper N/A" in row["detail"]
    # P02: the harness answers the query for a healthy GPU as the real nvidia-smi does (0, 0)
    row = booted_check(case("P02"))["row-remapper"]
    assert row == {"name": "row-remapper", "result": "pass",
                   "detail": "00000000:00:04.0 remap pending 0, failure 0", "hint": ""}


def test_a_remapper_query_no_rule_answers_is_a_warning_not_a_failure():
    the_case = copy.deepcopy(case("S24"))
    for rule in the_case.tools:
        if rule["argv"][1:2] == ["--query-remapped-rows=gpu_bus_id,remapped_rows.pending,"
                                 "remapped_rows.failure"]:
            rule.update(rc=2, stdout='Field "remapped_rows.failure" is not a valid field to '
                        'query.\n')
    row = booted_check(the_case)["row-remapper"]
    assert row["result"] == "warn", row
    assert row["detail"].startswith("not read (nvidia-smi --query-remapped-rows"), row
    assert "exit 2" in row["detail"] and "not a valid field" in row["detail"]


def test_the_module_lock_the_config_asks_for_is_seen_on():
    checks = booted_check(case("S33"))
    row = checks["module-lock"]
    assert row["result"] == "pass", row
    assert "locked (/proc/sys/kernel/modules_disabled is 1)" in row["detail"]
    assert "modules.lock_after_boot is true" in row["detail"]


def test_a_module_lock_the_config_asks_for_but_that_is_off_fails():
    """The config asks for the lock, the boot that loaded the modules did not set it (here: the
    config changed after the boot, as an image update would leave it)."""
    def ask_for_the_lock(world):
        path = Path(world.path("/etc/podvm-gpu/config.yaml"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("modules:\n  lock_after_boot: true\n")

    the_case = copy.deepcopy(case("S33"))
    the_case.files.pop("etc/podvm-gpu/config.yaml")
    row = booted_check(the_case, after_boot=ask_for_the_lock)["module-lock"]
    assert row["result"] == "fail", row
    assert row["detail"] == ("modules.lock_after_boot is true but /proc/sys/kernel/"
                             "modules_disabled is 0: module loading is not locked")
    # and without the config asking: a plain fact
    the_case = copy.deepcopy(case("S33"))
    the_case.files.pop("etc/podvm-gpu/config.yaml")
    row = booted_check(the_case)["module-lock"]
    assert row["result"] == "pass" and "not locked" in row["detail"], row
    assert "modules.lock_after_boot is false" in row["detail"]
    # P02 has no /proc/sys/kernel/modules_disabled: unknown, not "not locked"
    row = booted_check(case("P02"))["module-lock"]
    assert row["result"] == "skip" and "modules_disabled is not readable" in row["detail"], row


def test_the_guest_tee_row_names_the_tee_and_its_evidence():
    row = booted_check(case("S30"))["guest-tee"]
    assert row == {"name": "guest-tee", "result": "pass",
                   "detail": "Intel TDX (/proc/cpuinfo flag tdx_guest)", "hint": ""}
    row = booted_check(case("P02"))["guest-tee"]
    assert row["result"] == "skip" and "no TEE evidence" in row["detail"], row


def test_the_modules_row_quotes_the_attach_cause_the_boot_gives():
    """S20: the driver loaded but cannot attach the GPU (the host left CC off): the boot's reason
    and check's modules row say the same, not that the modules are loaded."""
    the_case = case("S20")
    with World(the_case) as world:
        reason = world.run("boot").status["reason"]
        checks = {r["name"]: r for r in json.loads(world.run("check").stdout)["checks"]}
    row = checks["modules"]
    assert row["result"] == "fail", row
    said = " ".join(row["detail"].split("but the driver cannot attach the GPU: ", 1)[1].split())
    # the boot's reason (one line, spaces collapsed): that cause, then what section 9 adds
    assert reason.startswith(f"modules: the driver loaded but cannot attach the GPU: {said}"), \
        (row, reason)
    assert "confidential computing" in said and "0x22:0x3f:744" in said
    assert "Intel TDX (/proc/cpuinfo flag tdx_guest)" in row["detail"]
    assert checks["guest-tee"]["result"] == "pass"


def test_the_modules_row_names_a_module_the_kernel_could_not_decompress():
    row = booted_check(case("S23"))["modules"]
    assert row["result"] == "fail", row
    assert "could not decompress the module (status 6)" in row["detail"], row
    assert "XZ_OPTIONS_ERROR" in row["hint"] and "--check=crc32" in row["hint"]


def test_devtools_is_judged_as_the_boot_judges_it():
    row = booted_check(case("S30"))["confidential-computing"]
    assert row["result"] == "fail", row
    assert "DevTools Mode: ON" in row["detail"] and "allow_devtools" in row["hint"]
    row = booted_check(case("S31"))["confidential-computing"]
    assert row["result"] == "warn", row
    assert row["detail"].startswith("CC devtools (allowed by confidential_computing."
                                    "allow_devtools"), row


@pytest.mark.parametrize("prefix, state, result", [("S450", "failed", "fail"),
                                                   ("S451", "ready", "warn")])
def test_several_confidential_gpus_are_judged_by_check_as_by_the_boot(prefix, state, result):
    """Issue 45 item 3: check's row applies boot's multi-GPU rule (one function): two H100s,
    ``Multi-GPU Mode: None``, in a TDX guest fail both; with
    ``confidential_computing.allow_unsupported_multi_gpu`` both accept them with the same
    warning."""
    with World(case(prefix)) as world:
        boot = world.run("boot")
        run = world.run("check")
    assert boot.status["state"] == state, boot.status
    row = {r["name"]: r for r in json.loads(run.stdout)["checks"]}["confidential-computing"]
    assert row["result"] == result, row
    said = "2 confidential GPUs (Hopper) with Multi-GPU Mode: None in a confidential guest"
    assert said in row["detail"], row
    if state == "failed":  # the same failure and fix, word for word
        assert f"confidential-computing: {row['detail']}; {row['hint']}" in boot.status["reason"]
    else:
        warning = next(w for w in boot.status["warnings"] if said in w)
        assert warning.removeprefix("confidential-computing: ") in row["detail"], (warning, row)


def test_the_attestation_row_after_a_boot_that_failed_at_modules_is_not_reached():
    """Issue 35 item 1: the row read ``.message`` of the not-reached Check (it has ``.detail``)
    and crashed in every world whose boot failed before the CC step (C05 here)."""
    rows = booted_check(case("C05"))
    assert rows["attestation"]["result"] == "skip", rows["attestation"]
    assert rows["attestation"]["detail"] == \
        "not reached: the last boot failed at modules (see status)"


XID_79 = "NVRM: Xid (PCI:0000:00:04): 79, pid=123, GPU has fallen off the bus."


def test_a_ready_boot_whose_only_gpu_left_pci_fails_naming_the_gpu_and_the_xid():
    """Issue 47 item 1: a ready boot's root (status ready, one GPU, ready spec), the GPU no longer
    on PCI, Xid 79 in the kernel log: check exits 1, ``pci`` names the gone GPU and the Xid,
    ``cdi-spec`` fails the ready spec that names GPUs none of which is on PCI."""
    with World(case("P02")) as world:
        assert world.run("boot").rc == 0
        world._config["pci"] = []  # hot-removed: the next run's PCI tree has no GPU
        with open(world.path("/dev/kmsg"), "a") as kmsg:
            kmsg.write(f"3,9000,900000000,-;{XID_79}\n")
        run = world.run("check")
    assert run.rc == 1, run.stdout
    rows = {row["name"]: row for row in json.loads(run.stdout)["checks"]}
    pci = rows["pci"]
    assert pci["result"] == "fail", pci
    assert "0000:00:04.0" in pci["detail"] and "Xid 79" in pci["detail"], pci
    assert rows["cdi-spec"]["result"] == "fail", rows["cdi-spec"]
    assert "none of which is on PCI" in rows["cdi-spec"]["detail"], rows["cdi-spec"]
