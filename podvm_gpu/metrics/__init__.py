"""The metrics exporter: the boot's and the GPUs' state in the Prometheus format (issue 11).

``podvm-gpu metrics`` prints them once, ``--listen``/``--serve`` serves them over HTTP,
``--textfile`` writes them for node-exporter's textfile collector. GPU readings come from NVML
through nvidia-ml-py, bounded in time, under dcgm-exporter's names; the agent's own metrics are
``podvm_gpu_*``; in confidential-computing mode only state and health are read (``cc-safe``).
docs/metrics.md lists every metric.

The package imports nothing itself: its settings are read by every boot whose config has a
``metrics:`` section (config.py), so the entry points live in ``command`` and are imported from
there (prometheus-client and pynvml by what needs them).
"""
