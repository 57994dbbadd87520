"""The metrics exporter: the boot's and the GPUs' state in the Prometheus format (issue 11).

``podvm-gpu metrics`` prints them once, ``--listen``/``--serve`` serves them over HTTP,
``--textfile`` writes them for node-exporter's textfile collector. GPU readings come from NVML
through nvidia-ml-py, bounded in time, under dcgm-exporter's names; the agent's own metrics are
``podvm_gpu_*``; in confidential-computing mode only state and health are read (``cc-safe``).
README.md, section "Metrics", lists every metric.

Importing this package is cheap (standard library only): prometheus-client, pynvml and the
exporter are imported by the entry points that need them.
"""

from podvm_gpu.metrics.command import (print_once, run, serve, write_boot_textfile,
                                       write_textfile)
from podvm_gpu.metrics.settings import (DEFAULT_LISTEN, DEFAULT_TEXTFILE_PATH, PROFILES,
                                        MetricsConfigError, MetricsSettings)

__all__ = ["DEFAULT_LISTEN", "DEFAULT_TEXTFILE_PATH", "PROFILES", "MetricsConfigError",
           "MetricsSettings", "print_once", "run", "serve", "write_boot_textfile",
           "write_textfile"]
