"""The fault matrix (issue 10): every external command the boot runs on the 1-GPU (P02), the HGX
(P03), the CC-on (C21) and the MIG-without-instances (P02 variant) scenarios x {exit non-zero,
hang, killed by a signal, garbage output, empty output}, and every tool x {missing, not
executable}; what each cell must end in is in faults.py.

The cells run in worlds of their own, several at a time (``PODVM_GPU_MATRIX_JOBS``, default
the CPU count + 1: most of a cell is waiting on processes), once per session for the cells
selected; each cell is then its own test, so ``-k P03`` or ``-k 'cdi generate:hang'`` picks a few.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scenarios.world import World

from reliability.faults import SCENARIOS, Cell, cells, install_fault, judge_cell, run_cells

CELLS = cells()


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    selected = [item.callspec.params["cell"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    jobs = int(os.environ.get("PODVM_GPU_MATRIX_JOBS", (os.cpu_count() or 1) + 1))
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run_cells(selected, jobs)
    # Under pytest-xdist (the fast tier, docs/testing.md) the cells are spread over the workers,
    # and each would run the whole matrix for itself: the first runs it, the others wait on the
    # lock and read its outcomes (the workers share the base temporary folder's parent).
    shared = tmp_path_factory.getbasetemp().parent / "fault-matrix.json"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shared.exists():
            return {cid: tuple(found) for cid, found in json.loads(shared.read_text()).items()}
        found = run_cells(selected, jobs)
        shared.write_text(json.dumps(found))
        return found


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_cell(cell, outcomes):
    problems, report, _wall = outcomes[cell.id]
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
