"""What probes and a new user found (issue 10), each pinned by the real command: crashes and
non-final ends, false ``ready`` and hidden causes, trust. Every test here failed before its fix.

The CPU-VM tests run ``podvm-gpu`` under the CPU-VM umockdev tree on a temporary root; the GPU
ones are scenario worlds (tests/scenarios) built from the shared P02 (1 x H100) and P03 (8 x H200
+ 4 NVSwitch) cases with one thing changed.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from scenarios.world import DATA, SHARED, World, load_case


def case(name: str):
    return load_case(next(p for p in (SHARED / "cases" / name, DATA / "cases" / name)
                          if p.exists()))


def p02():
    return case("P02-one-h100-pcie-ready.yaml")


def p03():
    return case("P03-hgx-h200-8gpu-4nvswitch-ready.yaml")


def rule(world_case, argv: list[str]) -> dict:
    return next(r for r in world_case.tools if r["argv"] == argv)


def boot(podvm, root: Path, empty_path: str, *args: str, timeout: float = 30, **env):
    return podvm(["boot", "--root", str(root), *args], tree="cpu-vm",
                 env={"PATH": empty_path, **env}, timeout=timeout)


def status_of(root: Path) -> dict:
    return json.loads((root / "run/podvm-gpu/status.json").read_text())


def spec_of(root: Path) -> dict:
    return yaml.safe_load((root / "var/run/cdi/nvidia.yaml").read_text())


def no_traceback(done) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr


def nested_json(depth: int) -> str:
    return '{"kind": "nvidia.com/gpu", "x": ' + "[" * depth + "]" * depth + "}"


# --- crashes and non-final ends -------------------------------------------------------------------

@pytest.mark.parametrize("name, text", [("deep.json", nested_json(1000)),
                                        ("deep.yaml", "kind: nvidia.com/gpu\nx: " + "[" * 1000
                                         + "]" * 1000)])
def test_a_spec_nested_1000_deep_in_var_run_cdi_ends_the_boot_no_gpu_with_a_warning(
        tmp_path, podvm, empty_path, name, text):
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    (tmp_path / "var/run/cdi" / name).write_text(text)

    done = boot(podvm, tmp_path, empty_path)

    no_traceback(done)
    assert done.returncode == 0
    status = status_of(tmp_path)
    assert status["state"] == "no-gpu"
    assert any(f"/var/run/cdi/{name} could not be read (nested too deeply" in w
               for w in status["warnings"]), status["warnings"]
    assert [d["name"] for d in spec_of(tmp_path)["devices"]] == ["unavailable"]


def test_a_status_file_nested_1000_deep_is_unreadable_not_a_crash(tmp_path, podvm):
    (tmp_path / "run/podvm-gpu").mkdir(parents=True)
    (tmp_path / "run/podvm-gpu/status.json").write_text(nested_json(1000))

    plain = podvm(["status", "--root", str(tmp_path)])
    as_json = podvm(["status", "--root", str(tmp_path), "--json"])
    check = podvm(["check", "--root", str(tmp_path), "--json"])

    for done in (plain, as_json, check):
        no_traceback(done)
    assert plain.returncode == 3 and "unreadable status file" in plain.stdout
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["state"] is None
    rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    assert rows["status"]["result"] == "fail" and "nested too deeply" in rows["status"]["detail"]


@pytest.mark.parametrize("text, words", [
    ("budget_s: " + "[" * 1000 + "]" * 1000 + "\n", "nested too deeply"),
    ("budget_s: " + "9" * 5000 + "\n", "4300 digits"),
])
def test_a_hostile_config_ends_failed_naming_the_file_not_an_internal_error(
        tmp_path, podvm, empty_path, text, words):
    config = tmp_path / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(text)

    done = boot(podvm, tmp_path, empty_path)

    no_traceback(done)
    assert done.returncode == 1
    reason = status_of(tmp_path)["reason"]
    assert reason.startswith(f"config: {config}: ") and words in reason, reason
    assert "internal error" not in reason
    assert spec_of(tmp_path)["devices"][0]["name"] == "unavailable"


@pytest.mark.parametrize("how", ["loop", "dangling", "asked-for-missing"])
def test_a_config_that_cannot_be_there_is_an_error_not_the_defaults(tmp_path, podvm, empty_path,
                                                                   how):
    """A config link loop gave a traceback and no status; a dangling link, or a --config that
    names no file, silently meant the defaults."""
    folder = tmp_path / "etc/podvm-gpu"
    folder.mkdir(parents=True)
    args = []
    if how == "loop":
        os.symlink("config.yaml", folder / "config.yaml")
    elif how == "dangling":
        os.symlink("/etc/podvm-gpu/gone.yaml", folder / "config.yaml")
    else:
        args = ["--config", str(tmp_path / "nonexistent.yaml")]

    done = boot(podvm, tmp_path, empty_path, *args)

    no_traceback(done)
    assert done.returncode == 1
    status = status_of(tmp_path)
    assert status["state"] == "failed" and status["reason"].startswith("config: "), status
    assert spec_of(tmp_path)["devices"][0]["name"] == "unavailable"


def test_check_on_a_root_whose_var_run_is_a_link_loop_reports_instead_of_crashing(tmp_path,
                                                                                  podvm):
    (tmp_path / "var").mkdir()
    os.symlink("/var/run", tmp_path / "var/run")

    done = podvm(["check", "--root", str(tmp_path)])

    no_traceback(done)
    assert done.returncode == 1
    assert "cdi-spec" in done.stdout and \
        "Too many levels of symbolic links" in " ".join(done.stdout.split())


def test_check_prints_text_that_looks_like_markup_as_it_is(tmp_path, podvm):
    """rich read '[/...]' in a detail as a closing tag and crashed (MarkupError)."""
    (tmp_path / "run/podvm-gpu").mkdir(parents=True)
    reason = "modules: modprobe: ERROR: [/lib/modules/x] could not insert 'nvidia' [bold]"
    (tmp_path / "run/podvm-gpu/status.json").write_text(json.dumps(
        {"version": 1, "state": "failed", "reason": reason, "warnings": [], "steps": []}))

    done = podvm(["check", "--root", str(tmp_path)])

    no_traceback(done)
    # the table wraps a detail at its width (issue 35 item 3): read it with the lines joined
    assert f"boot failed: {reason}" in " ".join(done.stdout.split())


def test_a_fifo_as_status_json_blocks_neither_status_wait_nor_check(tmp_path, podvm):
    (tmp_path / "run/podvm-gpu").mkdir(parents=True)
    os.mkfifo(tmp_path / "run/podvm-gpu/status.json")

    started = time.monotonic()
    waited = podvm(["status", "--root", str(tmp_path), "--wait", "--timeout", "1"], timeout=10)
    took = time.monotonic() - started
    check = podvm(["check", "--root", str(tmp_path), "--json"], timeout=10)

    assert waited.returncode == 3 and took < 5, took
    assert "not a regular file" in waited.stdout
    rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    assert rows["status"]["result"] == "fail"


# --- stale and hidden specs ------------------------------------------------------------------------

def big_gpu_spec(size: int) -> str:
    """A spec of our kind, ``size`` bytes or more (env entries, as a real spec has lines)."""
    lines = ["cdiVersion: 0.5.0", "kind: nvidia.com/gpu", "devices:", "- name: '0'",
             "  containerEdits:", "    env:"]
    entry = "    - PADDING=" + "x" * 100
    lines += [entry] * (size // len(entry) + 1)
    return "\n".join(lines) + "\n"


def test_a_stale_spec_of_our_kind_over_1_mib_is_still_renamed(tmp_path, podvm, empty_path):
    """Only its first MiB was read: a JSON spec cut there does not parse, so its kind was never
    seen (nvidia-ctk --format=json writes one line)."""
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    spec = yaml.safe_load(big_gpu_spec(3 << 20))
    (tmp_path / "var/run/cdi/toolkit.json").write_text(json.dumps(spec, separators=(",", ":")))

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "var/run/cdi")) == [
        "nvidia.yaml", "toolkit.json.disabled-by-podvm-gpu"]


def test_a_spec_too_large_to_read_is_reported_in_the_status_and_by_check(tmp_path, podvm,
                                                                        empty_path):
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    with open(tmp_path / "var/run/cdi/huge.json", "wb") as f:
        f.truncate(40 << 20)  # sparse: 40 MiB of nothing that a reader would still scan

    done = boot(podvm, tmp_path, empty_path)
    check = podvm(["check", "--root", str(tmp_path), "--json"])

    assert done.returncode == 0, done.stderr
    assert any("/var/run/cdi/huge.json could not be read (larger than 32 MiB)" in w
               for w in status_of(tmp_path)["warnings"])
    rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    assert rows["cdi-duplicates"]["result"] == "fail" and "huge.json" in \
        rows["cdi-duplicates"]["detail"]


def test_a_duplicate_that_is_a_symlink_into_etc_cdi_is_renamed_and_its_target_reported(
        tmp_path, podvm, empty_path):
    """kata-agent's CDI reader follows the link, so the link is a spec of our kind: the link
    itself is renamed (never its target), and the target in /etc/cdi is reported."""
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    (tmp_path / "etc/cdi").mkdir(parents=True)
    (tmp_path / "etc/cdi/nvidia.yaml").write_text(big_gpu_spec(1000))
    os.symlink("/etc/cdi/nvidia.yaml", tmp_path / "var/run/cdi/toolkit.yaml")

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 0, done.stderr
    assert os.path.islink(tmp_path / "var/run/cdi/toolkit.yaml.disabled-by-podvm-gpu")
    assert (tmp_path / "etc/cdi/nvidia.yaml").is_file()
    warnings = status_of(tmp_path)["warnings"]
    assert any("/var/run/cdi/toolkit.yaml also defined nvidia.com/gpu; renamed" in w
               for w in warnings), warnings
    assert any("/etc/cdi/nvidia.yaml also defines nvidia.com/gpu" in w for w in warnings)


def test_without_the_unavailable_spec_a_failed_boot_removes_the_previous_ready_spec(
        tmp_path, podvm, empty_path):
    (tmp_path / "etc/podvm-gpu").mkdir(parents=True)
    (tmp_path / "etc/podvm-gpu/config.yaml").write_text("unavailable_spec: false\n")
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    (tmp_path / "var/run/cdi/nvidia.yaml").write_text(big_gpu_spec(100))

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 0, done.stderr
    assert status_of(tmp_path)["state"] == "no-gpu"
    assert not (tmp_path / "var/run/cdi/nvidia.yaml").exists()


# --- false ready and hidden causes on the GPU path ------------------------------------------------

def test_a_spec_cut_short_at_a_line_boundary_does_not_end_ready():
    """nvidia-ctk's stdout cut before its mounts (exit 0) still parses; the spec lacks the
    driver's NVML and CUDA libraries, so it must not pass."""
    world_case = copy.deepcopy(p02())
    full = (DATA / "fixtures/nvidia-ctk/spec-1gpu.yaml").read_text()
    cut = full[:full.index("    mounts:")]
    generate = rule(world_case, ["nvidia-ctk", "cdi", "generate"])
    generate.update(effects=[{"write_spec_text": cut}])
    with World(world_case) as world:
        run = world.run("boot")

    assert run.rc == 1 and run.status["state"] == "failed", run.status
    assert run.status["reason"].startswith("cdi: the generated spec is not usable: the spec mounts "
                                           "no libnvidia-ml.so.550.54.15"), run.status["reason"]


@pytest.mark.parametrize("make, words", [
    ("missing", "nvidia-ctk: not found on PATH"),
    ("not-executable", "nvidia-ctk: {bin}/nvidia-ctk is not executable"),
    ("broken", "nvidia-ctk: cannot run: Exec format error"),
])
def test_a_missing_or_broken_nvidia_ctk_is_named_as_such(make, words):
    world_case = copy.deepcopy(p02())
    with World(world_case) as world:
        tool = Path(world.layout.bin) / "nvidia-ctk"
        first = world.run("boot")
        assert first.status["state"] == "ready", first.status  # nodes via mknod, spec written
        if make == "missing":
            tool.unlink()
        elif make == "not-executable":
            tool.chmod(0o644)
        else:
            tool.write_bytes(b"\x7fELF\x02\x01\x01garbage")
        again = world.run("rerun")

    assert again.rc == 1, again.stderr
    reason = again.status["reason"]
    assert reason.startswith(f"cdi: {words.format(bin=world.layout.bin)}"), reason
    assert "no output" not in reason and "exit None" not in reason


def test_the_cause_in_an_earlier_warning_of_nvidia_ctk_is_named():
    world_case = copy.deepcopy(p02())
    generate = rule(world_case, ["nvidia-ctk", "cdi", "generate"])
    generate.update(effects=[], rc=1, stderr=(
        'level=info msg="Auto-detected mode as \'nvml\'"\n'
        'level=warning msg="Could not locate vulkan/icd.d/nvidia_icd.json: not found"\n'
        'level=warning msg="Could not locate libcuda.so.550.54.15: libcuda.so.550.54.15: not found"\n'
        'level=error msg="failed to generate CDI spec: failed to create device CDI specs: '
        'failed to create discoverer"\n'))
    with World(world_case) as world:
        run = world.run("boot")

    reason = run.status["reason"]
    assert "it warned: Could not locate libcuda.so.550.54.15" in reason, reason
    assert "vulkan" not in reason


def answer_fabric_query(world: World, text: str) -> None:
    """Make the fabric query (``nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status
    --format=csv,noheader``) print ``text`` (the harness owns that query's answer);
    every other call goes to the world's fake nvidia-smi, moved into a folder of its own so
    that it still sees its own name."""
    fake = Path(world.layout.bin) / "nvidia-smi"
    (Path(world.layout.bin) / ".harness").mkdir()
    real = Path(world.layout.bin) / ".harness" / "nvidia-smi"
    fake.rename(real)
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = \"--query-gpu=pci.bus_id,fabric.state,"
                    f"fabric.status\" ]; then printf '%s' "
                    f"'{text}'; exit 0; fi\nexec {real} \"$@\"\n")
    fake.chmod(0o755)


def test_the_fabric_wait_needs_every_gpu_not_a_partial_list():
    """nvidia-smi showing 1 of 8 GPUs Completed/Success ended ready."""
    world_case = copy.deepcopy(p03())
    one_gpu = "00000000:18:00.0, state  Completed, status Success\n"  # as the real program prints
    world_case.files["etc/podvm-gpu/config.yaml"] = (
        "fabricmanager: {ready_timeout_s: 1, per_gpu_s: 0, poll_s: 0.2}\n")
    with World(world_case) as world:
        answer_fabric_query(world, one_gpu)
        run = world.run("boot")

    assert run.rc == 1, run.stderr
    reason = run.status["reason"]
    # the query's rows are the GPUs NVML lists: 1 of the 8 on PCI
    assert reason.startswith("fabricmanager: NVML sees 1 of the 8 GPU(s) on PCI; not seen: "
                             "0000:2a:00.0"), reason
    assert "fabric: State Completed, Status Success on 1 GPU(s)" in reason


def test_a_fabric_manager_that_cannot_tell_its_version_is_not_taken_on_trust():
    world_case = copy.deepcopy(p03())
    version = rule(world_case, ["nv-fabricmanager", "--version"])
    version.update(rc=2, stdout="", stderr="nv-fabricmanager: error while loading shared "
                                           "libraries: libnvfm.so: cannot open shared object\n")
    with World(world_case) as world:
        run = world.run("boot")

    assert run.rc == 1
    assert run.status["reason"].startswith("versions: cannot tell the fabric manager's version "
                                           "(nv-fabricmanager --version exit 2: "), run.status
    assert "libnvfm.so" in run.status["reason"]
    assert not [c for c in run.calls if c.argv[0] == "nvidia-persistenced"]


def test_without_nvidia_smi_an_nvswitch_vm_fails_the_fabric_wait_at_once():
    world_case = copy.deepcopy(p03())
    with World(world_case) as world:
        (Path(world.layout.bin) / "nvidia-smi").unlink()
        run = world.run("boot")

    assert run.rc == 1
    assert run.status["reason"].startswith("fabricmanager: cannot query the NVLink fabric: "
                                           "nvidia-smi: not found on PATH"), run.status["reason"]
    fabric = next(s for s in run.status["steps"] if s["name"] == "fabricmanager")
    assert fabric["duration_s"] < 5, fabric


def test_a_hung_optional_module_does_not_spend_the_budget_of_the_next_steps():
    """modprobe nvidia_modeset hanging cost its whole 60 s timeout (here: the whole budget), and
    the next step was blamed. An optional module gets at most 10 s and a warning."""
    world_case = copy.deepcopy(p02())
    world_case.files["etc/podvm-gpu/config.yaml"] = "budget_s: 30\n"
    rule(world_case, ["modprobe", "nvidia_modeset"])["delay_s"] = 3600
    with World(world_case) as world:
        run = world.run("boot")

    assert run.rc == 0 and run.status["state"] == "ready", run.status
    assert any("optional module nvidia_modeset not loaded (modprobe nvidia_modeset timed out after "
               "10 s)" in w
               for w in run.status["warnings"]), run.status["warnings"]
    assert run.wall_s < 20


def test_the_driver_s_own_error_records_are_quoted_when_a_step_fails():
    """Beyond the patterns the agent knows: the NVIDIA modules' error records since the
    driver's banner (here an RmInitAdapter failure and an SPDM check in CC mode)."""
    world_case = copy.deepcopy(p02())
    world_case.kernel_log += [
        "NVRM: GPU 0000:00:04.0: RmInitAdapter failed! (0x62:0x65:2013)",
        "NVRM: GPU 0000:00:04.0: rm_init_adapter failed, device minor number 0",
        "NVRM: spdmCheckAndExecuteKeyUpdate: SPDM key update failed with 0x56",
    ]
    generate = rule(world_case, ["nvidia-ctk", "cdi", "generate"])
    generate.update(effects=[], rc=1, stderr='level=error msg="failed to initialize NVML: '
                                             'Unknown Error"\n')
    with World(world_case) as world:
        run = world.run("boot")

    reason = run.status["reason"]
    # since issue 17 an adapter that failed to initialise fails the modules step at once, in the
    # driver's words, instead of the first NVML client's ("failed to initialize NVML")
    assert reason.startswith("modules: the driver loaded but cannot attach the GPU"), reason
    assert "failed to initialize NVML" not in reason
    for said in ("RmInitAdapter failed! (0x62:0x65:2013)",
                 "rm_init_adapter failed, device minor number 0",
                 "SPDM key update failed with 0x56"):
        assert said in reason, reason


# --- trust and leftovers ----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["world-writable", "owned-by-another-user", "folder-writable"])
def test_boot_refuses_a_config_another_user_could_have_written(tmp_path, podvm, empty_path, how):
    """A 0666 config owned by another user was trusted, and its tools: entry ran a binary of
    that user's choosing as root."""
    config = tmp_path / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("tools: {nvidia-ctk: /tmp/evil}\n")
    config.chmod(0o644)
    if how == "world-writable":
        config.chmod(0o666)
    elif how == "owned-by-another-user":
        os.chown(config, 65534, 65534)
    else:
        config.parent.chmod(0o777)

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 1
    reason = status_of(tmp_path)["reason"]
    assert reason.startswith(f"config: {config}: not trusted: "), reason


def test_a_configured_tool_another_user_could_replace_is_not_run(tmp_path):
    world_case = copy.deepcopy(p02())
    with World(world_case) as world:
        tool = Path(world.layout.dir) / "ctk-elsewhere"
        tool.write_bytes((Path(world.layout.bin) / "nvidia-ctk").read_bytes())
        tool.chmod(0o777)
        world_case.files["etc/podvm-gpu/config.yaml"] = f"tools: {{nvidia-ctk: {tool}}}\n"
        config = Path(world.path("/etc/podvm-gpu/config.yaml"))
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(world_case.files["etc/podvm-gpu/config.yaml"])
        run = world.run("boot")

    assert run.rc == 1
    assert f"nvidia-ctk: {tool} (set in the config) is refused: it is writable by group or " \
        "others (mode 0777)" in run.status["reason"], run.status["reason"]
    assert not [c for c in run.calls if c.argv[0] == "nvidia-ctk"]


def test_a_killed_boots_temporary_files_are_removed_by_the_next_boot(tmp_path, podvm, empty_path):
    for folder, name in (("run/podvm-gpu", ".status.json.4242.tmp"),
                         ("var/run/cdi", ".nvidia.yaml.4242.tmp")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / name).write_text("half a file")

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "run/podvm-gpu")) == ["boot.lock", "status.json"]
    assert os.listdir(tmp_path / "var/run/cdi") == ["nvidia.yaml"]


def test_with_umask_077_the_folders_and_files_are_still_readable_by_kata_agent(tmp_path, podvm,
                                                                             empty_path,
                                                                             umockdev_run):
    from conftest import product_env, umockdev_tree

    done = subprocess.run(
        [umockdev_run, "-d", str(umockdev_tree("cpu-vm")), "--", sys.executable, "-m",
         "podvm_gpu", "boot", "--root", str(tmp_path)], capture_output=True, text=True,
        timeout=30, env=product_env(PATH=empty_path), preexec_fn=lambda: os.umask(0o077))

    assert done.returncode == 0, done.stderr
    for folder in ("run", "run/podvm-gpu", "var", "var/run", "var/run/cdi"):
        assert (tmp_path / folder).stat().st_mode & 0o777 == 0o755, folder
    for file in ("run/podvm-gpu/status.json", "var/run/cdi/nvidia.yaml"):
        assert (tmp_path / file).stat().st_mode & 0o777 == 0o644, file


def test_check_shows_a_fabric_managed_outside_the_vm_that_never_completed(tmp_path):
    """No NVSwitch in the VM (shared-NVSwitch virtualization): check skipped the fabric even
    when the GPUs reported it In Progress."""
    world_case = copy.deepcopy(p02())
    in_progress = "00000000:00:04.0, state  In Progress, status N/A\n"  # the real program's
    world_case.files["etc/podvm-gpu/config.yaml"] = (
        "fabricmanager: {ready_timeout_s: 1, per_gpu_s: 0, poll_s: 0.2}\n")
    with World(world_case) as world:
        answer_fabric_query(world, in_progress)
        run = world.run("boot")
        check = world.run("check")

    assert run.status["state"] == "failed" and run.status["reason"].startswith("fabricmanager:")
    rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    assert rows["fabricmanager"]["result"] == "fail", rows["fabricmanager"]
    assert "State In Progress" in rows["fabricmanager"]["detail"]


def test_check_says_a_spec_it_could_not_read_could_not_be_read_not_that_it_defines_the_devices(
        tmp_path, podvm, empty_path):
    """Found by a newcomer (issue 21 item 8): the hint said "remove huge.json: it defines the
    same devices" of a file check never read."""
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    with open(tmp_path / "var/run/cdi/huge.json", "wb") as f:
        f.truncate(40 << 20)
    boot(podvm, tmp_path, empty_path)

    check = podvm(["check", "--root", str(tmp_path), "--json"])

    row = {c["name"]: c for c in json.loads(check.stdout)["checks"]}["cdi-duplicates"]
    assert row["result"] == "fail"
    assert "huge.json could not be read (larger than 32 MiB)" in row["detail"], row
    assert "defines the same devices" not in row["hint"] and "unknown" in row["detail"], row
