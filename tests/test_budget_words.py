"""A tool call whose timeout the boot budget cut short ends the boot with docs/interface.md
3.3's words, ``<step>: timed out: the boot budget of N s is spent`` (issue 29 item 11: it said
``modules: modprobe nvidia timed out after 1.85269 s``, as if the tool's own timeout had passed).
"""

from __future__ import annotations

import dataclasses

import pytest
from scenarios.expect import judge_boot, report
from scenarios.world import World
from test_hung_tools import p03_case

BUDGET_S = 4


@pytest.mark.parametrize("prefix, step", [(("modprobe", "nvidia"), "modules")])
def test_a_tool_timeout_cut_by_the_budget_says_the_budget_is_spent(prefix, step):
    case = p03_case()
    tools = [dict(rule, delay_s=3600) if tuple(rule["argv"]) == prefix else rule
             for rule in case.tools]
    config = f"budget_s: {BUDGET_S}\ntimeouts: {{modprobe: 60}}\n"  # the budget ends it first
    case = dataclasses.replace(case, id="P03-budget-cut", tools=tools,
                               files={**case.files, "etc/podvm-gpu/config.yaml": config})
    expect = {"state": "failed", "exit": 1, "max_wall_s": BUDGET_S + 3, "cdi": "unavailable",
              "reason_contains": [f"{step}: timed out: the boot budget of {BUDGET_S} s is spent "
                                  f"({' '.join(prefix)} timed out after "]}
    with World(case) as world:
        run = world.run("boot")
        problems = judge_boot(world, run, expect)
        if problems:
            pytest.fail(report(world, run, problems), pytrace=False)
