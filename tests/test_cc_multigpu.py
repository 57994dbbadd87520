"""Several confidential GPUs only in a multi-GPU mode NVIDIA supports (issue 45;
podvm_gpu/steps/cc/multigpu.py)."""

from __future__ import annotations

import pytest

from podvm_gpu.gpufacts import judge
from podvm_gpu.steps.cc.multigpu import judge_set

TDX = "Intel TDX (/proc/cpuinfo flag tdx_guest)"


@pytest.mark.parametrize("mode, ids, guest, allow, fails, warns", [
    (judge.MGM_NONE, ["2331", "2331"], TDX, False, "2 confidential GPUs (Hopper) with Multi-GPU "
     "Mode: None", None),
    (judge.MGM_NONE, ["2331", "2331"], TDX, True, None, "accepted by confidential_computing."
     "allow_unsupported_multi_gpu"),
    (judge.MGM_PPCIE, ["2335"] * 8, TDX, False, None, None),
    (judge.MGM_NONE, ["2901"] * 8, TDX, False, None, None),  # B200 multi-GPU passthrough
    (judge.MGM_NONE, ["2bb5", "2bb5"], TDX, False, "(Blackwell) with Multi-GPU Mode: None", None),
    (judge.MGM_PPCIE, ["2335", "ffff"], TDX, False, "unknown architecture (10de:ffff)", None),
    (judge.MGM_NOT_OFFERED, ["2331", "2331"], TDX, False, "not offered by this nvidia-smi", None),
    (None, ["2331", "2331"], TDX, False, "Multi-GPU Mode: unreadable", None),
    (judge.MGM_NONE, ["2331"], TDX, False, None, None),
    (judge.MGM_NONE, ["2331", "2331"], None, False, None, None),  # a regular VM: no rule
    ("nvlink encryption", ["2901"], TDX, True, "'nvlink encryption' (nvidia-smi conf-compute -mgm) "
     "is not understood", None),
])
def test_the_multi_gpu_rule(mode, ids, guest, allow, fails, warns):
    failure, warning = judge_set(mode, ids, guest, allow)
    assert (failure is None) == (fails is None) and (warning is None) == (warns is None)
    if fails:
        assert fails in failure and "NVIDIA supports one GPU per confidential VM" in failure
    if warns:
        assert warns in warning
