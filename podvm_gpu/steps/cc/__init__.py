"""The confidential-computing step's room: step.py (the step: classify, enforce, the ready state,
the attestation hook), classify.py (the one CC classification and decision, shared by boot,
check and the metrics), query.py (what the step asks: nvidia-smi, the guest's TEE, the fabric
step's end), rows.py (check's rows)."""
