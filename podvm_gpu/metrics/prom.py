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
_choose_encoder = _exposition.choose_encoder
generate_openmetrics = _openmetrics.generate_latest  # OpenMetrics 1.0.0


def acceptable(header: str) -> list[tuple[str, str]]:
    """The items of an ``Accept`` or ``Accept-Encoding`` value that are acceptable (RFC 9110
    section 12.4.2): ``[(lower-case name, the item as given), ...]``, without those of ``q=0``.

    prometheus-client reads only the names, so ``gzip;q=0`` ("not gzip") got gzip. A q-value
    that is not a number from 0 to 1 makes its item not acceptable: the server then sends the
    plain form, which every client reads.
    """
    items = []
    for item in (header or "").split(","):
        name, *params = item.split(";")
        name = name.strip().lower()
        if not name:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:
                    q = 0.0
        if q > 0.0:
            items.append((name, item))
    return items


def choose_encoder(accept: str):
    """``(encoder, content type)`` for an ``Accept`` header, as prometheus-client serves
    (OpenMetrics when asked for, else text 0.0.4), with the media types of ``q=0`` left out."""
    return _choose_encoder(",".join(item for _, item in acceptable(accept)))


def gzip_accepted(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header accepts gzip: ``gzip`` (or ``x-gzip``) with a q-value
    above 0, or ``*`` above 0 where gzip is not named. ``gzip;q=0`` and ``*;q=0`` refuse it;
    ``identity;q=0`` alone does not make gzip acceptable (the body is sent plain then: every
    client reads that, and a scraper that cannot is told nothing better by a 406)."""
    named = {name for name, _ in acceptable(accept_encoding)}
    listed = {item.split(";")[0].strip().lower() for item in (accept_encoding or "").split(",")}
    if named & {"gzip", "x-gzip"}:
        return True
    return "*" in named and not listed & {"gzip", "x-gzip"}
