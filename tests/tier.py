"""The fast tier's hypothesis sizes (docs/testing.md).

``PODVM_GPU_FAST_TIER=1``, which the fast tier's documented command sets, runs each property
with fewer generated examples; the same properties, strategies and explicit ``@example`` cases
run either way. The whole suite (``pytest`` without the variable, as ``.ci/run`` runs it) keeps
the full counts. Hypothesis draws new inputs on every run, so the edit-test loop still explores.
"""

from __future__ import annotations

import os

FAST_TIER = os.environ.get("PODVM_GPU_FAST_TIER") == "1"


def examples(full: int, fast: int) -> int:
    """``max_examples`` of a property: ``full`` in the whole suite, ``fast`` in the fast tier.

    Args:
        full: the count the whole suite runs (the property's strength in CI).
        fast: the count of the fast tier (at most ``full``).
    """
    assert 0 < fast <= full, (fast, full)
    return fast if FAST_TIER else full
