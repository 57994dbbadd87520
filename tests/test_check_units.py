"""systemd units read without systemctl (podvm_gpu.units) and the checks built on them:
``cdi-refresh-units`` and ``kata-agent-ordering`` (podvm_gpu.check; contract sections 1, 5
and 6). kata-agent's ``cdi_timeout``: tests/test_kata_cdi.py.

Every test lays out unit files, drop-ins and ``.wants`` links under a temp root the way
``systemctl enable``/``mask`` and package installs leave them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from podvm_gpu import units
from podvm_gpu.check import FAIL, PASS, SKIP
from podvm_gpu.check.units import kata_ordering_check, refresh_units_check
from podvm_gpu.host.fs import Root

REPO = Path(__file__).resolve().parents[1]
ETC = "etc/systemd/system"
USR = "usr/lib/systemd/system"

KATA_UNIT = """\
[Unit]
Description=Kata Containers agent
After=network.target

[Service]
ExecStart=/usr/local/bin/kata-agent

[Install]
WantedBy=multi-user.target
"""

AGENT_UNIT = """\
[Unit]
Description=podvm-gpu
After=systemd-modules-load.service

[Service]
Type=oneshot
ExecStart=/opt/podvm-gpu/bin/podvm-gpu boot

[Install]
WantedBy=multi-user.target
"""


class UnitTree:
    """Unit files under a temp root, written as packages and systemctl leave them."""

    def __init__(self, path: Path):
        self.path = path
        self.root = Root(path)

    def file(self, rel: str, text: str) -> Path:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    def install(self, unit: str, text: str, folder: str = USR) -> None:
        self.file(f"{folder}/{unit}", text)

    def enable(self, unit: str, target: str = "multi-user.target", folder: str = ETC) -> None:
        """``systemctl enable``: a link in ``<target>.wants`` to the unit's file."""
        wants = self.path / folder / f"{target}.wants"
        wants.mkdir(parents=True, exist_ok=True)
        os.symlink(f"/{USR}/{unit}", wants / unit)

    def mask(self, unit: str) -> None:
        """``systemctl mask``: a link to /dev/null in /etc/systemd/system."""
        (self.path / ETC).mkdir(parents=True, exist_ok=True)
        os.symlink("/dev/null", self.path / ETC / unit)

    def dropin(self, unit: str, name: str, text: str, folder: str = ETC) -> None:
        self.file(f"{folder}/{unit}.d/{name}", text)


@pytest.fixture
def tree(tmp_path) -> UnitTree:
    return UnitTree(tmp_path)


# --- podvm_gpu.units --------------------------------------------------------------------------------

def test_unit_file_prefers_etc_over_usr_lib(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    assert units.unit_file(tree.root, "kata-agent.service") == f"/{USR}/kata-agent.service"

    tree.install("kata-agent.service", KATA_UNIT, folder=ETC)
    assert units.unit_file(tree.root, "kata-agent.service") == f"/{ETC}/kata-agent.service"


def test_unit_file_is_none_when_not_installed(tree):
    assert units.unit_file(tree.root, "kata-agent.service") is None


def test_enabled_by_names_the_wants_and_requires_folders(tree):
    tree.install("podvm-gpu.service", AGENT_UNIT)
    tree.enable("podvm-gpu.service")
    link = tree.path / ETC / "kata-containers.target.requires"
    link.mkdir(parents=True)
    os.symlink(f"/{USR}/podvm-gpu.service", link / "podvm-gpu.service")

    assert sorted(units.enabled_by(tree.root, "podvm-gpu.service")) == [
        "kata-containers.target.requires", "multi-user.target.wants"]
    assert units.enabled_by(tree.root, "kata-agent.service") == []


def test_masked_means_a_link_to_dev_null(tree):
    tree.install("nvidia-cdi-refresh.service", "[Unit]\n")
    assert not units.masked(tree.root, "nvidia-cdi-refresh.service")

    tree.mask("nvidia-cdi-refresh.service")
    assert units.masked(tree.root, "nvidia-cdi-refresh.service")


def test_unit_settings_merge_drop_ins_in_name_order(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    tree.dropin("kata-agent.service", "20-late.conf", "[Unit]\nAfter=late.service\n")
    tree.dropin("kata-agent.service", "10-podvm-gpu.conf",
                "[Unit]\nWants=podvm-gpu.service\nAfter=podvm-gpu.service other.service\n",
                folder=USR)

    settings = units.unit_settings(tree.root, "kata-agent.service")

    assert settings["After"] == ["network.target", "podvm-gpu.service", "other.service",
                                 "late.service"]
    assert settings["Wants"] == ["podvm-gpu.service"]


def test_a_drop_in_in_etc_overrides_the_one_of_the_same_name_in_usr_lib(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    tree.dropin("kata-agent.service", "10-podvm-gpu.conf", "[Unit]\nAfter=podvm-gpu.service\n",
                folder=USR)
    tree.dropin("kata-agent.service", "10-podvm-gpu.conf", "[Unit]\nDescription=emptied\n")

    assert "podvm-gpu.service" not in units.unit_settings(tree.root, "kata-agent.service").get(
        "After", [])


def test_settings_of_other_sections_are_not_read_as_unit_settings(tree):
    tree.install("kata-agent.service", KATA_UNIT.replace(
        "[Service]\n", "[Service]\nAfter=podvm-gpu.service\n"))

    assert "podvm-gpu.service" not in units.unit_settings(tree.root, "kata-agent.service")["After"]


# --- kata-agent-ordering ------------------------------------------------------------------------------

def test_kata_ordering_skips_without_kata_agent_service(tree):
    tree.install("podvm-gpu.service", AGENT_UNIT)

    check = kata_ordering_check(tree.root)

    assert check.name == "kata-agent-ordering" and check.result == SKIP


def test_kata_ordering_passes_with_the_projects_drop_in(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    tree.install("podvm-gpu.service", AGENT_UNIT)
    dropin = tree.path / ETC / "kata-agent.service.d" / "10-podvm-gpu.conf"
    dropin.parent.mkdir(parents=True)
    shutil.copy(REPO / "systemd" / "kata-agent.service.d" / "10-podvm-gpu.conf", dropin)

    check = kata_ordering_check(tree.root)

    assert check.result == PASS, check
    assert "After=podvm-gpu.service" in check.detail


def test_kata_ordering_passes_with_a_drop_in_after(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    tree.dropin("kata-agent.service", "50-gpu.conf", "[Unit]\nAfter=podvm-gpu.service\n")

    assert kata_ordering_check(tree.root).result == PASS


def test_kata_ordering_passes_with_before_in_the_agents_unit(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    tree.install("podvm-gpu.service", AGENT_UNIT.replace(
        "After=systemd-modules-load.service\n",
        "After=systemd-modules-load.service\nBefore=kata-agent.service\n"))

    check = kata_ordering_check(tree.root)

    assert check.result == PASS
    assert "Before=kata-agent.service" in check.detail


def test_kata_ordering_fails_when_both_are_only_pulled_in_by_a_target(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    tree.install("podvm-gpu.service", AGENT_UNIT)
    tree.enable("kata-agent.service")
    tree.enable("podvm-gpu.service")

    check = kata_ordering_check(tree.root)

    assert check.result == FAIL
    assert check.hint  # says what to install


def test_kata_ordering_fails_when_the_agent_is_only_wanted_not_ordered(tree):
    tree.install("kata-agent.service", KATA_UNIT)
    tree.dropin("kata-agent.service", "10-podvm-gpu.conf", "[Unit]\nWants=podvm-gpu.service\n")

    assert kata_ordering_check(tree.root).result == FAIL


def test_an_empty_after_in_a_later_drop_in_does_not_remove_the_ordering(tree):
    """systemd.unit(5): "Dependencies (After=, etc.) cannot be reset to an empty list, so
    dependencies can only be added in drop-ins." systemd still orders kata-agent after the agent
    here, so the check must not fail."""
    tree.install("kata-agent.service", KATA_UNIT)
    tree.dropin("kata-agent.service", "10-podvm-gpu.conf", "[Unit]\nAfter=podvm-gpu.service\n")
    tree.dropin("kata-agent.service", "99-reset.conf", "[Unit]\nAfter=\n")

    assert "podvm-gpu.service" in units.unit_settings(tree.root, "kata-agent.service")["After"]
    assert kata_ordering_check(tree.root).result == PASS


# --- cdi-refresh-units ----------------------------------------------------------------------------

def install_refresh_units(tree: UnitTree) -> None:
    tree.install("nvidia-cdi-refresh.service", "[Service]\nType=oneshot\n")
    tree.install("nvidia-cdi-refresh.path", "[Path]\nPathChanged=/lib/modules\n")


def test_refresh_units_installed_but_not_enabled_pass(tree):
    install_refresh_units(tree)

    check = refresh_units_check(tree.root)

    assert check.name == "cdi-refresh-units" and check.result == PASS


def test_refresh_units_enabled_fail(tree):
    install_refresh_units(tree)
    tree.enable("nvidia-cdi-refresh.path")

    check = refresh_units_check(tree.root)

    assert check.result == FAIL
    assert "nvidia-cdi-refresh.path" in check.detail
    assert "mask" in check.hint


def test_refresh_units_enabled_by_the_vendor_preset_in_usr_lib_fail(tree):
    install_refresh_units(tree)
    tree.enable("nvidia-cdi-refresh.service", folder=USR)

    assert refresh_units_check(tree.root).result == FAIL


def test_refresh_units_masked_pass_even_with_a_leftover_wants_link(tree):
    install_refresh_units(tree)
    tree.enable("nvidia-cdi-refresh.path")
    tree.enable("nvidia-cdi-refresh.service")
    tree.mask("nvidia-cdi-refresh.path")
    tree.mask("nvidia-cdi-refresh.service")

    check = refresh_units_check(tree.root)

    assert check.result == PASS
    assert "masked" in check.detail


def test_no_refresh_units_at_all_pass(tree):
    assert refresh_units_check(tree.root).result == PASS


# --- attestation-agent-ordering (podvm_gpu/steps/cc/rows.py) ---------------------------------------

ATTESTATION_UNIT = """\
[Unit]
Description=Attestation Agent (guest-components)
After=process-user-data.service

[Service]
ExecStart=/usr/local/bin/attestation-agent

[Install]
WantedBy=multi-user.target
"""


def test_attestation_agent_ordering_skips_without_attestation_agent(tree):
    from podvm_gpu.steps.cc.rows import attestation_agent_ordering

    tree.install("podvm-gpu.service", AGENT_UNIT)
    check = attestation_agent_ordering(tree.root)
    assert (check.name, check.result) == ("attestation-agent-ordering", SKIP), check


def test_attestation_agent_ordered_only_after_process_user_data_fails(tree):
    from podvm_gpu.steps.cc.rows import attestation_agent_ordering

    tree.install("attestation-agent.service", ATTESTATION_UNIT)
    tree.install("podvm-gpu.service", AGENT_UNIT)
    check = attestation_agent_ordering(tree.root)
    assert check.result == FAIL, check
    assert "attestation-agent.service.d/10-podvm-gpu.conf" in check.hint


def test_attestation_agent_ordering_passes_with_the_projects_drop_in(tree):
    from podvm_gpu.steps.cc.rows import attestation_agent_ordering

    tree.install("attestation-agent.service", ATTESTATION_UNIT)
    tree.install("podvm-gpu.service", AGENT_UNIT)
    dropin = tree.path / ETC / "attestation-agent.service.d" / "10-podvm-gpu.conf"
    dropin.parent.mkdir(parents=True)
    shutil.copy(REPO / "systemd" / "attestation-agent.service.d" / "10-podvm-gpu.conf", dropin)
    check = attestation_agent_ordering(tree.root)
    assert check.result == PASS and "After=podvm-gpu.service" in check.detail, check


def test_attestation_agent_ordering_passes_with_the_agents_before(tree):
    from podvm_gpu.steps.cc.rows import attestation_agent_ordering

    tree.install("attestation-agent.service", ATTESTATION_UNIT)
    tree.install("podvm-gpu.service", (REPO / "systemd/podvm-gpu.service").read_text())
    check = attestation_agent_ordering(tree.root)
    assert check.result == PASS and "Before=attestation-agent.service" in check.detail, check


def _watch_root(tmp_path: Path, state: str | None, gpus: int = 1, watch: dict | None = None,
                enabled: bool = True) -> Root:
    """A root with podvm-gpu-watch.service installed (and enabled), a status of ``state`` and
    an optional watch.json (issue 34)."""
    import json

    from podvm_gpu.watchfile import WATCH_PATH, new_state

    units_dir = tmp_path / "usr/lib/systemd/system"
    units_dir.mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "systemd/podvm-gpu-watch.service", units_dir)
    if enabled:
        wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True)
        (wants / "podvm-gpu-watch.service").symlink_to(f"/{units_dir.relative_to(tmp_path)}/"
                                                        "podvm-gpu-watch.service")
    run = tmp_path / "run/podvm-gpu"
    run.mkdir(parents=True)
    if state == "ready":  # a whole ready document: a minimal one is unreadable (issue 35 item 8)
        import fake_nvml

        fake_nvml.make_root(tmp_path, None, state="ready", gpus=gpus, persistenced=False)
    elif state:
        (run / "status.json").write_text(json.dumps({
            "state": state, "reason": None, "warnings": [], "started_at": "t",
            "gpus": [{"pci_address": "0000:00:04.0"}] * gpus}))
    if watch is not None:
        (tmp_path / WATCH_PATH.lstrip("/")).write_text(json.dumps({**new_state("t"), **watch}))
    return Root(str(tmp_path))


def test_watch_row_passes_while_the_watcher_watches_a_ready_boot(tmp_path):
    from podvm_gpu.check.units import watch_unit_check

    row = watch_unit_check(_watch_root(tmp_path, "ready", watch={"kmsg_seq": 41,
                                                                  "started_at": "s"}), vm=True)
    assert row.result == PASS and "kernel log record 41" in row.detail


@pytest.mark.parametrize("seq", [-1, None])
def test_watch_row_of_a_watcher_that_read_no_record_says_so_plainly(tmp_path, seq):
    """It said "kernel log record -1" for a log that was empty when the watcher started (the
    watcher's own start line said "after record -1" too)."""
    from podvm_gpu.check.units import watch_unit_check

    row = watch_unit_check(_watch_root(tmp_path, "ready", watch={"kmsg_seq": seq,
                                                                  "started_at": "s"}), vm=True)
    assert row.result == PASS
    assert row.detail == "watching since s, kernel log from its start (no record read yet)"


def test_watch_row_fails_on_a_finding_and_hints_at_replacing_the_vm(tmp_path):
    from podvm_gpu.check.units import watch_unit_check

    finding = {"reason": "watch: GPU 0000:00:04.0: Xid 79", "gpu": "0000:00:04.0"}
    row = watch_unit_check(_watch_root(tmp_path, "failed", watch={"finding": finding}), vm=True)
    assert row.result == FAIL and "Xid 79" in row.detail
    assert "replace the VM" in row.hint and "podvm-gpu watch --clear" in row.hint


def test_watch_row_warns_when_a_ready_boot_has_no_watcher(tmp_path):
    from podvm_gpu.check import WARN
    from podvm_gpu.check.units import watch_unit_check

    row = watch_unit_check(_watch_root(tmp_path, "ready"), vm=True)
    assert row.result == WARN and "has not started" in row.detail


@pytest.mark.parametrize("state, gpus", [("no-gpu", 0), ("failed", 1), (None, 0)])
def test_watch_row_skips_when_there_is_nothing_to_watch(tmp_path, state, gpus):
    from podvm_gpu.check.units import watch_unit_check

    assert watch_unit_check(_watch_root(tmp_path, state, gpus), vm=True).result == SKIP


def test_watch_row_of_an_image_warns_when_the_unit_is_not_enabled(tmp_path):
    from podvm_gpu.check import WARN
    from podvm_gpu.check.units import watch_unit_check

    row = watch_unit_check(_watch_root(tmp_path, None, enabled=False), vm=False)
    assert row.result == WARN and "not enabled" in row.detail
