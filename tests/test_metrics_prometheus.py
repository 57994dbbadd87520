"""Debian's real Prometheus (2.42) scrapes the exporter of a booted world with the fake NVML
library, over TLS with basic auth, on loopback (issue 19). Its HTTP API then answers for ``up``,
the boot families and the ``DCGM_FI_*`` queries of dcgm-exporter's Grafana dashboard
(``grafana/dcgm-exporter-dashboard.json`` of NVIDIA/dcgm-exporter: its panels query
``DCGM_FI_DEV_GPU_TEMP``, ``avg(...)`` of it, ``DCGM_FI_DEV_POWER_USAGE``, ``sum(...)`` of it,
``DCGM_FI_DEV_SM_CLOCK * 1000000``, ``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED`` and
``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``, each as ``{instance=~"$instance", gpu=~"$gpu"}``, and its
variables are ``label_values(DCGM_FI_DEV_GPU_TEMP, instance)`` and ``(..., gpu)``). A second
job without credentials is refused (401) and Prometheus says so.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from fake_nvml import describe, gpu, make_root, metrics_env
from metrics_serving import make_cert, start

INSTANCE = "127.0.0.1:{port}"
# The dashboard's queries with its variables set to one instance and every GPU.
DASHBOARD = {
    'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}': 8,
    'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})': 1,
    'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}': 8,
    'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})': 1,
    'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000': 8,
    'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}': 8,
    'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}': 8,
    # a DCGM profiling field: NVML has no such reading, so the panel stays empty (docs/interface.md)
    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}': 0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, path: str, **params) -> dict:
    url = f"{base}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]


@pytest.fixture(scope="module")
def scraped(prometheus, tmp_path_factory, fake_nvml_libs):
    """The exporter (8 GPUs, TLS, basic auth) and a Prometheus scraping it every second;
    yields ``(prometheus base URL, exporter port)`` once both jobs have been scraped."""
    import bcrypt

    tmp_path = tmp_path_factory.mktemp("prometheus-scrape")
    root = make_root(tmp_path / "root", fake_nvml_libs["current"],
                     kernel_log=["NVRM: Xid (PCI:0000:28:00): 13, pid=1, Graphics Exception."])
    desc = describe(tmp_path / "desc", [gpu(i) for i in range(8)])
    cert, key = make_cert(tmp_path / "tls")
    hashed = bcrypt.hashpw(b"scrape-pw", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  prometheus: {hashed}\n")
    served = start(root, metrics_env(desc), "--web-config", str(web))
    target = INSTANCE.format(port=served.port)
    tls = {"ca_file": str(cert), "server_name": "localhost"}
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [
                  {"job_name": "podvm", "scheme": "https", "tls_config": tls,
                   "basic_auth": {"username": "prometheus", "password": "scrape-pw"},
                   "static_configs": [{"targets": [target]}]},
                  {"job_name": "no-credentials", "scheme": "https", "tls_config": tls,
                   "static_configs": [{"targets": [target]}]}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                targets = api(base, "targets")["activeTargets"]
                if len(targets) == 2 and all(t["lastScrape"] and not t["lastScrape"].startswith("0001")
                                             for t in targets) and api(base, "query", query="up")["result"]:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(1.5)  # a second scrape, so that every series has a sample
        yield base, target
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        err = served.stop()
        assert "Traceback" not in err


def instant(base: str, query: str) -> list[dict]:
    return api(base, "query", query=query)["result"]


def test_prometheus_scrapes_over_tls_with_basic_auth_and_the_job_without_is_refused(scraped):
    base, target = scraped
    up = {r["metric"]["job"]: float(r["value"][1]) for r in instant(base, "up")}
    assert up == {"podvm": 1.0, "no-credentials": 0.0}
    errors = {t["labels"]["job"]: t["lastError"] for t in api(base, "targets")["activeTargets"]}
    assert errors["podvm"] == ""
    assert "401" in errors["no-credentials"], errors


def test_prometheus_has_the_boot_families(scraped):
    base, target = scraped
    ready = instant(base, 'podvm_gpu_boot_state{job="podvm", state="ready"}')
    assert [float(r["value"][1]) for r in ready] == [1.0]
    assert float(instant(base, 'podvm_gpu_gpus{job="podvm"}')[0]["value"][1]) == 8
    assert float(instant(base, 'podvm_gpu_nvml_up{job="podvm"}')[0]["value"][1]) == 1
    assert [r["metric"]["daemon"] for r in instant(base, 'podvm_gpu_daemon_up{job="podvm"}')] == [
        "nvidia-persistenced"]
    xid = instant(base, 'DCGM_FI_DEV_XID_ERRORS{job="podvm", gpu="1"}')
    assert float(xid[0]["value"][1]) == 13


def test_the_dcgm_exporter_dashboards_queries_answer(scraped):
    base, target = scraped
    for query, series in DASHBOARD.items():
        expr = query.replace("$instance", target.replace(".", "\\\\.")).replace("$gpu", ".*")
        result = instant(base, expr)
        assert len(result) == series, (expr, result)
    assert float(instant(base, DASHBOARD_SUM.format(target=target))[0]["value"][1]) == \
        pytest.approx(8 * 71.234)
    values = api(base, "label/gpu/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"})
    assert sorted(values, key=int) == [str(i) for i in range(8)]
    instances = api(base, "label/instance/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"})
    assert instances == [target]
    # Prometheus asks for OpenMetrics first, where a counter must end in _total: the DCGM
    # counters are typed unknown there (rate() works on them all the same)
    meta = api(base, "targets/metadata", metric="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
    assert {m["type"] for m in meta if m["target"]["job"] == "podvm"} == {"unknown"}
    meta = api(base, "targets/metadata", metric="podvm_gpu_boot_state")
    assert {m["type"] for m in meta if m["target"]["job"] == "podvm"} == {"gauge"}
    assert float(instant(base, f'rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{instance="{target}"}}[5s])')
                 [0]["value"][1]) == 0


DASHBOARD_SUM = 'sum(DCGM_FI_DEV_POWER_USAGE{{instance="{target}"}})'
