"""The fault matrix (issue 10): every external command the boot runs on the 1-GPU (P02), the HGX
(P03), the CC-on (C21) and the MIG-without-instances (P02 variant) scenarios x {exit non-zero,
hang, killed by a signal, garbage output, empty output}, and every tool x {missing, not
executable}; what each cell must end in is in faults.py.

The cells run in worlds of their own. In one pytest process they run several at a time
(``PODVM_GPU_MATRIX_JOBS``, default the CPU count + 1: most of a cell is waiting on processes),
once per session for the cells selected; under pytest-xdist (the fast tier, docs/testing.md)
each cell runs in its own test, so the workers share them out. Either way each cell is its own
test, so ``-k P03`` or ``-k 'cdi generate:hang'`` picks a few.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from scenarios.world import World

from reliability.faults import SCENARIOS, Cell, cells, install_fault, judge_cell, run_cell, run_cells

CELLS = cells()


@pytest.fixture(scope="module")
def outcomes(request):
    """Every selected cell's outcome, the cells run ``jobs`` at a time (one pytest process)."""
    selected = [item.callspec.params["cell"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    return run_cells(selected, int(os.environ.get("PODVM_GPU_MATRIX_JOBS",
                                                  (os.cpu_count() or 1) + 1)))


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_cell(cell, request):
    # Under pytest-xdist the workers share the cells out; one of them running the whole matrix
    # while the others waited for it left cores idle (issue 27's fast tier).
    problems, report, _wall = run_cell(cell) if os.environ.get("PYTEST_XDIST_WORKER") \
        else request.getfixturevalue("outcomes")[cell.id]
    if problems:
        pytest.fail(report, pytrace=False)


def test_a_tool_that_prints_megabytes_leaves_a_status_file_the_status_command_reads():
    """nvidia-smi conf-compute -grs printing 3 MiB on one line (exit 0): the reason quoted all
    of it, and the step's message too, so status.json outgrew the 1 MiB its own reader takes
    and `podvm-gpu status` called it unreadable."""
    scenario = next(s for s in SCENARIOS if s.name == "C21")
    command = next(c for c in scenario.commands if c.argv[-1] == "-grs")
    cell = Cell(scenario, command.argv, "garbage", command)
    with World(scenario.case()) as world:
        install_fault(world, cell)
        Path(world.layout.dir, "garbage.out").write_bytes(b"Ready state: " + b"x" * (3 << 20))
        run = world.run("boot")
        problems = judge_cell(cell, world, run)
        status = subprocess.run([sys.executable, "-m", "podvm_gpu", "status", "--root",
                                 world.layout.root], capture_output=True, text=True, timeout=30)

    assert not problems, problems
    assert status.returncode == 1 and status.stdout.startswith(
        "failed: confidential-computing: cannot read the CC ready state"), status.stdout
    assert len(run.status["reason"]) <= 1000
    assert all(len(step["message"]) <= 1000 for step in run.status["steps"])
