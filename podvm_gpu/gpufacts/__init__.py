"""What the agent knows of the GPUs, in one home (issue 33): the words every reader of
nvidia-smi or NVML shares (words.py: the one N/A rule, the one bus-id normaliser, the one failure
table, the one wording of a failed call, the one verdict scale), every nvidia-smi command line
the agent runs with its parsers (smi.py), the decisions made on what was read (judge.py), and
the NVML back end the exporter reads (nvml.py, reading.py), and how long the GPUs' attach
may take by architecture, with its marks in the kernel log (attach.py, issue 46).

A docstring only: importing one of its modules runs no other (the CPU fast path imports none).
"""
