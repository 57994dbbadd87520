"""prometheus-client's metric families and exposition, imported without the package's ``__init__``.

``import prometheus_client`` runs its ``__init__``, which imports every part of the library
(the instrumentation metrics with ``inspect``, the process, platform and GC collectors, the
default registry): about 15 ms that the exporter never uses, beside the ~37 ms of
``prometheus_client.exposition`` itself (it imports ``http.server`` at module level). For
``podvm-gpu metrics`` once that is more than a ``python -c pass``. So, unless the package is
imported already, the modules used here are imported under a bare stand-in for the package
(its spec and path, not its code), which is then removed again: a later ``import
prometheus_client`` anywhere in the process runs the real ``__init__``, which finds these
modules loaded and uses them (tests/test_metrics.py checks both).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

_PACKAGE = "prometheus_client"
_MODULES = ("prometheus_client.metrics_core", "prometheus_client.exposition",
            "prometheus_client.openmetrics.exposition")


def _import_without_package_init() -> None:
    spec = importlib.machinery.PathFinder.find_spec(_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        return  # not installed: the import below raises the usual ImportError
    stand_in = types.ModuleType(_PACKAGE)
    stand_in.__spec__ = spec
    stand_in.__path__ = list(spec.submodule_search_locations)
    stand_in.__package__ = _PACKAGE
    sys.modules[_PACKAGE] = stand_in
    try:
        for name in _MODULES:
            __import__(name)
    finally:
        del sys.modules[_PACKAGE]


if _PACKAGE not in sys.modules:
    _import_without_package_init()
else:
    for _name in _MODULES:
        __import__(_name)

_metrics_core = sys.modules["prometheus_client.metrics_core"]
_exposition = sys.modules["prometheus_client.exposition"]
_openmetrics = sys.modules["prometheus_client.openmetrics.exposition"]

GaugeMetricFamily = _metrics_core.GaugeMetricFamily
InfoMetricFamily = _metrics_core.InfoMetricFamily
Metric = _metrics_core.Metric
generate_latest = _exposition.generate_latest  # Prometheus text 0.0.4
choose_encoder = _exposition.choose_encoder  # by the Accept header, as prometheus-client serves
gzip_accepted = _exposition.gzip_accepted
generate_openmetrics = _openmetrics.generate_latest  # OpenMetrics 1.0.0
