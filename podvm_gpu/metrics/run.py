"""``podvm-gpu metrics``: the command, from its options to :mod:`podvm_gpu.metrics.command`."""

from __future__ import annotations

import sys


def run_metrics(root_dir: str, config: str | None, listen: str | None = None,
                serve: bool = False, openmetrics: bool = False, textfile: bool = False,
                web_config: str | None = None) -> int:
    """``podvm-gpu metrics``: the ``metrics:`` settings of the config, then print, serve or
    write the textfile (podvm_gpu.metrics). Exit 0, 1 when it cannot, 2 for a bad config.

    The config is trusted as boot trusts it: a file another user than root could write is
    refused (the exporter runs as root, writes the textfile it names and reads the web config it
    names), the same verdict as boot's, ``config``'s and ``check``'s."""
    from podvm_gpu.config.load import config_location
    from podvm_gpu.errors import ConfigError
    from podvm_gpu.host.fs import Root
    from podvm_gpu.metrics.command import run

    root = Root(root_dir)
    try:
        path, required = config_location(root, config)
        if required:
            from podvm_gpu.config.load import load_config

            settings = load_config(path, required=True, trusted=True).metrics
    except (ConfigError, OSError) as err:
        print(f"podvm-gpu: error: {err}", file=sys.stderr)
        return 2
    if not required:
        from podvm_gpu.metrics.settings import MetricsSettings

        settings = MetricsSettings()
    return run(root, settings, listen=listen, serving=serve or listen is not None,
               openmetrics=openmetrics, textfile=textfile, web_config=web_config)
