"""The package's layout rules (issue 20): one concern is one room, and the rooms say so.

- no import circle in ``podvm_gpu/``, counting imports inside functions and the package
  ``__init__`` every import of a submodule runs first;
- no file in ``podvm_gpu/`` over 500 lines;
- the step list (``podvm_gpu/steps/__init__.py``) is the only place that names a step's module:
  deleting a step's module leaves only that list naming it;
- the CPU fast path imports only the modules it needs (``-X importtime``);
- the layer table of docs/design.md ("Layers"): a package or root module imports only what sits
  in a layer below its own (imports inside functions counted), and the import graph between
  them has no circle;
- one kernel-log record parser (``host/kmsg.py``), the log's readers in ``host/`` (issue 44);
- no module outside ``podvm_gpu/gpufacts/`` imports a parser of gpufacts (smi.py's ``parse_*``,
  words.py's ``csv_rows`` and ``na``) or runs one of smi.py's command lines (issue 44);
- no function over 60 lines (``def`` line to its last, docstring included) but the ones
  :data:`LONG_FUNCTIONS` names (issue 44 item 5: a long function is split into its phases);
- one nvidia-ctk back end (``podvm_gpu/nvidia_ctk.py``, issue 44 item 4): no other module writes
  a command line of nvidia-ctk or nvidia-cdi-hook, or names a hook.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podvm_gpu import steps

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "podvm_gpu"
MAX_LINES = 500
# What `podvm-gpu boot` imports of the package on a CPU VM: the run, the fast path, PCI and
# VMBus from sysfs, the status file, the unavailable spec and the spec directories.
FAST_PATH = {"podvm_gpu", "podvm_gpu.cli", "podvm_gpu.boot", "podvm_gpu.boot.run",
             "podvm_gpu.cdi", "podvm_gpu.cdi.unavailable", "podvm_gpu.ending", "podvm_gpu.host",
             "podvm_gpu.host.fs", "podvm_gpu.host.rtmr", "podvm_gpu.host.sysfs",
             "podvm_gpu.journal", "podvm_gpu.jsontext", "podvm_gpu.model", "podvm_gpu.status"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file, with the parent packages
    Python runs first (``import a.b.c`` runs ``a`` and ``a.b``)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            if target not in known:
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                pkg = ".".join(parts[:i])
                # a module's own parents are running already when it runs: no edge to them
                if pkg in known and pkg != name and not name.startswith(pkg + "."):
                    found.add(pkg)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_there_is_no_import_circle_in_the_package():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}

    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle_through_an_import_inside_a_function(tmp_path):
    graph = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}

    assert circles(graph) == [["p.a", "p.b"]]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_no_file_of_the_package_is_over_500_lines(path):
    lines = len(path.read_text().splitlines())

    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines: split it by concern"


@pytest.mark.parametrize("step, module", steps.STEPS)
def test_only_the_step_list_names_a_steps_module(step, module):
    """Deleting a step's module must leave only the step list naming it: the pipeline, the
    dry-run plan and both check runners take the steps from the list."""
    known = modules()
    target = f"podvm_gpu.steps.{module}"
    naming = sorted(name for name, path in known.items()
                    if name not in ("podvm_gpu.steps", target)
                    and target in imports_of(name, path, known))

    assert naming == []
    owner = steps.module(step)
    assert callable(getattr(owner, "run", None)) or step == "detect", "a step runs"
    assert getattr(owner, "VM_ROWS", None), "a step says how a running VM stands with it"


def test_every_step_module_or_package_is_in_the_step_list():
    """A module of ``steps/`` is a step; a package of ``steps/`` is a step's room, whose
    ``step.py`` is the step (podvm_gpu/steps/__init__.py): both are in the step list, and
    nothing else is in ``steps/`` but the shared context."""
    listed = {module for _, module in steps.STEPS}
    folder = PACKAGE / "steps"
    present = {p.stem for p in folder.glob("*.py")} - {"__init__", "context"}
    present |= {f"{p.parent.name}.step" for p in folder.glob("*/__init__.py")}

    assert present == listed


@pytest.mark.parametrize("room", sorted(p.parent.name for p in (PACKAGE / "steps").glob("*/__init__.py")))
def test_a_step_room_has_its_step_and_no_code_in_its_init(room):
    """Importing a room's helper (the fabric kind, the attach cause) must not import the step:
    the room's ``__init__.py`` is a docstring only."""
    folder = PACKAGE / "steps" / room
    body = ast.parse((folder / "__init__.py").read_text()).body

    assert (folder / "step.py").is_file()
    assert all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


# docs/design.md, "Layers": the lowest first. A root module or package of podvm_gpu ("unit") may
# import only units of a lower layer; the entry points (``python -m``) sit above everything.
LAYERS = {
    "errors": 0, "record": 0, "jsontext": 0, "model": 0, "pci_ids": 0, "nvidia_ctk": 0,
    "host": 1,
    "config": 2, "cdi": 2, "status": 2, "readers": 2, "gpufacts": 2, "units": 2, "kata": 2, "row": 2,
    "watchfile": 2, "journal": 2,
    "steps": 3, "initdata": 3,
    "check": 4, "metrics": 4, "ending": 4,
    "boot": 5,
    "watch": 6,
    "app": 7,
    "cli": 8,
    "entry": 9,
}
ENTRY_POINTS = {"podvm_gpu.__main__", "podvm_gpu.metrics.__main__"}


def unit(name: str) -> str:
    """The layer-table unit of a module: ``podvm_gpu.steps.fabric.step`` -> ``steps``."""
    if name in ENTRY_POINTS:
        return "entry"
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "podvm_gpu"


def unit_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        here = unit(name)
        for target in imports_of(name, path, known):
            there = unit(target)
            if there not in (here, "podvm_gpu"):  # the package's own __init__: the version only
                graph.setdefault(here, set()).add(there)
            graph.setdefault(there, set())
    return graph


def test_every_unit_of_the_package_has_a_layer():
    units = {unit(name) for name in modules()} - {"podvm_gpu"}

    assert units - set(LAYERS) == set(), "add it to LAYERS here and to docs/design.md's table"
    assert set(LAYERS) - units == set(), "a unit that is gone: drop it from the table"


def test_every_import_goes_down_the_layer_table():
    """Host at the bottom imports nothing of the package above it; the steps import no runner
    (boot, check, metrics, cli); nothing but the entry points imports cli."""
    climbing = sorted(f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]})"
                      for a, targets in unit_graph().items() for b in targets
                      if LAYERS[b] >= LAYERS[a])

    assert climbing == []


def test_the_layer_table_of_the_design_doc_is_the_tests():
    text = (REPO / "docs" / "design.md").read_text()
    table = text[text.index("| layer |"):]
    rows = {}
    for line in table.splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0].isdigit():
            for name in cells[1].replace("`", "").split(","):
                rows[name.strip().removesuffix("/").removesuffix(".py")] = int(cells[0])

    assert rows == LAYERS


def test_there_is_no_import_circle_between_the_packages():
    assert circles(unit_graph()) == []


def test_the_layer_check_catches_a_climb_inside_a_function(tmp_path, monkeypatch):
    """The rule counts an import inside a function (host/proc.py once imported config.load
    there for the file-trust rule)."""
    fake = tmp_path / "podvm_gpu"
    (fake / "host").mkdir(parents=True)
    (fake / "config").mkdir()
    for path in (fake / "__init__.py", fake / "host" / "__init__.py", fake / "config" / "__init__.py"):
        path.write_text("")
    (fake / "config" / "load.py").write_text("def untrusted_because(path):\n    return None\n")
    (fake / "host" / "proc.py").write_text(
        "def trust(path):\n    from podvm_gpu.config.load import untrusted_because\n"
        "    return untrusted_because(path)\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)

    assert unit_graph()["host"] == {"config"}


# Standard modules the CPU fast path does without (each costs a boot 0.3-3 ms; contextlib and
# what it pulls in, collections and functools, cost the bench's boot row 1.30x -> 1.53x, issue 44).
NOT_ON_THE_FAST_PATH = {"yaml", "pyudev", "argparse", "json", "re", "enum", "contextlib",
                        "collections", "functools", "threading", "subprocess", "typing",
                        "dataclasses"}


def fast_path_imports(root: Path) -> set[str]:
    """The modules a CPU boot of ``root`` imports, without site (-S: an editable install's
    ``.pth`` imports half of :data:`NOT_ON_THE_FAST_PATH` before any code of ours runs)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-S", "-X", "importtime", str(REPO / "bin" / "podvm-gpu"),
                           "boot", "--root", str(root)], capture_output=True, text=True,
                          timeout=60, env=env)

    assert done.returncode == 0, done.stderr
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:")}


def test_the_cpu_fast_path_imports_only_what_it_needs(tmp_path):
    imported = fast_path_imports(tmp_path)

    ours = {name for name in imported if name.split(".")[0] == "podvm_gpu"}
    assert ours == FAST_PATH
    assert not NOT_ON_THE_FAST_PATH & imported, NOT_ON_THE_FAST_PATH & imported


def test_the_cpu_fast_path_with_a_compiled_config_imports_no_heavy_module(tmp_path):
    """The image's config, compiled as the installers compile it: the config's modules load, and
    what they import (nvidia_ctk.py's hook names) must not bring ``re`` and the rest (issue 44:
    the bench's boot-config row went from 1.45x to 2.12x of ``-c pass`` when it did)."""
    (tmp_path / "etc/podvm-gpu").mkdir(parents=True)
    (tmp_path / "etc/podvm-gpu/config.yaml").write_text(
        "budget_s: 200\ncdi:\n  disable_hooks: [chmod]\n")
    compiled = subprocess.run([sys.executable, str(REPO / "bin" / "podvm-gpu"), "config", "--root",
                               str(tmp_path), "--compile"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert compiled.returncode == 0, compiled.stderr

    imported = fast_path_imports(tmp_path)

    assert "podvm_gpu.config.fields" in imported and "yaml" not in imported
    assert not NOT_ON_THE_FAST_PATH & imported, NOT_ON_THE_FAST_PATH & imported


def design_tree() -> dict[str, str]:
    """docs/design.md's module tree: each top-level entry (``cli.py``, ``steps/``) -> its text."""
    text = (REPO / "docs" / "design.md").read_text()
    block = text[text.index("```\npodvm_gpu/\n") + 4:]
    block = block[:block.index("```")]
    sections: dict[str, str] = {}
    name = None
    for line in block.splitlines()[1:]:
        if line.startswith("  ") and not line.startswith("   "):
            name = line.split()[0]
            sections[name] = ""
        if name:
            sections[name] += line + "\n"
    return sections


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_is_in_the_design_docs_tree(path):
    """docs/design.md's tree lists every module where it lives: a root module as an entry, a
    package's module (and each folder on the way) inside its package's entry; a package's
    ``__init__.py`` by its folder."""
    sections = design_tree()
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1:
        assert parts[0] == "__init__.py" or parts[0] in sections
        return
    assert f"{parts[0]}/" in sections
    words = set(sections[f"{parts[0]}/"].replace(",", " ").replace(";", " ").split())
    inner = [f"{p}/" for p in parts[1:-1]] + ([] if parts[-1] == "__init__.py" else [parts[-1]])
    assert set(inner) <= words, f"docs/design.md's {parts[0]}/ entry lacks {set(inner) - words}"


def test_the_design_docs_tree_names_no_module_that_is_gone():
    present = {p.name for p in PACKAGE.rglob("*.py")} | {f"{p.name}/" for p in PACKAGE.rglob("*") if p.is_dir()}
    named = {word for text in design_tree().values()
             for word in text.replace(",", " ").replace(";", " ").split()
             if word.endswith(".py") or (word.endswith("/") and word[:-1].isidentifier())}

    assert named - present == set()


def test_ci_runs_the_linter_before_the_tests_and_the_tree_is_clean():
    """``.ci/run`` runs ``ruff check`` before the test command (a finding fails the run, set -e),
    ruff comes with the [test] extra, and the tree has no finding now."""
    ci = (REPO / ".ci" / "run").read_text()
    project = (REPO / "pyproject.toml").read_text()

    assert "\n.venv/bin/ruff check podvm_gpu tests bench\n" in ci
    assert ci.index("ruff check") < ci.index("\n.venv/bin/python -m pytest")
    assert '"ruff' in project[project.index("test = ["):project.index("[tool.setuptools]")]
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "podvm_gpu", "tests", "bench"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_metrics_imports_no_step():
    """Issue 33: the exporter takes the GPUs' facts and verdicts from podvm_gpu/gpufacts/, never
    a step's module (it imported steps/cdi/recovery.py, steps/fabric/nvl5.py and
    steps/cc/classify.py to share words)."""
    known = modules()
    climbing = sorted(f"{name} imports {target}" for name, path in known.items()
                      if unit(name) == "metrics"
                      for target in imports_of(name, path, known) if unit(target) == "steps")

    assert climbing == []


def parses_kmsg_records(source: str) -> list[str]:
    """What in ``source`` parses a ``/dev/kmsg`` record itself: a pattern of the record prefix
    (a string holding ``[^;]``, the flags before the message) or a line cut at ``;``
    (``.partition(";")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and \
                ("[^;]" in node.value if isinstance(node.value, str) else b"[^;]" in node.value):
            found.append(f"line {node.lineno}: the pattern {node.value!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("partition", "rpartition") and node.args and \
                isinstance(node.args[0], ast.Constant) and node.args[0].value in (";", b";"):
            found.append(f"line {node.lineno}: .{node.func.attr}({node.args[0].value!r})")
    return found


def test_only_host_kmsg_parses_a_kernel_log_record():
    """Issue 44 item 3: one record parser (``host/kmsg.py`` ``parse_line``) for every reader of
    the kernel log (boot's, check's, the once-per-boot reader, the watcher's follower); the
    log's readers live in ``host/`` (``journal.py`` only writes the console line to it)."""
    home = PACKAGE / "host" / "kmsg.py"
    others = {str(path.relative_to(PACKAGE)): parses_kmsg_records(path.read_text())
              for path in PACKAGE.rglob("*.py") if path != home}
    naming = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                    if "/dev/kmsg" in path.read_text() and path.parent.name != "host")

    assert {name: found for name, found in others.items() if found} == {}
    assert parses_kmsg_records(home.read_text()), "the one parser moved: update this rule"
    assert naming == ["journal.py"], "a reader of the kernel log outside host/"


def test_the_parser_rule_finds_a_second_parser():
    second = ('import re\nRECORD = re.compile(r"(\\d+),(\\d+),(\\d+),[^;]{0,16}")\n'
              'def parse(line):\n    head, sep, message = line.partition(";")\n')

    assert len(parses_kmsg_records(second)) == 2


def test_the_watcher_imports_nothing_of_boot():
    """Issue 44 item 2: the watcher takes GPUs away through the one ending (podvm_gpu/ending.py),
    below both; it imports nothing of ``podvm_gpu.boot`` (it took ``untrusted_root``, ``Log``
    and ``tell_console`` from boot/run.py)."""
    known = modules()
    climbing = sorted(f"{name} imports {target}" for name, path in known.items()
                      if unit(name) == "watch"
                      for target in imports_of(name, path, known) if unit(target) == "boot")

    assert climbing == []


def classes_named(name: str) -> list[str]:
    """Every class of the package named ``name``, as ``path:line`` under podvm_gpu/ (AST)."""
    return sorted(f"{path.relative_to(PACKAGE)}:{node.lineno}" for path in PACKAGE.rglob("*.py")
                  for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.ClassDef) and node.name == name)


def test_no_class_of_the_package_is_named_verdict():
    """Issue 44 item 1: results were held in four classes named ``Verdict`` (cdi/health.py,
    cc/classify.py, cc/attest/verdict.py, watch/verdicts.py). The health and watcher ones went
    into gpufacts' one finding type; the CC decision (``classify.CcDecision``) and the nvattest
    run's outcome (``attest.verdict.NvattestOutcome``) keep their jobs under names of their own."""
    assert classes_named("Verdict") == []


def test_one_class_of_the_package_is_named_finding():
    """Issue 44 item 1: one finding type, podvm_gpu/gpufacts/finding.py's ``Finding`` (the
    kernel log's, cdi/health.py's, cdi/recovery.py's, fabric/parse.py's and the watcher's holders
    are gone; the CC queries' answers are ``classify.CcAnswers``)."""
    named = [where.split(":")[0] for where in classes_named("Finding")]

    assert named == ["gpufacts/finding.py"], named


def test_the_class_name_rule_finds_a_class_inside_a_function(tmp_path, monkeypatch):
    (tmp_path / "deep.py").write_text("def f():\n    class Verdict:\n        pass\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)

    assert classes_named("Verdict") == ["deep.py:2"]


def writes_an_exit_status(source: str) -> list[str]:
    """Where ``source`` words a finished call's exit status itself: an f-string with ``exit ``
    right before a value (``f"nvidia-smi exit {done.returncode}"``), or a use of
    ``NVSMI_EXIT`` (nvidia-smi's status -> its meaning, which ``words.ended`` words)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            for part, after in zip(node.values, node.values[1:]):
                if isinstance(part, ast.Constant) and str(part.value).endswith("exit ") and \
                        isinstance(after, ast.FormattedValue):
                    found.append(f"line {node.lineno}: f-string 'exit {{...}}'")
        if getattr(node, "id", getattr(node, "attr", None)) == "NVSMI_EXIT":
            found.append(f"line {node.lineno}: NVSMI_EXIT")
    return found


def test_one_wording_of_a_failed_call():
    """Issue 44 item 1: a failed call was worded five ways (``words.failed_call``, cc/classify.py's
    ``said``, the attestation gate's and the watcher's ``-srs 0``, the watcher's ``fabric state not
    read (nvidia-smi exit N)``). nvidia-smi's are worded by gpufacts/words.py alone
    (``failed_call``, ``ended``); how any other program ended by errors.py's ``exit_text``."""
    homes = {PACKAGE / "errors.py", PACKAGE / "gpufacts" / "words.py"}
    found = {str(path.relative_to(PACKAGE)): writes_an_exit_status(path.read_text())
             for path in PACKAGE.rglob("*.py") if path not in homes}

    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_wording_rule_finds_a_hand_made_exit_status():
    hand = ('def said(done):\n    return f"fabric state not read (nvidia-smi exit {done.returncode})"\n'
            'def more(done):\n    return words.NVSMI_EXIT.get(done.returncode)\n')

    assert len(writes_an_exit_status(hand)) == 2


def cuts_a_timeout_to_harmless(source: str) -> list[str]:
    """Where ``source`` applies the harmless-call cap by hand: a ``min(...)`` naming
    ``HARMLESS_CALL_S``."""
    return [f"line {node.lineno}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "min" and
            any(getattr(name, "id", None) == "HARMLESS_CALL_S" for arg in node.args
                for name in ast.walk(arg))]


def test_one_rule_for_a_harmless_calls_timeout():
    """Issue 44 item 1: the nvidia-smi timeout of a call the agent survives was chosen by hand
    in three places (the boot context, check's health rows, the watcher's polls); one function,
    steps/context.py ``harmless_timeout``, holds the rule."""
    home = PACKAGE / "steps" / "context.py"
    found = {str(path.relative_to(PACKAGE)): cuts_a_timeout_to_harmless(path.read_text())
             for path in PACKAGE.rglob("*.py") if path != home}

    assert {name: lines for name, lines in found.items() if lines} == {}
    assert cuts_a_timeout_to_harmless(home.read_text()), "the rule moved: update this test"


def status_writers() -> list[str]:
    """The functions of the package that name ``STATUS_PATH`` and write a file (an atomic write,
    a JSON write, a file opened for writing, a rename): status.json's writers."""
    writes = {"atomic_write", "write_json", "write_text", "write_bytes", "replace", "rename"}
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            calls = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                     for c in ast.walk(node) if isinstance(c, ast.Call)
                     and isinstance(c.func, (ast.Name, ast.Attribute))}
            opened = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                         and c.func.id == "open" and any(isinstance(a, ast.Constant) and
                                                         "w" in str(a.value) for a in c.args[1:])
                         for c in ast.walk(node))
            if "STATUS_PATH" in names and (calls & writes or opened):
                found.append(f"{name}.{node.name}")
    return found


def test_status_json_has_one_writer():
    """Issue 44 item 2: one writer of status.json (status.py ``write_status``); boot's
    StatusFile and the watcher's finding (podvm_gpu/ending.py) both write through it."""
    assert status_writers() == ["podvm_gpu.status.write_status"]


MAX_FUNCTION_LINES = 60
# The functions still over MAX_FUNCTION_LINES (issue 44 item 5 took them from 18 to these 6).
# The list only shrinks: a function split under the cap may leave it, a new long one is split.
LONG_FUNCTIONS = {
    "podvm_gpu.steps.cc.bind.bind",
    "podvm_gpu.steps.cc.step.run",
    "podvm_gpu.steps.fabric.step.wait_for_fabric",
    "podvm_gpu.steps.modules.step.run",
    "podvm_gpu.steps.persistenced.wait_for",
}


def long_functions(source: str, module: str) -> dict[str, int]:
    """The functions and methods of ``source`` (nested ones too) over MAX_FUNCTION_LINES, as
    ``module.Class.name`` to their length in lines (``def`` to the last line, as ast gives)."""
    found = {}

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found[name] = length
                walk(child, name)
            else:
                walk(child, prefix)

    walk(ast.parse(source), module)
    return found


def test_no_function_of_the_package_is_over_60_lines_but_the_listed_ones():
    found = {}
    for name, path in modules().items():
        found.update(long_functions(path.read_text(), name))
    new = {name: length for name, length in found.items() if name not in LONG_FUNCTIONS}

    assert new == {}, f"functions over {MAX_FUNCTION_LINES} lines: split them into their phases"
    assert len(LONG_FUNCTIONS) <= 6  # the count only falls


def test_the_function_length_rule_finds_a_long_method():
    body = "".join(f"        x = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = f"class A:\n    def f(self):\n{body}\n    def g(self):\n        pass\n"

    assert long_functions(source, "m") == {"m.A.f": MAX_FUNCTION_LINES + 1}


GPUFACTS = PACKAGE / "gpufacts"
PARSERS_OF = {"podvm_gpu.gpufacts.smi": lambda name: name.startswith("parse_"),
              "podvm_gpu.gpufacts.words": lambda name: name in ("csv_rows", "na")}


def smi_argvs() -> set[str]:
    """The names of gpufacts/smi.py's command lines (its functions ending in ``_argv``)."""
    tree = ast.parse((GPUFACTS / "smi.py").read_text())
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_argv")}


def _gpufacts_names(tree) -> tuple[dict[str, str], dict[str, str]]:
    """``(module aliases, imported names)``: local name -> the gpufacts module it is (``from
    podvm_gpu.gpufacts import smi as s``), and local name -> ``module.name`` of each name
    imported from a gpufacts module (``from podvm_gpu.gpufacts.smi import parse_x as p``)."""
    modules_as, names_as = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "podvm_gpu.gpufacts":
            for alias in node.names:
                modules_as[alias.asname or alias.name] = f"podvm_gpu.gpufacts.{alias.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("podvm_gpu.gpufacts."):
            for alias in node.names:
                names_as[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("podvm_gpu.gpufacts.") and alias.asname:
                    modules_as[alias.asname] = alias.name
    return modules_as, names_as


def _gpufacts_name(node, modules_as: dict[str, str], names_as: dict[str, str]) -> str | None:
    """``module.name`` of gpufacts that ``node`` (a name or ``alias.attr``) stands for, or None."""
    if isinstance(node, ast.Name):
        return names_as.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id in modules_as:
        return f"{modules_as[node.value.id]}.{node.attr}"
    if isinstance(node, ast.Attribute) and ast.unparse(node.value).startswith("podvm_gpu.gpufacts."):
        return f"{ast.unparse(node.value)}.{node.attr}"
    return None


def parser_uses(source: str) -> list[str]:
    """Where ``source`` takes one of gpufacts' text parsers (smi.py's ``parse_*``, words.py's
    ``csv_rows`` and ``na``): imported by name, or read as ``smi.parse_x``/``words.na``."""
    tree = ast.parse(source)
    modules_as, names_as = _gpufacts_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in PARSERS_OF:
            found += [f"line {node.lineno}: imports {alias.name}" for alias in node.names
                      if PARSERS_OF[node.module](alias.name)]
        if isinstance(node, ast.Attribute):
            name = _gpufacts_name(node, modules_as, names_as)
            module, _, attr = (name or "").rpartition(".")
            if module in PARSERS_OF and PARSERS_OF[module](attr):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


_NOT_RUNNING = {"join", "append", "extend", "failed_call"}  # a plan, a hint text, a failure's words


def argv_runs(source: str, argvs: set[str]) -> list[str]:
    """Where ``source`` hands a command line of gpufacts/smi.py (``argvs``: its names) to a call
    that may run it: the argv built (``smi.x_argv(...)``, or a name imported from smi.py) as
    an argument of any call but a plan's or a text's (``append``, ``" ".join``,
    ``words.failed_call``), directly or through a local name. Listing argvs for
    ``boot --dry-run`` or writing them into a hint runs nothing."""
    tree = ast.parse(source)
    modules_as, names_as = _gpufacts_names(tree)

    def is_argv(node) -> bool:
        if not isinstance(node, ast.Call):
            return False
        name = _gpufacts_name(node.func, modules_as, names_as) or ""
        module, _, attr = name.rpartition(".")
        return module == "podvm_gpu.gpufacts.smi" and attr in argvs

    held = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and is_argv(node.value)
            for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else \
            node.func.id if isinstance(node.func, ast.Name) else ""
        if callee in _NOT_RUNNING:
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if is_argv(arg) or (isinstance(arg, ast.Name) and arg.id in held):
                found.append(f"line {node.lineno}: {callee}({ast.unparse(arg)}, ...)")
    return found


def outside_gpufacts() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if GPUFACTS not in p.parents)


def test_no_module_outside_gpufacts_takes_a_parser_of_gpufacts():
    """Issue 44 ("Done when"): facts leave gpufacts parsed and typed. No module outside
    podvm_gpu/gpufacts/ imports smi.py's ``parse_*`` or words.py's ``csv_rows`` and ``na``: a
    step, a check row or the watcher asks a reader of gpufacts (gpufacts/ask.py,
    gpufacts/health.py) for the values instead."""
    found = {str(p.relative_to(PACKAGE)): parser_uses(p.read_text()) for p in outside_gpufacts()}

    assert {name: uses for name, uses in found.items() if uses} == {}


def test_no_module_outside_gpufacts_runs_a_command_line_of_gpufacts():
    """Issue 44 ("Done when"): the nvidia-smi queries are run where they are parsed. No module
    outside podvm_gpu/gpufacts/ hands an argv of gpufacts/smi.py to a runner (or to a helper
    that runs it); a dry-run plan or a "run ... by hand" hint may still name one."""
    argvs = smi_argvs()
    found = {str(p.relative_to(PACKAGE)): argv_runs(p.read_text(), argvs) for p in outside_gpufacts()}

    assert len(argvs) >= 10, "smi.py's command lines moved: update this rule"
    assert {name: runs for name, runs in found.items() if runs} == {}


def test_the_gpufacts_rules_find_a_parser_and_a_run():
    """Each rule finds what it forbids, in each form it has taken in the package."""
    argvs = smi_argvs()
    runs = ("from podvm_gpu.gpufacts import smi\n"
            "from podvm_gpu.gpufacts.smi import fabric_argv\n"
            "def a(runner):\n    return runner.run(smi.fabric_argv(), check=False)\n"
            "def b(ctx):\n    argv = fabric_argv()\n    return ctx.runner.run(argv, timeout=5)\n"
            "def c(ctx):\n    return query(ctx, smi.remap_argv(), 3)\n"
            "def d(facts):\n    return answers(lambda q: facts.runner.run(smi.conf_compute_argv(q)))\n"
            "def plan():\n    return [smi.ecc_argv(), fabric_argv()]\n"
            "def hint():\n    return ' '.join(smi.action_argv())\n")
    parsers = ("from podvm_gpu.gpufacts import smi, words\n"
               "from podvm_gpu.gpufacts.smi import parse_cliques as parse, summarize\n"
               "from podvm_gpu.gpufacts.words import csv_rows, bus_id\n"
               "x = smi.parse_fabric_rows('') or words.na('') or words.bus_id('')\n")

    assert [line.split(":")[0] for line in argv_runs(runs, argvs)] == \
        ["line 4", "line 7", "line 9", "line 11"]
    assert len(parser_uses(parsers)) == 4


# --- one nvidia-ctk back end (issue 44 item 4) -----------------------------------------------

NVIDIA_CTK = PACKAGE / "nvidia_ctk.py"
TOOLKIT_BINARIES = ("nvidia-ctk", "nvidia-cdi-hook")
# Words only the toolkit's command lines hold (its subcommands), and the start of its flags.
TOOLKIT_WORDS = ("generate", "create-device-nodes")
TOOLKIT_FLAGS = ("--mode=", "--disable-hook", "--driver-root=", "--dev-root=", "--class=")


def toolkit_argvs(source: str) -> list[str]:
    """Where ``source`` writes a command line of the toolkit: a list display whose first item is
    the string ``nvidia-ctk`` or ``nvidia-cdi-hook``; a list or tuple display holding one of
    :data:`TOOLKIT_WORDS`; a string (an f-string's leading text too) starting with one of
    :data:`TOOLKIT_FLAGS`; or a list display whose first item is a name, attribute or call (a
    binary at a path: the hook binaries' and check --image's asks) holding ``--help`` or
    ``--version``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [item.value for item in node.elts
                     if isinstance(item, ast.Constant) and isinstance(item.value, str)]
            first = node.elts[0] if node.elts else None
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if isinstance(node, ast.List) and literal and first.value in TOOLKIT_BINARIES:
                found.append(f"line {node.lineno}: [{first.value!r}, ...]")
            elif set(words) & set(TOOLKIT_WORDS):
                found.append(f"line {node.lineno}: {sorted(set(words) & set(TOOLKIT_WORDS))}")
            elif isinstance(node, ast.List) and isinstance(first, (ast.Name, ast.Attribute, ast.Call)) \
                    and {"--help", "--version"} & set(words):
                found.append(f"line {node.lineno}: [<a path>, ..., --help/--version]")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith(TOOLKIT_FLAGS):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_no_module_but_the_back_end_writes_a_toolkit_command_line():
    """Issue 44 item 4: every command line of nvidia-ctk and nvidia-cdi-hook is
    podvm_gpu/nvidia_ctk.py's (they were in steps/cdi/toolkit.py, step.py, imex.py,
    toolkit_image.py, steps/nodes.py and host/proc.py); the steps and check --image take them
    from it."""
    found = {str(path.relative_to(PACKAGE)): toolkit_argvs(path.read_text())
             for path in PACKAGE.rglob("*.py") if path != NVIDIA_CTK}

    assert {name: lines for name, lines in found.items() if lines} == {}
    assert len(toolkit_argvs(NVIDIA_CTK.read_text())) >= 6, "the back end moved: update this rule"


def test_the_toolkit_rule_finds_each_kind_of_command_line():
    hand = ('VERSION = ["nvidia-ctk", "--version"]\n'
            'def gen(root):\n    return ["nvidia-ctk", "cdi", "generate", f"--dev-root={root}"]\n'
            'def ask(binary, name):\n    return [binary, name, "--help"]\n'
            'def later(argv):\n    return (*argv, "create-device-nodes")\n'
            'TOOLS = ("nvidia-ctk", "nvidia-smi")\n'
            'FABRIC = ["nv-fabricmanager", "--version"]\n')

    assert len(toolkit_argvs(hand)) == 5  # the two tuples of names and nv-fabricmanager's are no argv


def hook_names_named(source: str, names) -> list[str]:
    """Where ``source`` holds one of ``names`` (the toolkit's hooks) as a whole string literal."""
    return [f"line {node.lineno}: {node.value!r}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_one_list_of_hook_names():
    """Issue 44 item 4: the hook names are one list, podvm_gpu/nvidia_ctk.py's ``HOOK_SINCE``
    (config/fields.py had a second one, ``CDI_HOOK_NAMES``); config's ``cdi.disable_hooks`` takes
    ``all`` and these names from it. A name inside a sentence (a hint) is no list."""
    from podvm_gpu import nvidia_ctk

    names = set(nvidia_ctk.HOOK_SINCE)
    found = {str(path.relative_to(PACKAGE)): hook_names_named(path.read_text(), names)
             for path in PACKAGE.rglob("*.py") if path != NVIDIA_CTK}

    assert len(names) >= 6, "the hook table moved: update this rule"
    assert {name: lines for name, lines in found.items() if lines} == {}
    assert nvidia_ctk.DISABLE_HOOK_NAMES == ("all", *sorted(names))


def test_the_hook_name_rule_finds_a_second_list():
    second = ('HOOKS = ("all", "update-ldcache", "chmod")\n'
              'HINT = "set cdi.disable_hooks: [update-ldcache] instead"\n')

    assert len(hook_names_named(second, {"update-ldcache", "chmod"})) == 2


# The threads that are not a boot's: the watcher's poll loop, the exporter's HTTP server and
# NVML's worker, which a hung NVML call leaves behind (its reading is abandoned, never joined).
OWN_THREADS = {"watch/command.py", "metrics/command.py", "gpufacts/nvml.py"}


def thread_starts(root: Path) -> list[str]:
    """Where a module under ``root`` makes a ``threading.Thread`` itself."""
    return sorted(f"{path.relative_to(root)}:{node.lineno}"
                  for path in root.rglob("*.py")
                  for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Call) and (getattr(node.func, "attr", None) == "Thread"
                                                     or getattr(node.func, "id", None) == "Thread"))


def test_the_boot_starts_its_threads_through_one_primitive():
    """Issue 44 item 5: the boot's thread-start sites (the parallel steps, the imports while
    waiting, the early toolkit calls, the health gate beside the generation, the hook checks,
    the side-by-side queries, the VPD read, the reap of a killed call) share host/proc.py's
    ``Background``: what a call returned or raised is kept for the thread that asks."""
    found = [where for where in thread_starts(PACKAGE)
             if where.split(":")[0] not in OWN_THREADS | {"host/proc.py"}]
    in_proc = [where for where in thread_starts(PACKAGE) if where.startswith("host/proc.py")]

    assert found == [] and len(in_proc) == 1, (found, in_proc)


def test_the_thread_rule_finds_a_thread_made_by_hand(tmp_path):
    (tmp_path / "x.py").write_text("import threading as t\nfrom threading import Thread\n"
                                   "t.Thread(target=f).start()\nThread(target=f)\n")

    assert thread_starts(tmp_path) == ["x.py:3", "x.py:4"]
