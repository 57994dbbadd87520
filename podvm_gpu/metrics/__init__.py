"""The metrics exporter: the boot's and the GPUs' state in the Prometheus format (issue 11).

``podvm-gpu metrics`` prints them once, ``--listen``/``--serve`` serves them over HTTP,
``--textfile`` writes them for node-exporter's textfile collector. GPU readings come from NVML
through nvidia-ml-py, bounded in time, under dcgm-exporter's names; the agent's own metrics are
``podvm_gpu_*``; in confidential-computing mode only state and health are read (``cc-safe``).
docs/metrics.md lists every metric.

The package imports nothing itself; its settings are the config's (podvm_gpu/config/metrics.py:
every boot whose config has a ``metrics:`` section reads them), and the command is
:func:`podvm_gpu.metrics.command.run_metrics` (prometheus-client and pynvml are imported by
what needs them).
"""
