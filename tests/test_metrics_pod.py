"""Pod attribution (issue 28, podvm_gpu/metrics/pod.py): ``metrics --pod-labels`` reads
cloud-api-adaptor's /run/peerpod/apf.json once and writes only the pod's name and namespace;
the exporter adds them as ``pod`` and ``namespace`` and never opens apf.json itself. A missing or
bad file: no labels, one warning, nothing of the file's content anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fake_nvml import describe, gpu, make_root, metrics_env
from test_metrics import scrape

from podvm_gpu.host.fs import Root
from podvm_gpu.metrics import pod

SECRET = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
APF = {"pod-name": "train-7f9c4-abcde", "pod-namespace": "ml-team", "tls-server-key": SECRET,
       "tls-server-cert": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}


def write_apf(root, doc, mode=0o600) -> None:
    path = root / "run/peerpod/apf.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    path.chmod(mode)


def pod_labels(root):
    return subprocess.run([sys.executable, "-m", "podvm_gpu", "metrics", "--root", str(root),
                           "--pod-labels"], capture_output=True, text=True, timeout=60,
                          env=metrics_env(None))


def test_the_reader_writes_only_the_two_names_and_the_exporter_labels_every_gpu_series(
        tmp_path, fake_nvml_libs):
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=2)
    write_apf(root, APF)
    done = pod_labels(root)
    assert done.returncode == 0, done.stderr
    labels_file = root / "run/podvm-gpu/pod-labels.json"
    assert json.loads(labels_file.read_text()) == {"pod": "train-7f9c4-abcde",
                                                   "namespace": "ml-team"}
    assert oct(labels_file.stat().st_mode & 0o777) == "0o644"
    assert "PRIVATE" not in done.stdout + done.stderr + labels_file.read_text()
    families = scrape(root, describe(tmp_path / "desc", [gpu(0), gpu(1)]))
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_XID_ERRORS_COUNT"):
        for sample in families[name].samples:
            assert (sample.labels["pod"], sample.labels["namespace"]) == (
                "train-7f9c4-abcde", "ml-team"), name
    assert "pod" not in families["podvm_gpu_boot_state"].samples[0].labels


@pytest.mark.parametrize("doc, mode, why", [
    (None, 0o600, "No such file"),
    ("{not json", 0o600, "is not JSON"),
    ({"pod-name": "x"}, 0o600, "has no pod-name and pod-namespace strings"),
    ({**APF, "pod-name": "Bad_Name"}, 0o600, "pod-name is not a Kubernetes pod name"),
    ({**APF, "pod-namespace": "a" * 64}, 0o600, "pod-namespace is not a Kubernetes namespace name"),
    (APF, 0o666, "could be written by another user than root"),
])
def test_a_missing_or_bad_apf_json_means_no_labels_and_one_warning_without_its_content(
        tmp_path, fake_nvml_libs, doc, mode, why):
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=1)
    stale = root / "run/podvm-gpu/pod-labels.json"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text('{"pod": "old-pod", "namespace": "old"}\n')  # an earlier pod's: removed
    if doc is not None:
        write_apf(root, doc, mode)
    done = pod_labels(root)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and why in warnings[0], done.stderr
    assert "PRIVATE" not in done.stderr and "MIIE" not in done.stderr
    assert not stale.exists()
    families = scrape(root, describe(tmp_path / "desc", [gpu(0)]))
    assert "pod" not in families["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels


def test_a_fifo_or_link_planted_as_apf_json_cannot_hang_or_redirect_the_reader(tmp_path):
    root = tmp_path / "root"
    (root / "run/peerpod").mkdir(parents=True)
    os.mkfifo(root / "run/peerpod/apf.json")
    with pytest.raises(pod.Unusable, match="not a regular file"):
        pod.read_apf(Root(root))
    (root / "run/peerpod/apf.json").unlink()
    (root / "secret.json").write_text(json.dumps(APF))
    (root / "run/peerpod/apf.json").symlink_to(root / "secret.json")
    with pytest.raises(pod.Unusable) as err:
        pod.read_apf(Root(root))
    # issue 35 item 14: it said "Too many levels of symbolic links" for one link
    assert str(err.value) == "/run/peerpod/apf.json is a symbolic link, which is not followed (a " \
        "regular file only)"


def test_the_network_facing_exporter_never_opens_apf_json(tmp_path, fake_nvml_libs, monkeypatch):
    """One scrape in this process with every open() recorded: apf.json is not among them."""
    from podvm_gpu.config.metrics import MetricsSettings
    from podvm_gpu.metrics.exporter import Exporter

    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=1)
    write_apf(root, APF)
    assert pod_labels(root).returncode == 0
    monkeypatch.setenv("FAKE_NVML_DESCRIPTION", str(describe(tmp_path / "desc", [gpu(0)])))
    monkeypatch.setenv("PODVM_GPU_TEST_FOREIGN_NVML", "1")  # the fake under a temporary root
    opened = []
    real_open = os.open

    def spy(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    exporter = Exporter(Root(root), MetricsSettings())
    try:
        families = {f.name: f for f in exporter.families()}
    finally:
        exporter.close()
    # the scrape read the labels file (the pod is in the labels) and never apf.json
    assert families["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels["pod"] == "train-7f9c4-abcde"
    assert [p for p in opened if p.endswith("pod-labels.json")]
    assert not [p for p in opened if "peerpod" in p]


@pytest.mark.parametrize("text, why", [
    ('{"pod-name": "a", "pod-namespace": "ns", "pod-name": "b"}', "a key pod-name is given twice"),
    ('{"pod-name": "a", "pod-namespace": "ns", "x": {"k": "PRIVATE1", "k": "PRIVATE2"}}',
     "a key is given twice"),
])
def test_an_apf_json_with_a_key_given_twice_is_refused_without_quoting_it(tmp_path, text, why):
    """Issue 35 item 17: json.loads kept the last of two pod-name keys; the config and the web
    config refuse a key given twice."""
    root = tmp_path / "root"
    write_apf(root, text)
    with pytest.raises(pod.Unusable) as err:
        pod.read_apf(Root(str(root)))
    assert str(err.value) == f"/run/peerpod/apf.json: {why} in one object"
    assert "PRIVATE" not in str(err.value)
