"""Property-based tests (issue 10) of the functions that read what the agent does not own: config
files, specs in the CDI folders, status files, sysfs values and the tool outputs it parses.

Each input ends in a correct result or the documented error (ConfigError, CdiSpecError,
StatusUnreadable), never another exception; generated well-formed inputs are read back exactly;
near misses of real outputs (real texts with a slice cut, replaced or repeated) never read as
the good state. The same inputs through the real command: test_properties_command.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
import types

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from smi_facts import parse_fabric
from tier import examples

from podvm_gpu import cdi as cdi_dir
from podvm_gpu.cdi.model import Spec
from podvm_gpu.cdi.parse import parse_spec
from podvm_gpu.config.fields import MAX_SECONDS
from podvm_gpu.config.load import parse_config, read_config_text
from podvm_gpu.config.model import Config
from podvm_gpu.errors import QUOTE_MAX, CdiSpecError, CommandError, ConfigError, exit_text, one_line
from podvm_gpu.gpufacts import kernel
from podvm_gpu.gpufacts.smi import parse_cc_mode, parse_fabric_rows, parse_ready_state
from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Completed
from podvm_gpu.host.sysfs import scan_nvidia
from podvm_gpu.model import State, classify
from podvm_gpu.readers import char_majors, gpu_minor, loaded_modules
from podvm_gpu.status import StatusUnreadable, exit_code_for, load_status, run_status
from podvm_gpu.steps.cdi.step import mig_problem

# Random inputs on every run (new ones each time); a failure prints the falsifying example and
# a @reproduce_failure blob, and .hypothesis/ keeps it for the next local run.
FAST = settings(max_examples=examples(300, 100), deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow])
FILES = settings(FAST, max_examples=examples(150, 50))

# Any text a file or a tool may hold: unicode, invalid UTF-8 decoded with replacement, control
# characters, markup.
TEXT = (st.text(max_size=400)
        | st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="replace"))
        | st.text(alphabet="[]/{}:\"'\\\n\t #-=,.0123456789abcdefABCDEF", max_size=200))
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30))


def documents(keys: list[str]) -> st.SearchStrategy:
    """Nested YAML/JSON-able documents whose mapping keys are mostly ``keys``."""
    key = st.sampled_from(keys) | st.text(max_size=12)
    return st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(key, inner, max_size=5), max_leaves=25)


def near_misses(real: str) -> st.SearchStrategy:
    """``real`` with one slice cut out, replaced by other text, or repeated."""
    def edit(args):
        a, b, filler, how = args
        a, b = sorted((a, b))
        if how == "cut":
            return real[:a] + real[b:]
        if how == "repeat":
            return real[:b] + real[a:b] + real[b:]
        return real[:a] + filler + real[b:]

    return st.tuples(st.integers(0, len(real)), st.integers(0, len(real)), TEXT,
                     st.sampled_from(["cut", "replace", "repeat"])).map(edit)


@contextlib.contextmanager
def scratch_root():
    with tempfile.TemporaryDirectory(prefix="pgprop") as folder:
        yield folder


def put(root: str, host_path: str, data: bytes | str) -> str:
    path = os.path.join(root, host_path.lstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return path


# --- config files -------------------------------------------------------------------------------

CONFIG_KEYS = ["budget_s", "timeouts", "tools", "persistenced", "fabricmanager",
               "confidential_computing", "modules", "unavailable_spec", "ready_timeout_s",
               "per_gpu_s", "args", "config_file", "poll_s", "set_ready_state", "parameters",
               "optional", "nvidia", "nvidia-ctk", "nvidia-smi", "modprobe", "NVreg_X",
               # issue 17's keys, and the section one of them lives in
               "allow_devtools", "health", "reset_pending_warns", "lock_after_boot",
               # issue 28's IMEX channels
               "imex", "channels"]
_CONFIG_ERROR = re.compile(r"^cfg\.yaml: (not valid YAML: |must be a mapping|nested too deeply"
                           r"|.+: )")


def valid_seconds(value) -> bool:
    return isinstance(value, float) and 0 <= value <= MAX_SECONDS


def check_config(config: Config) -> None:
    """What a config that passed validation must hold (config.py's field rules)."""
    assert valid_seconds(config.budget_s) and config.budget_s > 0
    assert all(valid_seconds(v) and v > 0 for v in config.timeouts.values())
    assert all(p.startswith("/") for p in config.tools.values())
    assert valid_seconds(config.persistenced.ready_timeout_s)
    assert isinstance(config.unavailable_spec, bool)
    assert all(isinstance(a, str) and a for a in config.persistenced.args)
    # booleans stay booleans: a "yes" or a 1 that passed would turn a fail-closed default off
    assert isinstance(config.confidential_computing.allow_devtools, bool)
    assert isinstance(config.health.reset_pending_warns, bool)
    assert isinstance(config.modules.lock_after_boot, bool)
    # channel ids: whole numbers (never a boolean), in the driver's range, distinct, bounded
    channels = config.imex.channels
    assert isinstance(channels, tuple) and len(channels) <= 64 and len(set(channels)) == len(channels)
    assert all(type(c) is int and 0 <= c <= 2047 for c in channels)


@FAST
@given(st.one_of(TEXT, documents(CONFIG_KEYS).map(
    lambda doc: yaml.safe_dump(doc, allow_unicode=True))))
@example('"a\\nb": 1')  # a key with a line break made a two-line error
@example("timeouts: {" + "x" * 5000 + ": 1}")
@example("health: {reset_pending_warns: 1}")  # issue 17's keys, whatever the draw
@example("modules: {lock_after_boot: 'true'}")
@example("confidential_computing: {allow_devtools: [true]}")
@example("health: {reset_pending_warns: true, lock_after_boot: true}")
@example("imex: {channels: [true, 1.0, -1, 2048, 10000000000000000000000]}")
@example("imex: {channels: [0, 0]}")
def test_any_config_text_is_a_valid_config_or_a_config_error_naming_the_file_and_key(text):
    try:
        config = parse_config(text, "cfg.yaml")
    except ConfigError as err:
        assert _CONFIG_ERROR.match(str(err)), str(err)
        assert "\n" not in str(err) and len(str(err)) < 1000, str(err)
    else:
        check_config(config)


@FILES
@given(st.binary(max_size=600) | TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_config_file_is_text_or_a_config_error(data):
    with scratch_root() as root:
        path = put(root, "/cfg.yaml", data)
        os.chmod(path, 0o644)
        try:
            text = read_config_text(path, required=True, trusted=True)
        except ConfigError as err:
            assert str(err).startswith(f"{path}: ")
            with contextlib.suppress(UnicodeDecodeError):
                data.decode("utf-8")
                assert "not UTF-8" not in str(err)
        else:
            assert text == data.decode("utf-8")


# --- specs in the CDI folders ---------------------------------------------------------------------

SPEC_KEYS = ["kind", "cdiVersion", "devices", "name", "containerEdits", "deviceNodes", "path",
             "env", "mounts", "hooks", "hostPath", "major", "minor", "type"]
KINDS = st.sampled_from(["nvidia.com/gpu", "nvidia.com/GPU", "nvidia.com/gpu ", "vendor.com/x",
                         "", "nvidia.com/gpu\n"])


def spec_documents() -> st.SearchStrategy:
    base = st.fixed_dictionaries({"kind": KINDS | st.text(max_size=20) | SCALARS},
                                 optional={"cdiVersion": st.sampled_from(["0.5.0", "0.6.0", "9"]),
                                           "devices": documents(SPEC_KEYS)})
    return st.one_of(base, documents(SPEC_KEYS))


def spec_files() -> st.SearchStrategy:
    """File bytes: JSON or YAML of a generated document, or anything."""
    return st.one_of(
        spec_documents().map(lambda d: json.dumps(d).encode()),
        spec_documents().map(lambda d: yaml.safe_dump(d, allow_unicode=True).encode()),
        st.binary(max_size=400),
        st.integers(1, 3000).map(lambda n: ("kind: nvidia.com/gpu\nx: " + "[" * n).encode()))


def oracle_kind(data: bytes):
    """The top-level kind as a CDI reader (JSON, else YAML) sees it; None when it has none."""
    text = data.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        try:  # libyaml, as the Go readers are native too (the pure-Python one is slow when deep)
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (yaml.YAMLError, ValueError, RecursionError):
            return None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return kind if isinstance(kind, str) else None


@FILES
@given(spec_files())
def test_the_kind_of_any_spec_file_is_read_as_a_cdi_reader_reads_it_or_reported(data):
    with scratch_root() as root:
        path = put(root, "/var/run/cdi/other.json", data)
        kind, problem = cdi_dir.spec_kind(Root(root), path)
        if problem is None:
            assert kind == oracle_kind(data)
        else:
            assert kind is None and problem in ("nested too deeply to read",)


@FILES
@given(st.lists(st.tuples(st.sampled_from(["a.yaml", "b.json", "c.yml", "toolkit.yaml",
                                           "nvidia.yaml", ".d.yaml", "e.json"]), spec_files()),
                max_size=5, unique_by=lambda t: t[0]))
def test_after_the_duplicate_scan_no_other_spec_of_our_kind_is_left_unreported(files):
    with scratch_root() as root:
        os.makedirs(os.path.join(root, "var/run/cdi"))
        for name, data in files:
            put(root, f"/var/run/cdi/{name}", data)
        warnings = cdi_dir.disable_duplicates(Root(root))
        folder = os.path.join(root, "var/run/cdi")
        for name in os.listdir(folder):
            if not name.endswith((".yaml", ".json")) or name == "nvidia.yaml":
                continue
            with open(os.path.join(folder, name), "rb") as f:
                if oracle_kind(f.read()) == "nvidia.com/gpu":
                    assert any(f"/var/run/cdi/{name} could not be read" in w for w in warnings)
        renamed = [n for n in os.listdir(folder) if n.endswith(cdi_dir.DISABLED_SUFFIX)]
        assert len(warnings) >= len(renamed)


@FAST
@given(st.one_of(TEXT, spec_files().map(lambda b: b.decode("utf-8", "replace"))))
def test_any_text_is_a_spec_or_a_cdi_spec_error(text):
    try:
        spec = parse_spec(text, source="x")
    except CdiSpecError as err:
        assert str(err).startswith("x: ") and "\n" not in str(err)
    else:
        assert isinstance(spec, Spec) and spec.device_names()


# --- status files --------------------------------------------------------------------------------

STATUS_KEYS = ["state", "reason", "warnings", "steps", "version", "started_at", "finished_at"]


def status_files() -> st.SearchStrategy:
    states = st.sampled_from([*State.ALL, "READY", "", "unknown"]) | SCALARS
    doc = st.fixed_dictionaries({"state": states},
                                optional={"reason": SCALARS | TEXT, "warnings": documents(["warning"]),
                                          "steps": documents(STATUS_KEYS)})
    return st.one_of(doc.map(lambda d: json.dumps(d).encode()),
                     documents(STATUS_KEYS).map(lambda d: json.dumps(d).encode()),
                     st.binary(max_size=300),
                     st.integers(1, 5000).map(lambda n: b'{"state": ' + b"[" * n))


def status_oracle(data: bytes) -> int:
    """The exit code of ``podvm-gpu status`` for a file of these bytes (contract section 1)."""
    try:
        doc = json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return 3
    if not isinstance(doc, dict) or doc.get("state") not in State.ALL \
            or not isinstance(doc.get("reason"), (str, type(None))) \
            or not isinstance(doc.get("warnings", []), list) \
            or not all(isinstance(w, str) for w in doc.get("warnings", [])):
        return 3  # docs/interface.md 4.4: warnings is a list of strings
    try:  # text: a lone surrogate ("\ud800" in JSON) is no text the agent wrote
        for text in [doc.get("reason") or "", *doc.get("warnings", [])]:
            text.encode("utf-8")
    except UnicodeEncodeError:
        return 3
    if doc["state"] == "ready" and not doc.get("gpus"):
        # interface.md 4.4 (issue 35 item 8): a ready document that breaks the rules of ready is
        # unreadable; these strategies never draw the GPUs, the first rule
        return 3
    return {"ready": 0, "no-gpu": 0, "failed": 1}.get(doc["state"], 3)


@FILES
@given(status_files())
def test_any_status_file_is_a_status_or_unreadable_and_status_prints_json(data):
    with scratch_root() as root:
        put(root, "/run/podvm-gpu/status.json", data)
        try:
            doc = load_status(Root(root))
        except StatusUnreadable:
            code = 3
        else:
            assert doc["state"] in State.ALL
            code = exit_code_for(doc)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = run_status(root, json_out=True)
        assert rc == code == status_oracle(data)
        printed = json.loads(out.getvalue())
        assert isinstance(printed, dict) and "state" in printed


# --- sysfs values --------------------------------------------------------------------------------

HEX_FORMS = st.sampled_from(["0x{:04x}", "0x{:04X}", "{:04x}", "0X{:04x}"])


@FAST
@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFF), HEX_FORMS)
def test_a_well_formed_pci_function_is_classified_by_vendor_and_class(vendor, cls, form):
    want = None
    if vendor == 0x10DE:
        want = {0x0300: "gpu", 0x0302: "gpu", 0x0680: "nvswitch"}.get(cls >> 8)
    assert classify(form.format(vendor), f"0x{cls:06x}") == want


@FAST
@given(TEXT, TEXT)
def test_any_vendor_and_class_text_is_classified_without_error(vendor, cls):
    kind = classify(vendor, cls)
    assert kind in (None, "gpu", "nvswitch")
    if kind is not None:
        assert vendor.lower().removeprefix("0x").zfill(4) == "10de"


VENDOR_BYTES = st.one_of(st.sampled_from([b"0x10de\n", b"0x10DE\n", b"0x10de", b" 0x10de \n",
                                          b"0x8086\n", b"0x10de\n\xff", b"", b"\xff\xfe"]),
                         st.binary(max_size=20))


@FILES
@given(st.lists(VENDOR_BYTES, max_size=6))
def test_the_sysfs_prescan_finds_exactly_the_functions_whose_vendor_reads_0x10de(vendors):
    with scratch_root() as root:
        for i, data in enumerate(vendors):
            put(root, f"/devices/0000:00:{i:02x}.0/vendor", data)
        count, found = scan_nvidia(os.path.join(root, "devices"))
        want = [f"0000:00:{i:02x}.0" for i, data in enumerate(vendors)
                if data.decode("ascii", errors="replace").strip().lower() == "0x10de"]
        assert count == len(vendors) and found == want


# --- tool outputs --------------------------------------------------------------------------------

LABEL_PAD = st.integers(1, 40)
FABRIC_VALUES = st.sampled_from([("Completed", "Success"), ("In Progress", "N/A"),
                                 ("Not Started", "N/A"), ("Completed", "Insufficient Resources"),
                                 ("N/A", "N/A"), ("completed", "success")])


def fabric_text(gpus: list[tuple[int, tuple[str, str], int]]) -> str:
    """``nvidia-smi -q -d FABRIC`` for GPUs ``(bus, (state, status), label padding)``."""
    lines = ["", "==============NVSMI LOG==============", "", f"Attached GPUs : {len(gpus)}"]
    for bus, (state, status), pad in gpus:
        lines += [f"GPU 00000000:{bus:02X}:00.0", "    Fabric",
                  f"        {'State'.ljust(pad)}: {state}", f"        {'Status'.ljust(pad)}: {status}",
                  f"        {'CliqueId'.ljust(pad)}: N/A", ""]
    return "\n".join(lines) + "\n"


@FAST
@given(st.lists(st.tuples(st.integers(0, 255), FABRIC_VALUES, LABEL_PAD), max_size=8,
                unique_by=lambda g: g[0]))
def test_a_fabric_report_is_read_back_gpu_by_gpu(gpus):
    states = parse_fabric(fabric_text(gpus))
    assert [(s.gpu, s.state, s.status) for s in states] == [
        (f"00000000:{bus:02X}:00.0", state, status) for bus, (state, status), _pad in gpus]
    assert [s.success for s in states] == [
        (state.lower(), status.lower()) == ("completed", "success") for _b, (state, status), _p in gpus]


REAL_FABRIC = fabric_text([(0x18, ("In Progress", "N/A"), 34), (0x2A, ("Not Started", "N/A"), 34)])


@FAST
@given(st.one_of(TEXT, near_misses(REAL_FABRIC)))
def test_no_text_makes_a_gpu_that_did_not_say_completed_and_success_read_as_success(text):
    for s in parse_fabric(text):
        assert isinstance(s.gpu, str) and isinstance(s.state, str) and isinstance(s.status, str)
        if s.success:
            assert re.search(r"^\s*State\s*:\s*completed\s*$", text, re.I | re.M)
            assert re.search(r"^\s*Status\s*:\s*success\s*$", text, re.I | re.M)


# The fabric query's rows as the real nvidia-smi prints them (nvidia-smi-real.md, issue 24).
REAL_FABRIC_ROWS = ("00000000:18:00.0, state  In Progress, status N/A\n"
                    "00000000:2A:00.0, state  Not Started, status N/A\n00000000:3A:00.0, [N/A], [N/A]\n")


@FAST
@given(st.one_of(TEXT, near_misses(REAL_FABRIC_ROWS)))
def test_no_fabric_query_text_reads_as_success_unless_a_row_says_completed_and_success(text):
    states = parse_fabric_rows(text)
    if states is None:
        return
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(states) == len(lines) and all(line.count(",") == 2 for line in lines)
    for s in states:
        if s.success:
            assert re.search(r",\s*(state\s+)?completed\s*,\s*(status\s+)?success\s*$", text,
                             re.I | re.M), text


NOT_READY = st.sampled_from(["not-ready", "not ready", "NOT_READY", "notready", "Not-Ready"])


@FAST
@given(NOT_READY, st.text(alphabet=" \t", max_size=3), TEXT)
def test_a_not_ready_state_in_any_spelling_is_never_read_as_ready(value, space, noise):
    text = f"{noise}\nConfidential Compute GPUs Ready state{space}:{space}{value}\n{noise}"
    assert parse_ready_state(text) != "ready" or re.search(r"Ready state\s*:\s*ready\s*$",
                                                             noise, re.I | re.M)


@FAST
@given(st.one_of(TEXT, near_misses("CC status: OFF\n"), near_misses(
    "Confidential Compute GPUs Ready state: not-ready\n")))
def test_cc_texts_give_a_known_value_or_their_own_word_never_a_guess(text):
    mode, ready = parse_cc_mode(text), parse_ready_state(text)
    assert mode is None or (mode == mode.lower() and mode in text.lower())
    if mode == "off":
        assert re.search(r"CC status\s*:\s*off(\s|$)", text, re.I)
    if ready == "ready":
        assert re.search(r"Ready state\s*:\s*ready\s*$", text, re.I | re.M)


class _StubRunner:
    """Answers the two MIG queries from ``answers``: argv[1] -> (rc, stdout)."""

    def __init__(self, answers):
        self.answers = answers

    def run(self, argv, *, timeout=None, check=True):
        rc, out = self.answers[argv[1]]
        if check and rc != 0:
            raise CommandError(argv, rc, out, "")
        return Completed(list(argv), rc, out, "", 0.0)


QUERY = st.one_of(st.lists(st.tuples(st.integers(0, 7), st.sampled_from(
    ["Enabled", "Disabled", "[N/A]", "enabled "])), max_size=3).map(
    lambda rows: "".join(f"{i}, {m}\n" for i, m in rows)), TEXT)


@FAST
@given(st.integers(-15, 20), QUERY, st.integers(-15, 20), TEXT)
def test_no_gpu_instances_is_said_only_when_nvidia_smi_says_so(query_rc, query, lgi_rc, lgi):
    ctx = types.SimpleNamespace(runner=_StubRunner({"--query-gpu=index,mig.mode.current":
                                                    (query_rc, query), "mig": (lgi_rc, lgi)}),
                                harmless_timeout=lambda tool: 1.0)
    said = mig_problem(ctx)
    assert said is None or ("\n" not in said and len(said) < 700)
    if said and "no GPU instances exist" in said:
        assert "no gpu instances" in lgi.lower() or lgi_rc == 6


@FILES
@given(st.lists(st.tuples(st.integers(1, 511), st.from_regex(r"[a-z][a-z0-9/_-]{0,15}", fullmatch=True)),
                max_size=8, unique_by=lambda e: e[1]), TEXT)
def test_proc_devices_is_read_back_and_any_text_is_survived(entries, noise):
    text = ("Character devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in entries)
            + "\nBlock devices:\n  8 sd\n259 blkext\n")
    with scratch_root() as root:
        put(root, "/proc/devices", text)
        assert char_majors(Root(root)) == {n: m for m, n in entries}
        put(root, "/proc/devices", noise)
        assert all(isinstance(v, int) for v in char_majors(Root(root)).values())


@FILES
@given(st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True), max_size=8, unique=True),
       TEXT)
def test_proc_modules_is_read_back_and_any_text_is_survived(names, noise):
    with scratch_root() as root:
        put(root, "/proc/modules", "".join(f"{n} 16384 0 - Live 0x0000000000000000\n"
                                           for n in names))
        assert loaded_modules(Root(root)) == set(names)
        put(root, "/proc/modules", noise)
        assert all(isinstance(n, str) and n for n in loaded_modules(Root(root)))


INFORMATION = ("Model: \t\t NVIDIA H100 PCIe\nIRQ:   \t\t 0\nGPU UUID: \t GPU-3f6c\n"
               "Bus Location: \t 0000:00:04.0\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n")


@FILES
@given(st.integers(0, 255), st.one_of(TEXT, near_misses(INFORMATION.format(minor=3))))
def test_a_gpu_minor_is_read_back_and_any_information_text_is_survived(minor, noise):
    with scratch_root() as root:
        where = "/proc/driver/nvidia/gpus/0000:00:04.0/information"
        put(root, where, INFORMATION.format(minor=minor))
        assert gpu_minor(Root(root), "0000:00:04.0") == minor
        put(root, where, noise)
        got = gpu_minor(Root(root), "0000:00:04.0")
        assert got is None or re.search(rf"Device Minor:\s*0*{got}\b", noise)


RECORDS = st.lists(st.tuples(st.integers(0, 191), st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n\r\x0b\x0c"
                           "\x1c\x1d\x1e\x85\u2028\u2029"), max_size=80)), max_size=10)


@FILES
@given(RECORDS, st.binary(max_size=300))
def test_kernel_records_are_read_back_and_only_the_kernel_s_are_evidence(records, noise):
    text = "".join(f"{prio},{i},{1000 * i},-;{message}\n" for i, (prio, message) in
                   enumerate(records))
    with scratch_root() as root:
        put(root, "/dev/kmsg", text)
        got = kmsg.read_kernel_records(Root(root))
        assert got == [(prio & 7, message) for prio, message in records if prio >> 3 == 0]
        put(root, "/dev/kmsg", noise)
        for level, message in kmsg.read_kernel_records(Root(root)):
            assert 0 <= level <= 7 and len(message) <= 4096
        kernel.findings(kmsg.read_kernel_log(Root(root)))


LOGRUS_MSG = st.text(alphabet=st.characters(blacklist_characters='"\\\n'), max_size=60)


@FAST
@given(st.lists(st.tuples(st.sampled_from(["info", "warning", "error", "fatal"]), LOGRUS_MSG),
                max_size=6), TEXT)
def test_nvidia_ctk_logrus_errors_are_quoted_as_one_bounded_line(lines, noise):
    stderr = "".join(f'time="2026-12-01T00:00:00Z" level={lvl} msg="{m}"\n' for lvl, m in lines)
    err = CommandError(["nvidia-ctk", "cdi", "generate"], 1, "", stderr + noise)
    message = err.tool_message()
    assert "\n" not in message and len(message) <= QUOTE_MAX
    errors = [m for lvl, m in lines if lvl in ("error", "fatal")]
    if errors and not re.search(r'level=(error|fatal) msg="', noise):
        assert message == one_line(errors[-1]) or (not one_line(errors[-1]) and message)
    for line in err.warnings_about(".") + [err.last_line(), err.said(), str(err)]:
        assert "\n" not in line and len(line) <= QUOTE_MAX + 100


@FAST
@given(st.integers(-200, 300))
def test_every_exit_status_is_put_into_words(code):
    text = exit_text(code)
    assert text == f"exit {code}" if code >= 0 else text.startswith("killed by ")
    if code == -9:
        assert text == "killed by SIGKILL"
