"""The documents check's hints cite are shipped with the program and named where it is
installed (issue 35 item 10: hints said ``docs/operating.md``, which an installed program does
not have). pyproject.toml's ``data-files`` installs them under ``<prefix>/share/doc/podvm-gpu``
(the wheel's ``.data/data``; checked by hand: ``pip wheel`` puts both there)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from podvm_gpu import row

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "podvm_gpu"


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            found.add(id(node.body[0].value))
    return found


def _strings():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                yield path, node


def test_no_message_of_the_program_names_a_repository_doc_path():
    cited = [f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}" for path, node in _strings()
             if re.search(r"\bdocs/\w+\.md", node.value)]
    assert cited == [], cited


def test_every_doc_a_hint_cites_is_installed_with_the_package():
    cited = {node.args[0].value for path, tree in
             ((p, ast.parse(p.read_text())) for p in PACKAGE.rglob("*.py"))
             for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "doc_ref"
             and node.args and isinstance(node.args[0], ast.Constant)}
    assert cited, "the hints cite no document through doc_ref"
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {Path(f).name for f in data[row.DOC_DIR]}
    assert cited <= shipped, cited - shipped
    assert all((REPO / "docs" / name).is_file() for name in shipped)


def test_a_hint_names_the_installed_copy_else_the_source_tree_s(tmp_path, monkeypatch):
    installed = tmp_path / row.DOC_DIR / "operating.md"
    installed.parent.mkdir(parents=True)
    installed.write_text("# operating\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert row.doc_ref("operating.md", "Recovery action") == f'{installed}, "Recovery action"'
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere"))
    assert row.doc_ref("operating.md", "Recovery action") == \
        f'{REPO / "docs/operating.md"}, "Recovery action"'
    assert row.doc_ref("nothing.md", "X") == "podvm-gpu's nothing.md, \"X\""


def test_operating_md_lists_every_check_row_of_a_running_vm_in_its_order():
    """Issue 47 item 7: the list "stable for --json consumers" lacked fabric, binding and watch;
    it is held to the rows the code gives (podvm_gpu/check/vm.py ``rows()``)."""
    import re

    from podvm_gpu.check.vm import rows

    text = (REPO / "docs/operating.md").read_text()
    start = text.index("The names are stable for `--json` consumers")
    listed = re.findall(r"`([a-z][a-z-]*)`", text[start:text.index("(plus", start)])
    assert listed == list(rows())


def test_the_check_json_example_counts_are_a_cpu_vms(tmp_path, podvm, empty_path):
    """Issue 47 item 11: interface.md 5.2's example said ``"skip": 11``; it is held to what
    ``check --json`` gives on a CPU VM's root after its boot."""
    import json
    import re

    boot = podvm(["boot", "--root", str(tmp_path)], env={"PATH": empty_path})
    assert boot.returncode == 0, boot.stderr
    done = podvm(["check", "--root", str(tmp_path), "--json"], env={"PATH": empty_path})
    summary = json.loads(done.stdout)["summary"]
    text = (REPO / "docs/interface.md").read_text()
    section = text[text.index("### 5.2 `--json`"):text.index("## 6. check --image")]
    example = json.loads("{" + re.search(r'("summary": \{[^}]*\})', section).group(1) + "}")
    assert example["summary"] == summary
