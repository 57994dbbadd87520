"""The field cases, one test each, run through the real ``podvm-gpu`` (tests/scenarios).

For every case: build its world, run ``podvm-gpu boot`` (then ``boot`` again for ``expect.rerun``,
then ``check`` for ``expect.check``) under umockdev with the case's fake tools, and assert the
case's ``expect`` blocks. A call no rule answers fails a shared case (each has a rule for every
query a contract-following product makes) and is a warning in the project's own scenarios.
One case: ``python -m pytest tests/test_scenarios.py -k C05``.
"""

import warnings

import pytest
from scenarios.expect import describe_call, judge_boot, judge_check, report
from scenarios.world import CaseError, UnmatchedCallWarning, World, case_files, case_id, load_case

CASES = case_files()


@pytest.mark.parametrize("case_file", CASES, ids=[case_id(path) for path in CASES])
def test_scenario(case_file):
    try:
        case = load_case(case_file)
    except CaseError as err:
        pytest.fail(str(err), pytrace=False)
    with World(case) as world:
        for phase in case.phases:
            run = world.run(phase)
            unmatched = [f"{' '.join(call.argv)} -> {describe_call(call)}"
                         for call in run.calls if call.answer == "unmatched"]
            if unmatched and not case.shared:
                warnings.warn(UnmatchedCallWarning(f"{case.id} {phase}: no rule for {unmatched}"),
                              stacklevel=2)
            judge = judge_check if phase == "check" else judge_boot
            problems = judge(world, run, case.expect.get(phase, {}))
            if unmatched and case.shared:
                problems.append(f"calls no rule of this shared case answers: {unmatched}")
            if problems:
                pytest.fail(report(world, run, problems), pytrace=False)
