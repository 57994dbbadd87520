"""docs/interface.md and its schemas hold for what the code writes (issue 13).

The documents come from real runs: ``podvm-gpu boot`` on this machine's own ``/sys`` (the CPU
path) with a temporary root, the GPU path through the scenario harness (tests/scenarios: the
real program under umockdev with fake NVIDIA tools) for ready, failed and running boots, and
``check --json`` of real runs. Then the doc's tables against the code: step, check and config
names, the config defaults, the exit codes (by running the command), the unavailable spec.
"""

from __future__ import annotations

import copy
import fcntl
import io
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import product_env
from scenarios.world import DATA, OWN_CASES, SHARED, World, load_case
from schemas import CHECK_SCHEMA, STATUS_SCHEMA, assert_check_conforms, assert_status_conforms, problems, schema

from podvm_gpu.boot import run as boot_run
from podvm_gpu.cdi.unavailable import render_unavailable_spec
from podvm_gpu.check import image as check_image
from podvm_gpu.check import vm as check_vm
from podvm_gpu.config import fields as config_fields
from podvm_gpu.config import load as config_load
from podvm_gpu.config import model as config_model
from podvm_gpu.config.metrics import MetricsSettings
from podvm_gpu.host.fs import Root
from podvm_gpu.host.sysfs import scan_nvidia
from podvm_gpu.model import Step, StepResult
from podvm_gpu.status import READY_STEPS
from podvm_gpu.steps import GPU_STEPS

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "interface.md"
STATUS = "run/podvm-gpu/status.json"
SPEC = "var/run/cdi/nvidia.yaml"
# The machine's own PCI bus decides what a real boot finds; CI machines have no NVIDIA function.
HOST_HAS_NVIDIA = bool(scan_nvidia()[1])

VM_CHECKS = tuple(check_vm.rows())  # the rows of `check` in order (each step's, then the rest)
IMAGE_CHECKS = tuple(check_image.rows())


def doc_text() -> str:
    return DOC.read_text()


def section(number: str) -> str:
    """The text of section ``number`` (``"2.3"``, ``"7"``) of docs/interface.md, up to the next
    heading of the same or a higher level."""
    level = "###" if "." in number else "##"
    m = re.search(rf"^{level} {re.escape(number)}[ .].*?(?=^#{{2,{len(level)}}} |\Z)", doc_text(),
                  re.M | re.S)
    assert m, f"docs/interface.md has no section {number}"
    return m.group(0)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every body row of the markdown tables in ``text`` (a header is the row just
    above a rule row ``|---|...``; cells split at ``|`` but not ``\\|``)."""
    lines = text.splitlines()
    rule = re.compile(r"\|(\s*:?-+:?\s*\|)+")
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("|") or rule.fullmatch(line):
            continue
        if i + 1 < len(lines) and rule.fullmatch(lines[i + 1]):
            continue  # a header
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def ticked(cell: str) -> str:
    """The text inside the first pair of backticks of a cell."""
    m = re.search(r"`([^`]*)`", cell)
    assert m, f"no `name` in {cell!r}"
    return m.group(1)


def product() -> list[str]:
    """The installed ``podvm-gpu`` (what systemd runs), else ``python -m podvm_gpu``."""
    script = Path(sys.executable).parent / "podvm-gpu"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "podvm_gpu"]


# No tool on PATH: a boot on a machine with a GPU can never run a real modprobe.
ENV = product_env(PATH="/nonexistent")


def podvm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the product with ``args``; its exit status and output."""
    return subprocess.run([*product(), *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV)


def status_of(root: Path) -> dict:
    return json.loads((root / STATUS).read_text())


def bad_config(root: Path) -> None:
    (root / "etc/podvm-gpu").mkdir(parents=True, exist_ok=True)
    (root / "etc/podvm-gpu/config.yaml").write_text("budget_s: true\nbogus: 1\n")


# --- status.json of real boots ----------------------------------------------------------------


def test_a_real_cpu_boot_writes_a_status_and_prints_a_document_the_schema_accepts(tmp_path):
    done = podvm("boot", "--root", str(tmp_path), "--json")

    doc = status_of(tmp_path)
    assert_status_conforms(doc)
    assert json.loads(done.stdout) == doc, "boot --json prints the document it wrote"
    assert json.loads(podvm("status", "--root", str(tmp_path), "--json").stdout) == doc
    if not HOST_HAS_NVIDIA:
        assert (done.returncode, doc["state"]) == (0, "no-gpu"), done.stderr
        assert [(s["name"], s["result"]) for s in doc["steps"]] == [("detect", "ok")]
        spec = (tmp_path / SPEC).read_text()
        assert spec == render_unavailable_spec("no-gpu", doc["reason"])


def test_a_real_boot_with_a_bad_config_fails_in_step_config_as_the_schema_says(tmp_path):
    bad_config(tmp_path)
    done = podvm("boot", "--root", str(tmp_path))

    doc = status_of(tmp_path)
    assert_status_conforms(doc)
    assert (done.returncode, doc["state"]) == (1, "failed"), done.stderr
    assert doc["steps"][-1]["name"] == "config" and doc["steps"][-1]["result"] == "failed"
    assert doc["reason"].startswith(f"config: {tmp_path}/etc/podvm-gpu/config.yaml: budget_s: ")


def p02():
    name = "P02-one-h100-pcie-ready.yaml"
    return load_case(next(p for p in (SHARED / "cases" / name, DATA / "cases" / name)
                          if p.exists()))


@pytest.fixture(scope="module")
def p02_boot(umockdev_run) -> tuple[list[dict], dict]:
    """P02 (one H100, every tool answers) booted with a generation that takes 0.5 s, status.json
    read every 2 ms meanwhile: ``(every distinct document seen while it ran, the final one)``."""
    case = copy.deepcopy(p02())
    for rule in case.tools:
        if rule["argv"][:3] == ["nvidia-ctk", "cdi", "generate"]:
            rule["delay_s"] = 0.5
    seen: dict[str, dict] = {}

    def collect(process):
        path = Path(world.path("/" + STATUS))
        while process.poll() is None:
            try:
                text = path.read_text()
            except FileNotFoundError:
                text = ""
            if text and text not in seen:
                seen[text] = json.loads(text)  # written atomically: never a part of one
            time.sleep(0.002)

    with World(case) as world:
        run = world.run("boot", during=collect)
        assert run.rc == 0, run.stderr
        return list(seen.values()), run.status


def test_every_status_a_gpu_boot_writes_while_it_runs_and_at_its_end_conforms(p02_boot):
    """The documents written at start, before and after every step, with the parallel steps in
    flight, and at the end."""
    seen, final = p02_boot

    for doc in [*seen, final]:
        assert_status_conforms(doc)
    assert final["state"] == "ready" and final["cdi"]["devices"][-1] == "all"
    running = [d for d in seen if d["state"] == "running"]
    in_flight = [[s["name"] for s in d["steps"] if s["result"] == "running"] for d in running]
    assert ["detect"] in in_flight, "the document written at start was read"
    assert any("cdi" in names for names in in_flight), in_flight


@pytest.mark.parametrize("name, state", [
    ("P03-hgx-h200-8gpu-4nvswitch-ready.yaml", "ready"),  # NVSwitches: the nvswitches items
    ("C03-gpu-bound-to-nova-core.yaml", "failed"),  # the first GPU step fails
    ("S03-fabric-insufficient-resources.yaml", "failed"),  # a parallel step fails (4.3)
])
def test_the_final_status_of_a_gpu_boot_conforms(umockdev_run, name, state):
    path = next(p for p in (SHARED / "cases" / name, DATA / "cases" / name, OWN_CASES / name)
                if p.exists())
    with World(load_case(path)) as world:
        run = world.run("boot")

    assert run.status is not None, run.status_error
    assert_status_conforms(run.status)
    assert run.status["state"] == state, run.status["reason"]
    assert json.loads(run.stdout) == run.status
    if name.startswith("P03"):
        assert len(run.status["nvswitches"]) == 4


def test_a_boot_that_ends_failed_after_its_spec_was_installed_records_no_cdi(tmp_path, capsys):
    """SIGTERM (or an internal error) after the cdi step installed the ready spec ends the boot
    failed with the unavailable spec in its place: the status must not name the replaced spec
    (section 4.2: failed has cdi null)."""
    run = boot_run.Run(Root(str(tmp_path)), json_out=True, dry_run=False, log=boot_run.Log(io.StringIO()))
    run.status.steps += [Step("detect", StepResult.OK), Step("cdi", StepResult.OK)]
    run.status.cdi = {"path": "/var/run/cdi/nvidia.yaml", "kind": "nvidia.com/gpu",
                      "devices": ["0", "all"]}

    assert run.fail("cdi: interrupted by SIGTERM") == 1

    doc = status_of(tmp_path)
    assert doc["state"] == "failed" and doc["cdi"] is None, doc
    assert_status_conforms(doc)
    spec = yaml.safe_load((tmp_path / SPEC).read_text())
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert json.loads(capsys.readouterr().out)["cdi"] is None


@pytest.mark.parametrize("change, why", [
    (lambda d: d.update(extra=1), "a key the code never writes"),
    (lambda d: d.update(state="done"), "a state that does not exist"),
    (lambda d: d.update(cdi=None), "ready without the spec"),
    (lambda d: d.update(reason="x"), "ready with a reason"),
    (lambda d: d.update(finished_at=None), "a final state without finished_at"),
    (lambda d: d["steps"].pop(3), "ready with a step missing"),
    (lambda d: d["steps"][1].update(name="unload"), "a step name the code has not"),
    (lambda d: d["steps"][2].update(result="failed"), "ready with a failed step"),
    (lambda d: d["gpus"][0].update(class_code="068000"), "an NVSwitch class among the GPUs"),
    (lambda d: d.update(state="running"), "running with a finished_at and no reason"),
    (lambda d: d.update(state="failed", reason="x: y"), "failed with a spec recorded"),
    (lambda d: d.update(state="no-gpu", reason="detect: none"), "no-gpu with GPUs and steps"),
])
def test_the_status_schema_rejects_what_the_code_never_writes(p02_boot, change, why):
    doc = copy.deepcopy(p02_boot[1])
    assert not problems(doc), "the real document itself conforms"
    change(doc)
    assert problems(doc), f"the schema accepts {why}"


# --- check --json of real runs ------------------------------------------------------------------


def test_check_json_of_a_real_vm_and_image_run_conforms_with_every_row_in_order(tmp_path):
    podvm("boot", "--root", str(tmp_path))
    vm = podvm("check", "--root", str(tmp_path), "--json")
    image = podvm("check", "--image", "--root", str(tmp_path), "--json")

    for done, mode, names in ((vm, "vm", VM_CHECKS), (image, "image", IMAGE_CHECKS)):
        doc = json.loads(done.stdout)
        assert_check_conforms(doc)
        assert [c["name"] for c in doc["checks"]] == list(names)
        assert doc["summary"]["mode"] == mode and doc["summary"]["exit"] == done.returncode
        assert done.returncode == (1 if doc["summary"]["fail"] else 0)
    assert json.loads(image.stdout)["summary"]["fail"], "an empty root is no image"


def test_check_json_of_a_gpu_vm_conforms(umockdev_run):
    with World(p02()) as world:
        world.run("boot")
        run = world.run("check")

    doc = json.loads(run.stdout)
    assert_check_conforms(doc)
    assert [c["name"] for c in doc["checks"]] == list(VM_CHECKS)
    assert {c["name"]: c["result"] for c in doc["checks"]}["cdi-spec"] == "pass", doc


def test_check_with_a_named_config_that_is_missing_says_so_in_a_config_row(tmp_path):
    """As boot, config and metrics do: a config asked for must be there (bug fixed: check took
    the defaults and could pass)."""
    done = podvm("check", "--root", str(tmp_path), "--config", str(tmp_path / "none.yaml"),
                 "--json")

    doc = json.loads(done.stdout)
    assert_check_conforms(doc)
    assert done.returncode == 1
    assert doc["checks"][0] == {"name": "config", "result": "fail", "hint": "fix the config file",
                                "detail": f"{tmp_path}/none.yaml: no such file"}


def test_the_check_schema_rejects_rows_of_the_other_mode_and_unknown_results():
    vm = {"checks": [{"name": "pci", "result": "skip", "detail": "", "hint": ""}],
          "summary": {"pass": 0, "warn": 0, "fail": 0, "skip": 1, "mode": "vm", "exit": 0}}
    assert not problems(vm, CHECK_SCHEMA)
    image = copy.deepcopy(vm)
    image["summary"]["mode"] = "image"
    assert problems(image, CHECK_SCHEMA), "pci is no check --image row"
    vm["checks"][0]["result"] = "ok"
    assert problems(vm, CHECK_SCHEMA)


# --- the doc and the schemas against the code -------------------------------------------------


def test_the_step_names_of_schema_doc_and_code_are_the_same():
    code = set(re.findall(r'\bStep\("([a-z-]+)"', (REPO / "podvm_gpu/boot/__init__.py").read_text()))
    assert code == {"detect", "config", "initdata"}, "boot/__init__.py's own steps"
    names = ["detect", "config", "initdata", *GPU_STEPS]
    step = schema(STATUS_SCHEMA)["$defs"]["step"]["properties"]
    assert step["name"]["enum"] == names
    ready = next(rule["then"] for rule in schema(STATUS_SCHEMA)["allOf"]
                 if rule["if"]["properties"]["state"] == {"const": "ready"})
    ready = ready["properties"]["steps"]["prefixItems"]
    assert [item["properties"]["name"]["const"] for item in ready] == \
        ["detect", *GPU_STEPS]
    # the readers' own copy of the rule (status.py: standard library only; issue 35 item 8)
    results = [item["properties"]["result"] for item in ready]
    assert [(name, list(allowed)) for name, allowed in READY_STEPS] == \
        [(item["properties"]["name"]["const"], r["enum"] if "enum" in r else [r["const"]])
         for item, r in zip(ready, results)]
    assert [ticked(row[0]) for row in table_rows(section("3.2"))] == names
    assert f"`{'`, `'.join(names)}`" in section("4.1")


def test_the_check_rows_of_schema_doc_and_code_are_the_same():
    made = {name for path in (REPO / "podvm_gpu").rglob("*.py")
            for name in re.findall(r'\bCheck\("([a-z-]+)"', path.read_text())}
    defs = schema(CHECK_SCHEMA)["$defs"]
    assert defs["vm_names"]["enum"] == ["config", *VM_CHECKS]
    assert defs["image_names"]["enum"] == ["config", *IMAGE_CHECKS]
    assert made <= {"config", *VM_CHECKS, *IMAGE_CHECKS}
    assert [ticked(row[0]) for row in table_rows(section("5.1"))] == list(VM_CHECKS)
    assert [ticked(row[0]) for row in table_rows(section("6"))] == list(IMAGE_CHECKS)


def config_keys(section_cls=config_model.Config, prefix="") -> dict[str, object]:
    """Every config key as a dotted path -> its default as plain data."""
    keys = {}
    defaults = section_cls().to_dict()
    for name, (checker, _default) in section_cls.FIELDS.items():
        if isinstance(checker, type) and issubclass(checker, config_fields.Section):
            keys.update(config_keys(checker, f"{prefix}{name}."))
        elif name == "metrics":
            keys.update({f"metrics.{k}": v for k, v in MetricsSettings().to_dict().items()})
        else:
            keys[f"{prefix}{name}"] = defaults[name]
    return keys


def test_the_config_table_has_every_key_with_its_default_and_nothing_else():
    rows = {ticked(row[0]): row for row in table_rows(section("7")) if row[0].startswith("`")}
    keys = config_keys()
    assert sorted(rows) == sorted(keys)
    for key, default in keys.items():
        written = yaml.safe_load(ticked(rows[key][2]))
        assert written == default, f"{key}: the doc says {written!r}, the code {default!r}"


def test_config_json_prints_every_key_in_force_as_the_doc_says(tmp_path):
    done = podvm("config", "--root", str(tmp_path), "--json")
    doc = json.loads(done.stdout)

    assert list(doc) == ["config", "valid", "present", "compiled", "settings"]
    assert doc["valid"] is True and doc["present"] is False
    assert '`{"config": <path>, "valid": true, "present": <false with no file at the default ' \
        'path>, "compiled": <path or null>, "settings"' in section("1.4")
    flat = {}
    for name, value in doc["settings"].items():
        if isinstance(value, dict) and name not in ("timeouts", "tools"):  # a section
            flat.update({f"{name}.{key}": item for key, item in value.items()})
        else:
            flat[name] = value
    assert flat == config_keys()


def test_the_doc_gives_the_tool_timeouts_and_names_the_code_uses():
    row = next(r for r in table_rows(section("7")) if r[0] == "`timeouts`")
    pairs = dict(re.findall(r"([a-z-]+) (\d+)", row[3]))
    from podvm_gpu.host.proc import DEFAULT_TIMEOUT_S

    assert {t: float(s) for t, s in pairs.items() if t != "other"} == config_model.DEFAULT_TIMEOUTS
    assert float(pairs["other"]) == DEFAULT_TIMEOUT_S
    tools = re.search(r"A tool name in `timeouts` or `tools` is one of: (.*?)\.\n\n", section("7"),
                      re.S).group(1)
    assert re.findall(r"`([^`]+)`", tools) == list(config_fields.TOOLS)


def test_the_unavailable_spec_in_the_doc_is_what_boot_writes():
    block = re.search(r"```yaml\n(.*?)```", section("2.3"), re.S).group(1)
    assert block == render_unavailable_spec("no-gpu", "detect: no NVIDIA GPU on PCI (2 devices "
                                                      "scanned)")


def test_the_status_example_in_the_doc_conforms_and_has_every_key():
    example = json.loads(re.search(r"```json\n(.*?)```", section("4.4"), re.S).group(1))
    assert_status_conforms(example)
    assert [ticked(row[0]) for row in table_rows(section("4.1"))][:len(example)] == list(example)


def test_the_compiled_config_format_in_the_doc_is_the_code_s():
    assert f'"format": "{config_load.COMPILED_FORMAT}"' in section("2.6")
    assert f"`<config>{config_load.COMPILED_SUFFIX}`" in section("2.6")


def test_the_doc_refers_only_to_files_in_the_repository():
    text = doc_text()
    assert "../" not in text and "CONTRACT" not in text
    for path in set(re.findall(r"`((?:podvm_gpu|tests|docs|systemd|bin)/[\w./-]+)`", text)):
        assert (REPO / path).exists(), f"docs/interface.md names {path}, which is not in the repo"


# --- the README and the other docs: the guide, its map, and what they name ----------------------

GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """Text outside fenced code blocks (a ``# comment`` in a block is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """The heading anchors of a Markdown file, as GitHub makes them."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", _prose(path.read_text()), re.M)}


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_in_the_guides_reaches_a_file_and_heading_in_the_repository(doc):
    """The README moved its reference text into docs/ (issue 20): a link that still points at a
    README section, or at ``docs/...`` from inside docs/, would lead nowhere."""
    for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]*`", "", _prose(doc.read_text()))):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        where = (doc.parent / file).resolve() if file else doc
        assert where.exists(), f"{doc.name} links to {target}, which is not in the repo"
        if anchor:
            assert anchor in _anchors(where), f"{doc.name} links to {target}: no such heading"


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_guides_name_only_files_in_the_repository(doc):
    """Paths are written from the repository root; one with ``<...>`` is a pattern, one with
    ``*`` a glob, and the bundle folder in mkosi/ is made by the integrator, not kept in git."""
    text = doc.read_text()
    for path in set(re.findall(r"`((?:podvm_gpu|tests|docs|systemd|bin|bench|packer|mkosi|\.ci)/[^`\s]*)`",
                               text)):
        if "<" in path or "{" in path or path == "mkosi/mkosi.extra/opt/podvm-gpu-bundle/":
            continue
        found = list(REPO.glob(path)) if "*" in path else [REPO / path] if (REPO / path).exists() else []
        assert found, f"{doc.relative_to(REPO)} names {path}, which is not in the repo"


def test_the_readme_is_a_guide_that_links_every_doc_and_keeps_the_test_command():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    for doc in sorted((REPO / "docs").iterdir()):
        assert f"](docs/{doc.name})" in readme, f"the README's map of docs/ lacks {doc.name}"
    assert "bash .ci/run" in readme and "`.venv/bin/python -m pytest`" in readme
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("\n.venv/bin/python -m pytest")


# --- exit codes: the table of section 1.3 against the real command ----------------------------


def exit_table() -> dict[tuple[str, str], int]:
    return {(ticked(cmd), when): int(code) for cmd, when, code in table_rows(section("1.3"))}


def _booted(root: Path) -> None:
    podvm("boot", "--root", str(root))


def _failed(root: Path) -> None:
    bad_config(root)
    podvm("boot", "--root", str(root))
    (root / "etc/podvm-gpu/config.yaml").unlink()


def _running(root: Path) -> None:
    """A document as boot writes it at start: the real first one, with the state running."""
    _booted(root)
    doc = status_of(root)
    doc.update(state="running", reason=None, finished_at=None)
    doc["steps"][0].update(result="running", duration_s=0.0, message="")
    assert_status_conforms(doc)
    (root / STATUS).write_text(json.dumps(doc))


def _garbled(root: Path) -> None:
    (root / "run/podvm-gpu").mkdir(parents=True)
    (root / STATUS).write_text("{not json")


def _garbled_ready(root: Path) -> None:
    """Issue 35 item 8's hand-edited document: it was ready, exit 0."""
    (root / "run/podvm-gpu").mkdir(parents=True)
    (root / STATUS).write_text('{"state": "ready", "gpus": "lots", "cdi": 5}')


def _config(text: str):
    def make(root: Path) -> None:
        (root / "etc/podvm-gpu").mkdir(parents=True, exist_ok=True)
        (root / "etc/podvm-gpu/config.yaml").write_text(text)
    return make


CPU = [] if HOST_HAS_NVIDIA else [
    ("boot", "the boot ended `ready` or `no-gpu`", None, ["boot"]),
    ("status", "state `ready` or `no-gpu`", _booted, ["status"]),
    ("check", "no row is `fail` (warnings allowed)", _booted, ["check"]),
    ("boot --dry-run", "no GPU found, or a plan for the GPUs found", None, ["boot", "--dry-run"]),
]
RUNS = CPU + [
    ("boot", "the boot ended `failed`", bad_config, ["boot"]),
    ("boot", "usage error", None, ["boot", "--no-such-option"]),
    ("boot --dry-run", "the config is invalid (the boot would end `failed`)", bad_config,
     ["boot", "--dry-run"]),
    ("status", "state `failed`", _failed, ["status"]),
    ("status", "state `running` (also one no boot will finish: section 4.4)", _running, ["status"]),
    ("status", "no status file yet", None, ["status"]),
    ("status", "the status file is unreadable (not JSON, no valid `state`, not a regular file, "
     "a `ready` that breaks the rules of ready: section 4.4)", _garbled, ["status", "--json"]),
    ("status", "the status file is unreadable (not JSON, no valid `state`, not a regular file, "
     "a `ready` that breaks the rules of ready: section 4.4)", _garbled_ready, ["status"]),
    ("status --wait", "the timeout passed before a final state", _running,
     ["status", "--wait", "--timeout", "0.1"]),
    ("status", "a bad `--timeout` (empty, not a plain number in ASCII digits, negative, infinite, "
     "with an exponent: `--timeout '1e3' has an exponent: write the seconds as a plain number "
     "(1000, not 1e3)`), or `--timeout` without `--wait` (`--timeout needs --wait: ...`)",
     None, ["status", "--timeout", "-1"]),
    ("status", "a bad `--timeout` (empty, not a plain number in ASCII digits, negative, infinite, "
     "with an exponent: `--timeout '1e3' has an exponent: write the seconds as a plain number "
     "(1000, not 1e3)`), or `--timeout` without `--wait` (`--timeout needs --wait: ...`)",
     None, ["status", "--timeout="]),
    ("status", "a bad `--timeout` (empty, not a plain number in ASCII digits, negative, infinite, "
     "with an exponent: `--timeout '1e3' has an exponent: write the seconds as a plain number "
     "(1000, not 1e3)`), or `--timeout` without `--wait` (`--timeout needs --wait: ...`)",
     None, ["status", "--wait", "--timeout", "1e3"]),
    ("status", "a bad `--timeout` (empty, not a plain number in ASCII digits, negative, infinite, "
     "with an exponent: `--timeout '1e3' has an exponent: write the seconds as a plain number "
     "(1000, not 1e3)`), or `--timeout` without `--wait` (`--timeout needs --wait: ...`)",
     None, ["status", "--timeout", "5"]),
    ("check", "a row is `fail` (also the `config` row of a bad or missing named config)", _booted,
     ["check", "--config", "/nonexistent/config.yaml"]),
    ("check --image", "a row is `fail`", None, ["check", "--image"]),
    ("config", "the config is valid (or absent at the default path)", None, ["config"]),
    ("config", "the config is invalid, a named config is missing, or boot would refuse the file "
     "(another user than root could change it: the same verdict as boot's)", bad_config,
     ["config"]),
    ("config --compile", "no config file, or the compiled file cannot be written", None,
     ["config", "--compile"]),
    ("metrics", "printed, or the textfile written", None, ["metrics", "--textfile"]),
    ("metrics --listen", "the address cannot be bound (in use, not an address of this machine)",
     None, ["metrics", "--listen", "192.0.2.1:9400"]),
    ("metrics --listen", "the address is not `HOST:PORT` with an IP address and a port of ASCII "
     "digits (`127.0.0.1:²`, Arabic-Indic digits): `podvm-gpu: error: --listen '<value>' ...` "
     "after the usage line", None, ["metrics", "--listen", "localhost:9400"]),
    ("metrics --serve", "no listen address and the textfile off: nothing to serve", None,
     ["metrics", "--serve", "--listen="]),
    ("metrics", "the config is invalid, a named config is missing, or boot would refuse the file "
     "(another user than root could change it: the same verdict as boot's)", _config("metrics: 1\n"),
     ["metrics"]),
    ("metrics --json", "usage error", None, ["metrics", "--json"]),
    ("check --image --attest", "usage error: the two cannot be used together", None,
     ["check", "--image", "--attest"]),
    ("metrics --pod-labels", "with `--serve`, `--listen`, `--web-config`, `--textfile` or "
     "`--openmetrics`: usage error naming both", None, ["metrics", "--pod-labels", "--textfile"]),
]


@pytest.mark.parametrize("command, when, setup, args", RUNS, ids=[f"{c}: {w}" for c, w, _, _ in RUNS])
def test_the_exit_code_table_says_what_the_command_returns(tmp_path, command, when, setup, args):
    if setup:
        setup(tmp_path)
    done = podvm(*args, "--root", str(tmp_path))

    assert done.returncode == exit_table()[(command, when)], (done.stdout, done.stderr)


def test_version_exits_0_as_the_table_says():
    done = podvm("--version")
    assert (done.returncode, done.stdout.split()[0]) == (exit_table()[("--version", "always")],
                                                         "podvm-gpu")


def test_a_boot_that_cannot_get_the_lock_exits_as_the_table_says(tmp_path):
    """The lock held (by this test) past a budget of 0.3 s, then held while a SIGTERM arrives:
    both boots end without writing anything."""
    _config("budget_s: 0.3\n")(tmp_path)
    lock = tmp_path / "run/podvm-gpu/boot.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waited = podvm("boot", "--root", str(tmp_path))
        proc = subprocess.Popen([*product(), "boot", "--root", str(tmp_path)], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
        deadline = time.monotonic() + 10
        err = ""
        while "another boot holds" not in err:  # its stderr says it waits: signal it now
            assert time.monotonic() < deadline and proc.poll() is None, err
            err += proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        out, rest = proc.communicate(timeout=10)
    table = exit_table()

    assert waited.returncode == table[("boot", "another boot held the lock for longer than "
                                               "`budget_s` (nothing written)")], waited.stderr
    assert "this one ends without writing anything" in waited.stderr
    assert proc.returncode == table[("boot", "SIGTERM or SIGINT before the lock was held, or "
                                             "SIGINT while the program loads (nothing "
                                             "written)")], err + rest
    assert "stopped by SIGTERM before this boot began (nothing written)" in rest
    assert sorted(p.name for p in lock.parent.iterdir()) == ["boot.lock"], "nothing written"
    assert not (tmp_path / "var").exists()


def test_the_cpu_fast_paths_budget_is_the_config_models_default():
    """boot/__init__.py states the budget again (the CPU fast path must not import the config
    model, tests/test_layout.py): the copy is the model's default, the one place defaults live."""
    from podvm_gpu.boot import DEFAULT_BUDGET_S
    from podvm_gpu.config.model import Config

    assert DEFAULT_BUDGET_S == Config().budget_s == Config.FIELDS["budget_s"][1]


def test_the_status_records_the_installed_specs_cdi_version(p02_boot):
    """Issue 46 item 8: podman before 5 cannot read a 0.7.0 spec; status.json says which one
    the VM has (``cdi.cdi_version``), the spec's own ``cdiVersion``."""
    _seen, final = p02_boot
    [rule] = [r for r in p02().tools if r["argv"][:3] == ["nvidia-ctk", "cdi", "generate"]]
    generated = re.search(r"Generated CDI spec with version ([0-9.]+)", rule["stderr"]).group(1)
    assert final["cdi"]["cdi_version"] == generated
    bad = copy.deepcopy(final)
    bad["cdi"]["cdi_version"] = "0.7"
    assert problems(bad, STATUS_SCHEMA), "the schema takes a version of two parts"
