"""A second boot on a VM where boot already succeeded changes nothing that runs and ends ready
(contract section 3; issue 3: the 1 x H100, 2 x A100 and 8 x H200 + NVSwitch scenarios).

P04 (2 x A100) carries its own ``expect.rerun``; this adds the same for P02 and P03: no module
is loaded again, no daemon is started again, the device nodes are not made again, and the spec
is still a ready spec.
"""

from __future__ import annotations

import pytest
from scenarios.expect import judge_boot, report
from scenarios.world import DATA, SHARED, World, load_case

NOTHING_STARTED_AGAIN = ["modprobe", "nvidia-persistenced", "nvidia-modprobe",
                         ["nvidia-ctk", "system", "create-device-nodes"],
                         ["nv-fabricmanager"]]


@pytest.mark.parametrize("name", ["P02-one-h100-pcie-ready.yaml",
                                  "P03-hgx-h200-8gpu-4nvswitch-ready.yaml"])
def test_a_second_boot_starts_nothing_again_and_ends_ready(name):
    path = next(p for p in (SHARED / "cases" / name, DATA / "cases" / name) if p.exists())
    case = load_case(path)
    expect = {**case.expect["boot"], "not_called": NOTHING_STARTED_AGAIN}
    with World(case) as world:
        first = world.run("boot")
        problems = judge_boot(world, first, case.expect["boot"])
        if problems:
            pytest.fail(report(world, first, problems), pytrace=False)
        daemons = list(first.daemons)
        again = world.run("rerun")
        problems = judge_boot(world, again, expect)
        if again.daemons != daemons:
            problems.append(f"daemons started again: {again.daemons} after {daemons}")
        if problems:
            pytest.fail(report(world, again, problems), pytrace=False)
