"""Issue 44 item 6: 580's fabric health detail (``fabric.health.bandwidth``,
``route_recovery_in_progress``, ``route_unhealthy``, ``access_timeout_recovery``,
``incorrect_configuration``, ``partition_assigned``) read through gpufacts (its argv and parser in
gpufacts/smi.py, its judgement and NVML's mask in gpufacts/judge.py), acted on by boot's step,
check's row and the watcher, kept in status.json and watch.json, and exported as dcgm-exporter
4.8.4's ``DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY`` and ``DCGM_FI_DEV_FABRIC_HEALTH_MASK``.

The values nvidia-smi prints for the detail were never captured (tests/data/real/h200-580): the
words used here are the ones the table knows (nvidia-smi's boolean words, NVML's names); any
other is "not understood"."""

from __future__ import annotations

import json

import pytest

from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import judge, smi, words
from podvm_gpu.gpufacts.words import FAIL, WARN
from podvm_gpu.host.proc import Completed

BUS = ("00000000:18:00.0", "00000000:2A:00.0")
DETAIL = ("bandwidth", "route_recovery_in_progress", "route_unhealthy", "access_timeout_recovery",
          "incorrect_configuration", "partition_assigned")
FINE = {"bandwidth": "False", "route_recovery_in_progress": "False", "route_unhealthy": "False",
        "access_timeout_recovery": "False", "incorrect_configuration": "None",
        "partition_assigned": "True"}


def detail_row(bus: str, **values) -> str:
    merged = {**FINE, **values}
    return ", ".join([bus, *(merged[f] for f in DETAIL)]) + "\n"


# --- the argv and the parser (gpufacts/smi.py) ----------------------------------------------

def test_the_detail_query_names_580s_fields_in_nvmls_mask_order():
    assert smi.fabric_detail_argv() == [
        "nvidia-smi", "--query-gpu=pci.bus_id,fabric.health.bandwidth,"
        "fabric.health.route_recovery_in_progress,fabric.health.route_unhealthy,"
        "fabric.health.access_timeout_recovery,fabric.health.incorrect_configuration,"
        "fabric.health.partition_assigned", "--format=csv,noheader"]
    assert [d.field for d in judge.HEALTH_DETAIL] == list(DETAIL)


def test_580_lists_every_detail_field_it_is_asked():
    """The real 580 capture's --help-query-gpu names each field the query asks."""
    from test_real_580 import BY_ARGV

    helped = BY_ARGV[("nvidia-smi", "--help-query-gpu")]["stdout"]
    for field in smi.FABRIC_DETAIL_FIELDS[1:]:
        assert f'"{field}"' in helped


def test_the_detail_parser_reads_rows_and_refuses_what_is_no_answer():
    text = detail_row(BUS[0]) + detail_row(BUS[1], route_unhealthy="True", bandwidth="[N/A]")
    parsed = smi.parse_fabric_detail(text)
    assert parsed[BUS[0]] == FINE
    assert parsed[BUS[1]]["route_unhealthy"] == "True" and parsed[BUS[1]]["bandwidth"] == "N/A"
    assert smi.parse_fabric_detail('Field "fabric.health.bandwidth" is not a valid field to '
                                   'query.\n\n') is None
    assert smi.parse_fabric_detail(f"{BUS[0]}, Healthy\n") is None


# --- the judgement and the mask (gpufacts/judge.py) ----------------------------------------

def nvml_mask(**fields: int) -> int:
    """NVML's mask from nvidia-ml-py's own constants (the layout is theirs, not this test's)."""
    pynvml = pytest.importorskip("pynvml")
    names = {"bandwidth": "DEGRADED_BW", "route_recovery_in_progress": "ROUTE_RECOVERY",
             "route_unhealthy": "ROUTE_UNHEALTHY",
             "access_timeout_recovery": "ACCESS_TIMEOUT_RECOVERY",
             "incorrect_configuration": "INCORRECT_CONFIGURATION",
             "partition_assigned": "PARTITION_ASSIGNED"}
    mask = 0
    for field, value in fields.items():
        name = names[field]
        assert value <= getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{name}")
        mask |= value << getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{name}")
    return mask


def test_a_healthy_detail_is_fine_and_its_mask_is_nvmls():
    health = judge.fabric_health("Healthy", FINE)
    assert health.findings == []
    want = nvml_mask(bandwidth=2, route_recovery_in_progress=2, route_unhealthy=2,
                     access_timeout_recovery=2, incorrect_configuration=1, partition_assigned=1)
    assert health.mask == want
    assert health.summary_code == pytest.importorskip("pynvml").NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY


@pytest.mark.parametrize("field, value, level, nvml", [
    ("route_unhealthy", "True", FAIL, 1),
    ("route_unhealthy", "Yes", FAIL, 1),
    ("bandwidth", "True", WARN, 1),
    ("bandwidth", "Degraded", WARN, 1),
    ("route_recovery_in_progress", "True", WARN, 1),
    ("access_timeout_recovery", "Yes", WARN, 1),
    ("incorrect_configuration", "Insufficient NVLinks", WARN, 5),
    ("incorrect_configuration", "INCORRECT_SYSGUID", WARN, 2),
    # NVML's documentation's words for its values
    ("incorrect_configuration", "Incorrect Configuration - Incompatible GPU Firmware", WARN,
     6),
])
def test_each_detail_value_is_judged_once_and_lands_in_its_bits(field, value, level, nvml):
    health = judge.fabric_health("Healthy", {**FINE, field: value}, "0000:2a:00.0")
    assert [(f.level, f.gpu, f.kind) for f in health.findings] == \
        [(level, "00000000:2A:00.0", judge.FABRIC)]  # issue 44: one finding type, the GPU named
    assert f"fabric.health.{field} {value}" in health.findings[0].what
    fine = {"bandwidth": 2, "route_recovery_in_progress": 2, "route_unhealthy": 2,
            "access_timeout_recovery": 2, "incorrect_configuration": 1, "partition_assigned": 1}
    assert health.mask == nvml_mask(**{**fine, field: nvml})


def test_na_or_not_read_is_nvmls_not_supported_never_a_finding():
    assert judge.fabric_health("N/A", None) == judge.FabricHealth([], 0, 0)
    assert judge.fabric_health("Healthy", {f: "[N/A]" for f in DETAIL}) == \
        judge.FabricHealth([], 1, 0)


@pytest.mark.parametrize("field, word", [
    ("route_unhealthy", "Maybe"), ("bandwidth", "Full"), ("incorrect_configuration", "Bad"),
    ("route_unhealthy", "1"),  # a number is no word the table knows: NVML's 1 or a boolean 1?
])
def test_a_word_the_table_does_not_know_is_not_understood_a_note_and_no_mask(field, word):
    health = judge.fabric_health("Healthy", {**FINE, field: word})
    assert [(f.level, f.what, f.kind) for f in health.findings] == [
        (WARN, f"fabric.health.{field} {word!r} not understood", judge.FABRIC_UNKNOWN)]
    assert health.mask is None, "a number would claim what was not read"
    assert health.summary_code == 1


def test_the_summary_keeps_its_verdicts_and_numbers():
    assert judge.fabric_health("Unhealthy", None).findings[0].level == FAIL
    assert judge.fabric_health("Unhealthy", None).summary_code == 2
    assert judge.fabric_health("Limited Capacity", None).summary_code == 3
    odd = judge.fabric_health("Sparkly", None)
    assert odd.summary_code is None and "'Sparkly' not understood" in odd.findings[0].what


# --- boot's step, check's row (steps/fabric/parse.py) ----------------------------------------

class Ctx:
    """A boot context as ``health_summary`` reads it: answers by argv."""

    def __init__(self, summary: str, detail: tuple[int, str]):
        from podvm_gpu.steps.fabric.fabric_kind import Fabric

        self.answers = {tuple(smi.fabric_health_argv()): (0, summary),
                        tuple(smi.fabric_detail_argv()): detail}
        self.warnings, self.asked = [], []
        self.runner, self.timeouts = self, {}
        self.fabric = Fabric("nvswitch", ["0000:05:00.0"], [], [])

    def run(self, argv, check=False, timeout=None):
        self.asked.append(argv)
        rc, out = self.answers[tuple(argv)]
        return Completed(argv=argv, returncode=rc, stdout=out, stderr="", duration_s=0.01)

    def harmless_timeout(self, tool):
        return 5.0

    def warn(self, text):
        self.warnings.append(text)


HEALTHY = "".join(f"{b}, Healthy\n" for b in BUS)


def test_boot_fails_on_a_route_unhealthy_naming_the_gpu_and_keeps_what_it_read():
    from podvm_gpu.steps.fabric.parse import health_summary

    ctx = Ctx(HEALTHY, (0, detail_row(BUS[0]) + detail_row(BUS[1], route_unhealthy="True")))
    with pytest.raises(StepFailed, match=r"fabric unhealthy: 00000000:2A:00.0: "
                                         r"fabric.health.route_unhealthy True"):
        health_summary(ctx)
    health = ctx.fabric.to_dict()["health"]
    assert [g["gpu"] for g in health] == list(BUS)
    assert health[1]["route_unhealthy"] == "True" and health[1]["summary_code"] == 1
    assert health[1]["mask"] & (0x3 << 4) == 1 << 4  # route unhealthy: NVML's TRUE at bit 4


def test_boot_warns_on_a_note_and_on_a_word_not_understood_and_goes_on():
    from podvm_gpu.steps.fabric.parse import health_summary

    ctx = Ctx(HEALTHY, (0, detail_row(BUS[0], route_recovery_in_progress="True")
                        + detail_row(BUS[1], incorrect_configuration="Sideways")))
    assert health_summary(ctx) == "health summary Healthy on 2 GPU(s)"
    assert len(ctx.warnings) == 2
    assert "GPU 00000000:18:00.0: fabric.health.route_recovery_in_progress True" in ctx.warnings[0]
    assert "'Sideways' not understood; the boot does not fail on it" in ctx.warnings[1]
    assert ctx.fabric.to_dict()["health"][1]["mask"] is None


def test_a_build_that_refuses_the_detail_is_not_read_silently_and_a_failed_one_warns():
    """535-555 refuse 580's fields (``Field ... is not a valid field to query.``, exit 2): no
    warning, no boot failure; the detail is not even asked where the summary was refused."""
    from podvm_gpu.steps.fabric.parse import health_summary

    refused = (2, 'Field "fabric.health.bandwidth" is not a valid field to query.\n\n')
    ctx = Ctx(HEALTHY, refused)
    assert health_summary(ctx) == "health summary Healthy on 2 GPU(s)" and ctx.warnings == []
    assert ctx.fabric.to_dict()["health"][0]["mask"] is None  # the detail was not read
    ctx = Ctx(HEALTHY, (3, "Not Supported\n"))
    health_summary(ctx)
    assert ctx.warnings and "exit 3 (not supported)" in ctx.warnings[0]
    ctx = Ctx("", refused)
    ctx.answers[tuple(smi.fabric_health_argv())] = (
        2, 'Field "fabric.health.summary" is not a valid field to query.\n\n')
    assert health_summary(ctx) == "health summary not offered by this nvidia-smi"
    assert ctx.asked == [smi.fabric_health_argv()] and "health" not in ctx.fabric.to_dict()


def test_checks_row_fails_on_a_route_unhealthy_as_boot_does():
    from podvm_gpu.steps.fabric.parse import summary_row

    ctx = Ctx(HEALTHY, (0, detail_row(BUS[0]) + detail_row(BUS[1], route_unhealthy="Yes")))
    row = summary_row(ctx, "fabric Completed/Success")
    assert row.result == "fail" and "00000000:2A:00.0: fabric.health.route_unhealthy Yes" in \
        row.detail


# --- the watcher (watch/verdicts.py) ----------------------------------------------------------

def test_the_watcher_finds_a_route_unhealthy_after_a_ready_boot_and_keeps_the_reading():
    from podvm_gpu.watch import verdicts

    ctx = Ctx(HEALTHY, (0, detail_row(BUS[0]) + detail_row(BUS[1], route_unhealthy="True")))
    ctx.answers[tuple(smi.fabric_argv())] = (0, "".join(
        f"{b}, state  Completed, status Success\n" for b in BUS))
    seen: dict = {}
    found, unread = verdicts.poll_fabric(ctx, 5, ["0000:18:00.0", "0000:2a:00.0"], seen)
    assert unread == []
    assert [(v.level, v.gpu) for v in found] == [("fail", words.bus_id(BUS[1]))]
    assert "fabric unhealthy: fabric.health.route_unhealthy True" in found[0].what
    assert verdicts.same_gpu(found[0].gpu, "0000:2a:00.0")
    assert [g["route_unhealthy"] for g in seen["fabric_health"]] == ["False", "True"]


def test_the_watcher_does_not_ask_the_health_where_the_boot_did_not_read_it():
    from podvm_gpu.watch import verdicts

    ctx = Ctx(HEALTHY, (0, detail_row(BUS[0], route_unhealthy="True") + detail_row(BUS[1])))
    ctx.answers[tuple(smi.fabric_argv())] = (0, "".join(
        f"{b}, state  Completed, status Success\n" for b in BUS))
    assert verdicts.poll_fabric(ctx, 5, ["0000:18:00.0", "0000:2a:00.0"]) == ([], [])
    assert ctx.asked == [smi.fabric_argv()]


# --- the exporter (metrics/health_families.py) ------------------------------------------------

def test_the_exporter_takes_the_watchers_reading_of_this_boot_else_the_boots():
    from podvm_gpu.metrics.health_families import fabric_health_read

    boot = [{"gpu": BUS[0], "summary_code": 1, "mask": 4}]
    later = [{"gpu": BUS[0], "summary_code": 2, "mask": 16}]
    status = {"started_at": "t0", "fabric": {"kind": "nvswitch", "health": boot}}
    assert fabric_health_read(status, None) == boot
    assert fabric_health_read(status, {"boot_started_at": "t0", "fabric_health": later}) == later
    assert fabric_health_read(status, {"boot_started_at": "t-1", "fabric_health": later}) == boot
    assert fabric_health_read({"fabric": None}, None) == []


def test_dcgm_fabric_health_families_through_the_exporter(tmp_path, fake_nvml_libs):
    """A scrape of a ready NVSwitch VM whose boot read GPU 1's route unhealthy (status.json)
    and whose watcher then read GPU 0 again (watch.json): dcgm-exporter's names and labels, a
    GPU with a value not understood has no series."""
    from fake_nvml import describe, gpu, make_root
    from test_metrics import one, scrape, values

    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=3, nvswitches=4)
    status_path = root / "run/podvm-gpu/status.json"
    doc = json.loads(status_path.read_text())
    buses = ["00000000:18:00.0", "00000000:28:00.0", "00000000:38:00.0"]
    mask_fine = judge.fabric_health("Healthy", FINE).mask
    mask_route = judge.fabric_health("Healthy", {**FINE, "route_unhealthy": "True"}).mask
    doc["fabric"]["health"] = [
        {"gpu": buses[0], "summary": "Healthy", **FINE, "summary_code": 1, "mask": mask_fine},
        {"gpu": buses[1], "summary": "Healthy", **FINE, "route_unhealthy": "True",
         "summary_code": 1, "mask": mask_route},
        {"gpu": buses[2], "summary": "Sparkly", **FINE, "summary_code": None, "mask": None}]
    status_path.write_text(json.dumps(doc))
    families = scrape(root, describe(tmp_path / "desc", [gpu(i) for i in range(3)]))

    assert one(families, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", gpu="0") == 1
    assert one(families, "DCGM_FI_DEV_FABRIC_HEALTH_MASK", gpu="1") == mask_route
    assert values(families, "DCGM_FI_DEV_FABRIC_HEALTH_MASK", gpu="2") == []
    sample = families["DCGM_FI_DEV_FABRIC_HEALTH_MASK"].samples[0]
    assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(sample.labels)

    watch = {"version": 1, "boot_started_at": doc["started_at"], "kmsg_seq": None,
             "started_at": None, "updated_at": None, "finding": None, "warnings": [],
             "warnings_dropped": 0, "nvml_hung": None,
             "fabric_health": [{"gpu": buses[0], "summary_code": 3, "mask": mask_fine}]}
    (root / "run/podvm-gpu/watch.json").write_text(json.dumps(watch))
    families = scrape(root, describe(tmp_path / "desc", [gpu(i) for i in range(3)]))
    assert one(families, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", gpu="0") == 3
    assert values(families, "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", gpu="1") == []
