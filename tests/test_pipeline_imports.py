"""The pipeline's imports before the first GPU step (issue 38): the parallel steps' modules are
imported on a thread of their own while the sequential steps wait on their tools, which is safe
only while the package has no import cycle (two threads importing a cycle can deadlock)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "podvm_gpu"


def module_graph() -> dict[str, set[str]]:
    """Module -> the package modules its body imports (a submodule's import runs its parents')."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in names.items():
        found = set()
        for node in ast.parse(path.read_text()).body:  # the module's body, not its functions
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
        parents = {".".join(dep.split(".")[:i]) for dep in found
                   for i in range(1, dep.count(".") + 2)}
        graph[name] = {dep for dep in parents if dep in names and dep != name}
    return graph


def test_the_package_has_no_import_cycle():
    graph, done, path = module_graph(), set(), []

    def visit(name: str) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    assert len(done) > 50


LATER = ("versions", "persistenced", *__import__("podvm_gpu.steps").steps.PARALLEL)

PROBE = """
import sys, podvm_gpu.boot.pipeline as p, podvm_gpu.steps as s
later = {later!r}
def loaded():
    return sorted(n for n in later if f"podvm_gpu.steps.{{dict(s.STEPS)[n]}}" in sys.modules)
print(loaded(), all(n not in sys.modules for n in p._IMPORTED_WHEN_RUN))
p.start_while_waiting().outcome()
print(loaded(), all(n in sys.modules for n in p._IMPORTED_WHEN_RUN))
"""


def test_the_later_steps_are_imported_while_the_first_tool_runs():
    # importing the pipeline loads only what the first GPU steps need (drivers, modules); the
    # rest is imported on a thread of its own (issue 38)
    out = subprocess.run([sys.executable, "-c", PROBE.format(later=LATER)], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["[] True", f"{sorted(LATER)} True"]
