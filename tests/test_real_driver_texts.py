"""The agent fed what Debian 12's real NVIDIA 535 programs, kmod and kernel really did.

Every input here is a capture from a qemu boot of the real-driver image (tests/data/nvidia-
535.261.03, made by tests/boot/real/capture.py): real exit codes, stderr, stdout, ``/dev/kmsg``
records and journal lines; the system state files (``/proc/cmdline``, lockdown, sig_enforce,
modules_disabled) are the ones read in the same boot. What is not real is named in each test:
the module files are stand-ins with the real names and internal names (Debian's
``nvidia-current.ko`` carrying ``name=nvidia``), since the 60 MB real ones stay in the image.
"""

from __future__ import annotations

import json
import types

import pytest
from boot.nvidia_image import kernel_module
from boot.real import captured

from podvm_gpu.errors import CommandError
from podvm_gpu.gpufacts import kernel, words
from podvm_gpu.host import daemons
from podvm_gpu.host.fs import Root
from podvm_gpu.steps.modules import step as modules

RELEASE = "6.1.0-50-cloud-amd64"
DKMS = f"lib/modules/{RELEASE}/updates/dkms"
DEBIAN_RULES = "/etc/nvidia/current/nvidia-modprobe.conf"


def debian_root(tmp_path, boot: str, *, install_rule: bool = True, state: str = "state") -> Root:
    """A root with the state files of a captured boot (read at ``state``), Debian's module files
    (stand-ins) and, unless told otherwise, Debian's real modprobe.d rules (from the capture's
    layout)."""
    state = captured.files(boot, state)
    files = {
        "proc/sys/kernel/osrelease": RELEASE + "\n",
        "proc/cmdline": state["/proc/cmdline"],
        "proc/modules": state["/proc/modules"],
        "proc/sys/kernel/modules_disabled": state["/proc/sys/kernel/modules_disabled"],
        "sys/kernel/security/lockdown": state["/sys/kernel/security/lockdown"],
        "sys/module/module/parameters/sig_enforce": state["/sys/module/module/parameters/sig_enforce"],
    }
    if install_rule:
        files["etc/modprobe.d/nvidia.conf"] = captured.files("plain", "layout")[DEBIAN_RULES]
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / DKMS).mkdir(parents=True)
    for name, internal in (("nvidia-current", "nvidia"), ("nvidia-current-uvm", "nvidia-uvm"),
                           ("nvidia-current-modeset", "nvidia-modeset")):
        (tmp_path / DKMS / f"{name}.ko").write_bytes(kernel_module(internal, captured.DRIVER))
    return Root(tmp_path)


def explain(tmp_path, boot: str, run: str, **root_options) -> str:
    """explain_failure on the captured modprobe run, with its kernel records as /dev/kmsg."""
    done = captured.run(boot, run)
    root = debian_root(tmp_path, boot, **root_options)
    (tmp_path / "dev").mkdir(exist_ok=True)
    (tmp_path / "dev/kmsg").write_text(done.as_kmsg_file())
    err = CommandError(done.argv, done.rc, done.stdout, done.stderr)
    module = done.argv[-1]
    return modules.explain_failure(types.SimpleNamespace(root=root), module, err)


def test_real_535_no_gpu_quotes_the_insert_error_and_the_nvrm_line(tmp_path):
    """Real: modprobe's three stderr lines (the innermost first, then Debian's install rule's two),
    the kernel's "NVRM: No NVIDIA GPU found." record."""
    reason = explain(tmp_path, "plain", "modprobe-nvidia")
    assert "modprobe: ERROR: could not insert 'nvidia_current': No such device" in reason
    assert '"NVRM: No NVIDIA GPU found."' in reason
    assert "Invalid argument" not in reason, "the install rule's own last line is not the cause"


REFUSALS = {  # boot -> (the cause named, the kernel's record quoted)
    "lockdown-integrity": ("lockdown=integrity",
                           "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7"),
    "sig-enforce": ("signature enforcement", "Loading of unsigned module is rejected"),
    "module-blacklist": ("module_blacklist=", "Module nvidia is blacklisted"),
}


@pytest.mark.parametrize("boot", list(REFUSALS))
def test_real_refusals_name_the_cause_the_kernel_logged(tmp_path, boot):
    """Real: modprobe's stderr and the kernel's record of each refusal, and that boot's state."""
    reason = explain(tmp_path, boot, "modprobe-nvidia")
    cause, kernel_line = REFUSALS[boot]
    assert cause in reason and kernel_line in reason, reason
    others = [c for b, (c, _) in REFUSALS.items() if b != boot] + ["modules_disabled"]
    assert not [o for o in others if o in reason], f"only the cause that is there: {reason}"


def test_real_modules_disabled_is_named_from_proc_alone(tmp_path):
    """Real: "could not insert 'nvidia_current': Operation not permitted", no kernel record, and
    /proc/sys/kernel/modules_disabled = 1 as read in that boot."""
    reason = explain(tmp_path, "plain", "modprobe-nvidia-modules-disabled", state="state-modules-disabled")
    assert "kernel.modules_disabled=1" in reason
    assert "lockdown" not in reason and "sig_enforce" not in reason


def test_operation_not_permitted_without_evidence_says_so(tmp_path):
    """Real stderr of the modules_disabled run, but modules_disabled=0 in the root: nothing in the
    system shows a cause, and the reason says that instead of guessing "unsigned"."""
    done = captured.run("plain", "modprobe-nvidia-modules-disabled")
    root = debian_root(tmp_path, "plain")
    err = CommandError(done.argv, done.rc, done.stdout, done.stderr)
    reason = modules.explain_failure(types.SimpleNamespace(root=root), "nvidia", err)
    assert "none of kernel lockdown, module.sig_enforce" in reason
    assert "unsigned" not in reason and "Operation not permitted" in reason


def test_real_install_false_names_the_rule(tmp_path):
    """Real: kmod's "Error running install command '/bin/false'" (no insert error before it)."""
    root_dir = tmp_path
    reason_root = debian_root(root_dir, "plain")
    (root_dir / "etc/modprobe.d/00-capture-install-false.conf").write_text("install nvidia /bin/false\n")
    done = captured.run("plain", "modprobe-nvidia-install-false")
    err = CommandError(done.argv, done.rc, done.stdout, done.stderr)
    reason = modules.explain_failure(types.SimpleNamespace(root=reason_root), "nvidia", err)
    assert reason.startswith("modprobe.d runs '/bin/false' instead of loading nvidia")
    assert "/etc/modprobe.d/00-capture-install-false.conf: install nvidia /bin/false" in reason


def test_real_debian_without_install_rule_names_the_module_under_its_other_name(tmp_path):
    """Real: "modprobe: FATAL: Module nvidia not found in directory ..." of Debian without
    /etc/modprobe.d/nvidia.conf; the file is there as nvidia-current.ko."""
    reason = explain(tmp_path, "no-install-rule", "modprobe-nvidia", install_rule=False)
    assert "nvidia-current.ko is the nvidia module under another name" in reason
    assert "Module nvidia not found in directory /lib/modules/6.1.0-50-cloud-amd64" in reason


def test_real_nvrm_no_gpu_record_is_a_finding_but_not_fatal():
    records = captured.run("plain", "modprobe-nvidia").kernel_messages()
    found = kernel.findings(records)
    assert [f.kind for f in found] == ["no-device"]
    assert not found[0].fatal


def test_real_nvidia_smi_exit_9_is_a_failure_quoting_its_text():
    """Real: every nvidia-smi subcommand the agent runs, without a driver."""
    for name in ("nvidia-smi-L", "nvidia-smi-q-d-FABRIC", "nvidia-smi-conf-compute-f",
                 "nvidia-smi-query-gpu-mig"):
        done = captured.run("plain", name)
        assert (done.rc, done.stderr) == (9, "")
        cause = words.no_driver(done.rc, done.stdout + done.stderr)
        assert cause and "couldn't communicate with the NVIDIA driver" in cause


def test_real_conf_compute_exit_9_classifies_as_a_driver_that_does_not_answer():
    """Real: the CC classification (podvm_gpu/steps/cc/classify.py) judges the exit status first."""
    from podvm_gpu.steps.cc import classify

    done = captured.run("plain", "nvidia-smi-conf-compute-f")
    finding = classify.from_smi({"-f": (done.rc, done.stdout + done.stderr)})
    assert finding.no_driver and finding.mode is None
    verdict = classify.decide(finding, "Intel TDX (/proc/cpuinfo flag tdx_guest)")
    assert verdict.outcome == classify.FAIL
    assert "couldn't communicate with the NVIDIA driver" in verdict.reason


def test_the_scenario_harness_fake_prints_the_real_exit_9_text():
    """The harness's nvidia-smi fake (tests/scenarios/fake_tool.py) is a claim about the real one."""
    from scenarios.fake_tool import NO_DRIVER_RC, NVSMI_NO_DRIVER

    done = captured.run("plain", "nvidia-smi-L")
    assert (NO_DRIVER_RC, NVSMI_NO_DRIVER) == (done.rc, done.stdout)


def test_real_535_171_persistenced_names_the_option_it_refuses_and_exits_0():
    """Real: nvidia-persistenced 535.171.04 given the agent's default arguments exits 0 without
    starting and names --uvm-persistence-mode, which its --help does not list: the option the
    persistenced step then leaves out (steps/persistenced.py)."""
    rejected = captured.run("plain", "nvidia-persistenced-agent-default-args")
    assert rejected.rc == 0, "535.171.04 exits 0 on an unknown option, without starting"
    assert daemons.unrecognized_option(rejected.stderr) == "--uvm-persistence-mode"
    assert "--uvm-persistence-mode" not in captured.run("plain", "nvidia-persistenced-help").stdout
    assert daemons.unrecognized_option(captured.run("plain", "nvidia-persistenced-help").stdout) \
        is None


def test_real_persistenced_failure_leaves_its_reason_in_syslog_only():
    """Real: stderr says only "Check syslog"; journald has the cause at error priority, and
    the daemon's last words are read from it (host/daemons.py summarize_journal)."""
    from podvm_gpu.host.daemons import summarize_journal

    done = captured.run("plain", "nvidia-persistenced-persistence-mode")
    assert (done.rc, done.stderr.strip()) == (
        1, "nvidia-persistenced failed to initialize. Check syslog for more details.")
    errors = [e["MESSAGE"] for e in done.journal if e["PRIORITY"] == "3"]
    assert errors == ["Failed to query NVIDIA devices. Please ensure that the NVIDIA device files "
                      "(/dev/nvidia*) exist, and that user 0 has read and write permissions for "
                      "those files."]
    lines = "".join(json.dumps(e) + "\n" for e in done.journal)
    assert summarize_journal(lines) == errors[0]


def test_modprobe_message_field_one_line_and_debian_535_install_rule_lines_both_give_the_insert_error():
    """Field case C04 (a distribution with plain nvidia.ko): one line. Real Debian 535: the
    innermost insert error, then two lines from the install rule, the last a misleading
    "Invalid argument"."""
    field = CommandError(["modprobe", "nvidia"], 1, "",
                         "modprobe: ERROR: could not insert 'nvidia': Operation not permitted\n")
    assert modules.modprobe_said(field) == "modprobe: ERROR: could not insert 'nvidia': Operation not permitted"
    done = captured.run("lockdown-integrity", "modprobe-nvidia")
    real = CommandError(done.argv, done.rc, done.stdout, done.stderr)
    assert modules.modprobe_said(real) == \
        "modprobe: ERROR: could not insert 'nvidia_current': Operation not permitted"
