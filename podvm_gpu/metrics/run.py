"""``podvm-gpu metrics``: the command, from its options to :mod:`podvm_gpu.metrics.command`."""

from __future__ import annotations

import sys


def run_metrics(root_dir: str, config: str | None, listen: str | None = None,
                serve: bool = False, openmetrics: bool = False, textfile: bool = False,
                web_config: str | None = None, pod_labels: bool = False) -> int:
    """``podvm-gpu metrics``: the ``metrics:`` settings of the config, then print, serve or
    write the textfile (podvm_gpu.metrics). Exit 0, 1 when it cannot, 2 for a bad config.
    ``--pod-labels``: only the pod labels file (podvm_gpu/metrics/pod.py), exit 0 (with one
    warning when apf.json gives none) or 1 when the labels file cannot be written."""
    from podvm_gpu.config.load import config_location
    from podvm_gpu.errors import ConfigError
    from podvm_gpu.host.fs import Root
    from podvm_gpu.metrics.command import run

    root = Root(root_dir)
    if pod_labels:
        from podvm_gpu.metrics.pod import LABELS_PATH, write_labels

        try:
            labels, warning = write_labels(root)
        except OSError as err:
            print(f"podvm-gpu metrics: cannot write {LABELS_PATH}: {err.strerror or err}",
                  file=sys.stderr)
            return 1
        if warning:
            print(f"podvm-gpu metrics: warning: {warning}", file=sys.stderr)
        else:
            print(f"podvm-gpu metrics: pod labels written to {LABELS_PATH}", file=sys.stderr)
        return 0
    try:
        path, required = config_location(root, config)
        if required:
            from podvm_gpu.config.load import load_config

            settings = load_config(path, required=True).metrics
    except (ConfigError, OSError) as err:
        print(f"podvm-gpu: error: {err}", file=sys.stderr)
        return 2
    if not required:
        from podvm_gpu.metrics.settings import MetricsSettings

        settings = MetricsSettings()
    return run(root, settings, listen=listen, serving=serve or listen is not None,
               openmetrics=openmetrics, textfile=textfile, web_config=web_config)
