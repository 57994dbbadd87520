"""The kernel log (podvm_gpu.host.kmsg; contract section 9).

The multi-record NVRM messages are the field cases' own (tests/data/cases C03, C05, C25, C26) or
the driver's printf formats from NVIDIA/open-gpu-kernel-modules (nv.c, nv-pci.c, osapi.c).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import yaml
from guards import must_finish_within

from podvm_gpu.gpufacts import kernel
from podvm_gpu.gpufacts.kernel import findings
from podvm_gpu.host.fs import Root
from podvm_gpu.host.kmsg import join_nvrm, parse_record, read_kernel_log

CASES = Path(__file__).resolve().parent / "data" / "cases"


def case_log(case_id: str) -> list[str]:
    """The ``kernel_log`` lines of a field case."""
    (path,) = CASES.glob(f"{case_id}-*.yaml")
    return yaml.safe_load(path.read_text())["kernel_log"]


def as_kmsg(messages: list[str], first_seq: int = 1000) -> str:
    """Messages in /dev/kmsg's record format, as the kernel hands them out."""
    return "".join(f"{3 if m.startswith('NVRM') else 6},{first_seq + i},{1000000 + i * 17},-;{m}\n"
                   for i, m in enumerate(messages))




def kinds(messages: list[str]) -> list[str]:
    return [f.kind for f in findings(messages)]


# --- the record format -----------------------------------------------------------------------

def test_record_prefix_is_removed():
    assert parse_record("6,123,456,-;nvidia: loading out-of-tree module taints kernel.") == \
        "nvidia: loading out-of-tree module taints kernel."


def test_record_with_extra_fields_after_the_flags_is_parsed():
    # Kernels built with CONFIG_PRINTK_CALLER add ",caller=T123" after the flags.
    assert parse_record("4,77,12345,-,caller=T812;NVRM: Xid (PCI:0000:01:00): 79") == \
        "NVRM: Xid (PCI:0000:01:00): 79"


def test_semicolon_inside_the_message_is_kept():
    assert parse_record("6,1,2,c;NVRM: a; b") == "NVRM: a; b"


def test_line_without_a_record_prefix_is_taken_as_it_is():
    assert parse_record("NVRM: GPU 0000:01:00.0: x; y") == "NVRM: GPU 0000:01:00.0: x; y"


def test_continuation_lines_are_dropped(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(
        "6,1,100,-;nvidia 0000:01:00.0: enabling device (0000 -> 0003)\n"
        " SUBSYSTEM=pci\n"
        " DEVICE=+pci:0000:01:00.0\n"
        "4,2,200,-;NVRM: GPU 0000:01:00.0 is already bound to NovaCore.\n")

    assert read_kernel_log(Root(tmp_path)) == [
        "nvidia 0000:01:00.0: enabling device (0000 -> 0003)",
        "NVRM: GPU 0000:01:00.0 is already bound to NovaCore.",
    ]


# --- reading without blocking ----------------------------------------------------------------

def test_regular_file_is_read_to_its_end(tmp_path):
    (tmp_path / "dev").mkdir()
    messages = [f"line {i}" for i in range(5000)]  # more than one 64 KiB read
    (tmp_path / "dev" / "kmsg").write_text(as_kmsg(messages))

    assert read_kernel_log(Root(tmp_path)) == messages


def test_missing_log_reads_as_empty(tmp_path):
    assert read_kernel_log(Root(tmp_path)) == []


def test_fifo_with_a_live_writer_is_read_without_blocking(tmp_path):
    """/dev/kmsg never signals end of file: the reader must stop at EAGAIN. A FIFO whose writer
    stays open behaves the same way."""
    (tmp_path / "dev").mkdir()
    fifo = tmp_path / "dev" / "kmsg"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open at once
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, as_kmsg(case_log("C26")).encode())
        with must_finish_within(5):
            messages = read_kernel_log(Root(tmp_path))
    finally:
        os.close(writer)
        os.close(keep)

    assert messages == case_log("C26")


def test_fifo_without_a_writer_reads_as_empty_without_blocking(tmp_path):
    (tmp_path / "dev").mkdir()
    os.mkfifo(tmp_path / "dev" / "kmsg")

    with must_finish_within(5):
        assert read_kernel_log(Root(tmp_path)) == []


def test_the_real_dev_kmsg_is_read_without_blocking():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    started = time.monotonic()
    with must_finish_within(5):
        messages = read_kernel_log(Root("/"))

    assert time.monotonic() - started < 5
    assert not any(re.match(r"\d+,\d+,\d+,", m) for m in messages)


# --- joining the driver's multi-record messages --------------------------------------------------

def test_unsupported_pci_id_message_of_three_records_is_joined_c05():
    joined = join_nvrm(case_log("C05"))

    assert joined[0] == ("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2330) installed in this "
                         "system is not supported by the NVIDIA 550.90.07 driver release.")
    assert joined[1] == "nvidia: probe of 0000:01:00.0 failed with error -1"
    assert len(joined) == 4


def test_api_mismatch_message_of_four_records_is_joined_c25():
    joined = join_nvrm(case_log("C25"))

    assert len(joined) == 1
    assert joined[0].startswith("NVRM: API mismatch: the client has the version 525.85.12, but "
                                "this kernel module has the version 520.56.06.")
    assert joined[0].endswith("components have the same version.")


def test_a_non_nvrm_line_ends_a_pending_nvrm_message():
    joined = join_nvrm(["NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:",
                        "nvidia: probe of 0000:01:00.0 failed with error -1"])

    assert joined == ["NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:",
                      "nvidia: probe of 0000:01:00.0 failed with error -1"]


def test_an_xid_record_starts_a_new_message():
    joined = join_nvrm(["NVRM: GPU at PCI:0000:01:00: GPU-3f6c1a2e-7b4d-4e8a-9c1f-0d2e4b6a8c00",
                        "NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus."])

    assert len(joined) == 2
    assert joined[1].startswith("NVRM: Xid (PCI:0000:01:00): 79")


# --- findings ----------------------------------------------------------------------------------

def test_xid_names_code_and_gpu_c26():
    (finding,) = findings(case_log("C26"))

    assert finding.kind == "xid"
    assert "119" in finding.what and "0000:01:00" in finding.what
    assert finding.evidence.startswith("NVRM: Xid (PCI:0000:01:00): 119")
    assert "Xid 119" in kernel.describe(finding) and "kernel:" in kernel.describe(finding)


def test_unsupported_pci_id_names_driver_version_and_id_c05():
    (finding,) = findings(case_log("C05"))

    assert finding.kind == "unsupported-pci-id"
    assert "550.90.07" in finding.what
    assert "10de:2330" in finding.what
    assert "0000:01:00.0" in finding.what


def test_api_mismatch_names_both_versions_c25():
    (finding,) = findings(case_log("C25"))

    assert finding.kind == "api-mismatch"
    assert "525.85.12" in finding.what and "520.56.06" in finding.what


def test_already_bound_names_the_gpu_and_the_driver_c03():
    (finding,) = findings(case_log("C03"))

    assert finding.kind == "bound-elsewhere"
    assert finding.what == "GPU 0000:01:00.0 is already bound to NovaCore"


def test_fallen_off_the_bus_is_found():
    log = ["NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."]

    assert kinds(log) == ["fell-off-bus"]


def test_fallen_off_the_bus_names_the_gpu():
    """The driver prints it through NV_DEV_PRINTF, which starts with "GPU <domain:bus:dev.fn>: "
    (open-gpu-kernel-modules, osapi.c); the summary must carry that address, not "?"."""
    (finding,) = findings(["NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."])

    assert "0000:3b:00.0" in finding.what
    assert "?" not in finding.what


def test_xid_79_is_reported_once_as_an_xid():
    log = ["NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
           "the bus."]

    (finding,) = findings(log)
    assert finding.kind == "xid" and "79" in finding.what


def test_gsp_firmware_missing_is_found():
    log = ["nvidia 0000:01:00.0: Direct firmware load for nvidia/550.54.15/gsp_ga10x.bin failed "
           "with error -2"]

    assert kinds(log) == ["gsp-firmware"]


def test_gsp_firmware_missing_names_the_firmware_path():
    """Contract section 9: "GSP firmware missing (the path)"."""
    (finding,) = findings(["nvidia 0000:01:00.0: Direct firmware load for "
                           "nvidia/550.54.15/gsp_ga10x.bin failed with error -2"])

    assert "nvidia/550.54.15/gsp_ga10x.bin" in finding.what


def test_gsp_no_firmware_image_is_found():
    assert kinds(["NVRM: RmFetchGspRmImages: No firmware image found"]) == ["gsp-firmware"]


def test_bar_not_assigned_is_found_in_the_joined_message():
    # nv-pci.c: two records, the first ends with ':' and the second names the BAR.
    log = ["NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:",
           "NVRM: BAR1 is 0M @ 0x0 (PCI:0000:01:00.0)",
           "NVRM: The system BIOS may have misconfigured your GPU."]

    (finding,) = findings(log)
    assert finding.kind == "bar"
    assert "BAR1 is 0M" in finding.evidence


def test_gpu_that_needs_a_reset_is_found():
    # The wording differs between driver branches; this is the form the product's rule targets.
    log = ["NVRM: GPU 0000:01:00.0: GPU requires a reset before it can be used again."]

    assert kinds(log) == ["needs-reset"]


def test_open_module_on_an_unsupported_gpu_is_found():
    """nv.c prints this when the open nvidia.ko meets a GPU without GSP (8 records, the first
    sentence ends at "(GSP).")."""
    log = ["NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1db1)",
           "NVRM: installed in this system is not supported by open",
           "NVRM: nvidia.ko because it does not include the required GPU",
           "NVRM: System Processor (GSP).",
           "NVRM: Please see the 'Open Linux Kernel Modules' and 'GSP",
           "NVRM: Firmware' sections in the driver README, available on",
           "NVRM: the Linux graphics driver download page at",
           "NVRM: www.nvidia.com."]

    found = findings(log)

    assert [f.kind for f in found] == ["open-module-unsupported"]
    assert "0000:01:00.0" in found[0].what


def test_the_proprietary_module_on_a_gpu_that_needs_the_open_one_is_found():
    """Issue 46 item 7: the proprietary module's words (field logs of 580.105.08; not in the open
    module's sources), as two records and as one record whose newline /dev/kmsg escapes."""
    records = ["NVRM: The NVIDIA GPU 0000:02:00.0 (PCI ID: 10de:2c58)",
               "NVRM: installed in this system requires use of the NVIDIA open kernel modules.",
               "NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)"]
    one = ["NVRM: The NVIDIA GPU 0000:00:07.0 (PCI ID: 10de:2b85)\\x0aNVRM: installed in this "
           "system requires use of the NVIDIA open kernel modules.\\x0a"]
    for log, pci, pci_id in ((records, "0000:02:00.0", "10de:2c58"), (one, "0000:00:07.0", "10de:2b85")):
        found = findings(log)
        assert found[0].kind == "needs-open-module" and not found[0].fatal, found
        assert found[0].what.startswith(f"GPU {pci} (PCI ID {pci_id}) requires NVIDIA's open "
                                           "kernel module"), found[0]
    assert [f.kind for f in findings(records)] == ["needs-open-module", "cannot-attach"]
    # the open module's opposite words stay their own finding
    assert kinds(["NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1db1)",
                  "NVRM: installed in this system is not supported by open",
                  "NVRM: nvidia.ko because it does not include the required GPU",
                  "NVRM: System Processor (GSP)."]) == ["open-module-unsupported"]


def test_the_modules_step_fails_naming_the_need_for_the_open_module(tmp_path):
    """The boot's modules step (and check's modules row) take it as the reason the driver cannot
    attach the GPU, before RmInitAdapter's generic failure."""
    from podvm_gpu.host.fs import Root
    from podvm_gpu.steps.modules.attach import attach_cause

    log = ["NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.105.08  Wed Oct 29 23:15:11 UTC 2025",
           "NVRM: The NVIDIA GPU 0000:02:00.0 (PCI ID: 10de:2c58)",
           "NVRM: installed in this system requires use of the NVIDIA open kernel modules.",
           "NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)"]
    cause = attach_cause(Root(str(tmp_path)), log)
    assert cause.startswith("GPU 0000:02:00.0 (PCI ID 10de:2c58) requires NVIDIA's open kernel "
                            "module; the proprietary one is loaded"), cause
    assert "requires use of the NVIDIA open kernel modules" in cause


def test_lockdown_message_is_found():
    log = ["Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7"]

    assert kinds(log) == ["lockdown"]


def test_normal_lines_yield_nothing():
    log = [
        "nvidia: loading out-of-tree module taints kernel.",
        "nvidia: module license 'NVIDIA' taints kernel.",
        "nvidia: module verification failed: signature and/or required key missing - tainting "
        "kernel",
        "nvidia_uvm: module uses symbols nvUvmInterfaceDisableAccessCntr from proprietary module "
        "nvidia, inheriting taint.",
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 511",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024",
        "nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64  550.54.15",
        "pci 0000:00:02.0: BAR 6: assigned [mem 0xfebe0000-0xfebeffff pref]",
        "[drm] [nvidia-drm] [GPU ID 0x00000400] Loading driver",
    ]

    assert findings(log) == []


def test_a_repeated_message_is_reported_once():
    line = "NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception on (GPC 0, TPC 0, SM 0)."

    assert len(findings([line, "other", line])) == 1


def test_findings_read_from_the_log_file_end_to_end(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(
        as_kmsg(["nvidia: module verification failed: signature and/or required key missing - "
                 "tainting kernel", *case_log("C05")]))

    found = findings(read_kernel_log(Root(tmp_path)))

    assert [f.kind for f in found] == ["unsupported-pci-id"]


# --- bounded reads: the newest 4 MiB of a large file, bounded work per message --------------------

MiB = 1 << 20


def filler(count: int, first_seq: int = 1) -> str:
    """Harmless records (no word findings() looks for), about 64 bytes each."""
    return "".join(f"6,{first_seq + i},{i},-;virtio_net virtio0 eth0: link is up, filler {i:08d}\n"
                   for i in range(count))


def test_a_log_file_over_4_mib_keeps_the_newest_records(tmp_path):
    """The kernel's ring buffer is a few MiB; a larger file is cut from its start, so the newest
    record (here an Xid 79 after more than 5 MiB of filler) is still read."""
    (tmp_path / "dev").mkdir()
    body = filler(90_000)
    assert len(body) > 5 * MiB
    body += "3,90001,0,-;NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus.\n"
    (tmp_path / "dev" / "kmsg").write_text(body)

    messages = read_kernel_log(Root(tmp_path))

    assert messages[-1].startswith("NVRM: Xid (PCI:0000:01:00): 79")
    assert sum(len(m) for m in messages) < 4 * MiB
    assert [(f.kind, f.code) for f in findings(messages)] == [("xid", 79)]


def test_a_log_file_over_4_mib_drops_the_partial_first_line(tmp_path):
    """The cut lands inside a record; what is left of it is not a record and is dropped."""
    (tmp_path / "dev").mkdir()
    straddling = "6,500,0,-;STRADDLE-" + "A" * 1000 + "-END\n"
    head = filler(20_000)  # 1.2 MiB before the straddling record
    after = "6,501,0,-;the first whole record after the cut\n"
    tail = filler(60_000, first_seq=502)
    # everything from the middle of the A's on is exactly 4 MiB
    keep = len(straddling) // 2
    pad = 4 * MiB - (len(straddling) - keep) - len(after) - len(tail)
    assert pad > 20
    tail = tail[:-1] + "x" * pad + "\n"  # lengthen the last record
    (tmp_path / "dev" / "kmsg").write_text(head + straddling + after + tail)

    messages = read_kernel_log(Root(tmp_path))

    assert messages[0] == "the first whole record after the cut"
    assert not any("-END" in m for m in messages)


def test_a_record_longer_than_4096_characters_is_cut(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(as_kmsg(["NVRM: " + "x" * 10_000, "next"]))

    messages = read_kernel_log(Root(tmp_path))

    assert [len(m) for m in messages] == [4096, 4]


def test_a_message_of_40000_characters_without_spaces_around_gsp_is_processed_at_once():
    """The GSP-firmware pattern starts a path only after a blank: without that anchor a long
    word containing "gsp" costs quadratic backtracking (minutes for 40 000 characters)."""
    message = "nvidia: " + "x" * 20_000 + "gsp" + "y" * 19_992

    with must_finish_within(5):
        found = findings([message])

    assert found == []


def test_a_joined_nvrm_message_of_repeated_bar_words_is_processed_at_once(tmp_path):
    """Eight NVRM records without a full stop are joined into one message of about 32 000
    characters (8 records of at most 4096 each, as read_kernel_log cuts them). The BAR pattern
    ``BAR\\s*\\d+[^\\n]*(?:not assigned|invalid|is 0M)`` starts at every "BAR<n>" and scans to
    the end: repeated, that is quadratic (about 10 s for this one message; a 4 MiB log holds 128
    of them). The pipeline reads the log after the budget timer is off (the ready path and
    _fail, which every failed boot takes), so nothing would bound that time."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(as_kmsg(["NVRM: " + "BAR1" * 1100] * 8))
    messages = read_kernel_log(Root(tmp_path))
    assert len(join_nvrm(messages)) == 1

    with must_finish_within(3):
        found = findings(messages)

    assert found == []


def test_records_a_program_wrote_are_not_the_kernels_and_are_skipped(tmp_path):
    """The agent writes its final state line to /dev/kmsg (facility daemon); /dev/kmsg gives a
    program's record a facility even when it names none (user). Only facility 0 is the kernel."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text(
        "3,1,100,-;NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus.\n"
        "27,2,200,-;podvm-gpu[42]: failed: modules: GPU has fallen off the bus\n"
        "14,3,300,-;someone: user message\n"
        "6,4,400,-;kernel info\n")

    assert read_kernel_log(Root(tmp_path)) == [
        "NVRM: Xid (PCI:0000:00:04): 79, GPU has fallen off the bus.", "kernel info"]


def test_the_literal_prefilter_never_hides_a_match():
    """Each pattern is searched only in messages holding one of its words (``_Lazy.needs``,
    about 20 ms of compiling saved a boot); over every string of the field cases and the real
    535 captures, and each pattern's own kind of text, searching everything finds the same."""
    import glob

    import yaml as _yaml


    texts: list[str] = []

    def walk(node):
        if isinstance(node, str):
            texts.extend(node.splitlines())
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    here = os.path.dirname(__file__)
    for path in glob.glob(os.path.join(here, "data/cases/*.yaml")):
        with open(path) as f:
            walk(_yaml.safe_load(f))
    for path in glob.glob(os.path.join(here, "data/nvidia-*/**/*"), recursive=True):
        if os.path.isfile(path):
            with open(path, errors="replace") as f:
                texts.extend(f.read().splitlines())
    assert len(texts) > 1000
    for text in texts:
        for _kind, pattern, _template in kernel._PATTERNS:
            if pattern.search(text):
                assert pattern.may_match(text.lower()), (pattern.source, text)


# --- issue 17: GPUs the driver cannot attach, modules the kernel cannot decompress ----------

from podvm_gpu.host import kmsg as _kmsg  # noqa: E402


def test_cc_not_enabled_on_the_host_is_named_with_the_adapter_code():
    # canonical/tdx#414 = NVIDIA/nvtrust#124
    found = {f.kind: f for f in kernel.findings([
        "NVRM: confComputeConstructEngine_IMPL: GPU confidential compute capability is not enabled.",
        "NVRM: osInitNvMapping: *** Cannot attach gpu",
        "NVRM: GPU 0000:05:00.0: RmInitAdapter failed! (0x22:0x3f:744)"])}
    assert "cc-not-enabled" in found and "reset the GPU" in found["cc-not-enabled"].what
    assert found["cannot-attach"].what.endswith("GPU 0000:05:00.0 (RmInitAdapter failed 0x22:0x3f:744)")


def test_swiotlb_full_gives_size_and_slots():
    (f,) = kernel.findings(["nvidia 0000:00:04.0: swiotlb buffer is full (sz: 524288 bytes), "
                           "total 262144 (slots), used 1044 (slots)"])
    assert f.kind == "swiotlb-full" and "524288-byte" in f.what and "1044 of 262144" in f.what


def test_lkca_stubs_without_nvrm_prefix_is_a_driver_error():
    line = "libspdm_check_crypto_backend: Error - libspdm expects LKCA but found stubs!"
    assert [f.kind for f in kernel.findings([line])] == ["lkca-stubs"]
    assert _kmsg.driver_errors([(3, line)]) == [line]
    assert _kmsg.driver_errors([(6, line)]) == []  # only at level err


def test_decompression_failure_is_read_from_the_kernel_line():
    (f,) = kernel.findings(["decompression failed with status 6"])
    assert f.kind == "decompress-failed" and "status 6" in f.what
    assert kernel.findings(["modprobe: ERROR: could not insert 'nvidia': Invalid argument"]) == []


# --- the Xid table (podvm_gpu/gpufacts/xids.py, issue 46 item 3) --------------------------------------

def test_nvlink5_xids_are_fatal_by_their_word_in_the_boots_findings():

    log = ["NVRM: Xid (PCI:0019:01:00): 149, NETIR_LINK_EVT Nonfatal XC0 i0 Link 00 (0x025001c6 "
           "0x0)", "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Fatal XC0 i0 Link 13 (0x4 0x0)"]
    found = kernel.findings(log)
    assert [(f.code, f.fatal) for f in found] == [(149, False), (145, True)]
    assert [(pci, code, fatal) for pci, code, fatal in kernel.xid_events(log)] == [
        ("0019:01:00", 149, False), ("0018:01:00", 145, True)]


def test_the_same_nvlink5_code_fatal_after_nonfatal_is_a_second_finding():

    line = "NVRM: Xid (PCI:0019:01:00): 149, NETIR_LINK_EVT {} XC0 i0 Link 00 (0x0)"
    found = kernel.findings([line.format("Nonfatal"), line.format("Fatal")])
    assert [f.fatal for f in found] == [False, True]


def test_a_follow_on_is_counted_once_as_its_causes_follow_on_not_as_a_new_xid():

    log = ["NVRM: Xid (PCI:0019:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x0)",
           "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by "
           "previous Xid 149",
           "NVRM: Xid (PCI:0000:dd:00): 45, pid=7, name=python3, Ch 00000002 caused by previous "
           "Xid 62"]
    assert kernel.xid_records(log) == [("0019:01:00", 149), ("0000:dd:00", 45)]
    assert [f.code for f in kernel.findings(log)] == [149, 45]
    assert [code for _usec, _pci, code in kernel.timed_xids([(3, m, i) for i, m in
                                                           enumerate(log)])] == [149, 45]
