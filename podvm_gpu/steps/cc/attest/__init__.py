"""GPU attestation with NVIDIA's local verifier (``nvattest``) before the CC ready state is set.

Rooms: :mod:`~podvm_gpu.steps.cc.attest.verdict` (the agent's own verdict over nvattest's JSON,
pure), :mod:`~podvm_gpu.steps.cc.attest.run` (one bounded run, in a transient unit with network
under systemd), :mod:`~podvm_gpu.steps.cc.attest.gate` (the policy, the record, called by the
``confidential-computing`` step). The facts about nvattest: ../shared/nvattest.md. Imported
only on the GPU path, from the confidential-computing step.
"""
