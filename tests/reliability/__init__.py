"""Reliability and security proofs of ``podvm-gpu boot`` (issue 10): the fault matrix, the SIGKILL
loop, property-based inputs, symlink and permission attacks, concurrent boots.

Figures of the last run, how to re-run each part and what is not covered: docs/reliability.md.
Every part drives the real command through the scenario harness (tests/scenarios) or under
umockdev, and judges what must hold after it, not only that it did not crash.
"""
