"""What a newcomer found breaking the exporter (branch metrics-fixes): TLS versions that did
nothing, a textfile path over the agent's own files, a FIFO as the web config, ``gzip;q=0``,
bare-LF requests, ``[Errno N]`` in messages, ``--web-config`` without serving.

Every server started here is on loopback and stopped; every child process has a timeout.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import warnings

import pytest
from fake_nvml import metrics_env
from metrics_serving import make_cert, start

from podvm_gpu.config.metrics import MetricsConfigError, MetricsSettings
from podvm_gpu.metrics.prom import gzip_accepted
from podvm_gpu.metrics.server import MetricsServer, Response
from podvm_gpu.metrics.webconfig import WebConfigError, load_web_config


def metrics(root, *args, timeout=30, **kw):
    return subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=timeout, env=metrics_env(None), **kw)


def exchange(port: int, data: bytes, wait_s: float = 10.0, context=None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        if context is not None:
            s = context.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


@pytest.fixture
def serve_in_process():
    """``make(web=None, **bounds)`` -> port of a MetricsServer on loopback answering "ok"."""
    servers = []

    def make(web=None, **bounds):
        server = MetricsServer("127.0.0.1", 0, lambda request: Response(200, b"ok\n"), web,
                               **bounds)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


# --- 1. TLS versions -------------------------------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path):
    return make_cert(tmp_path / "tls")


def web_with(tmp_path, tls_files, extra: str):
    cert, key = tls_files
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n{extra}")
    return path


def client(cert, lowest=None, highest=None):
    context = ssl.create_default_context(cafile=str(cert))
    with warnings.catch_warnings():  # TLSv1/TLSv1_1 are deprecated names
        warnings.simplefilter("ignore", DeprecationWarning)
        if lowest is not None:
            context.minimum_version = lowest
            context.set_ciphers("DEFAULT:@SECLEVEL=0")  # lets this client offer TLS 1.0/1.1
        if highest is not None:
            context.maximum_version = highest
    return context


def handshake(port: int, context) -> str:
    """The TLS version the server agreed to."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        with context.wrap_socket(s, server_hostname="127.0.0.1") as t:
            return t.version()


V = ssl.TLSVersion


@pytest.mark.parametrize("extra, lowest, highest, agreed", [
    ("  min_version: TLS13\n", None, V.TLSv1_2, None),  # the newcomer's case
    ("  min_version: TLS13\n", None, None, "TLSv1.3"),
    ("  max_version: TLS12\n", None, None, "TLSv1.2"),
    ("  min_version: TLS12\n  max_version: TLS12\n", None, V.TLSv1_3, "TLSv1.2"),
    ("", V.TLSv1, V.TLSv1_1, None),  # default minimum TLS12
    ("", None, None, "TLSv1.3"),
])
def test_tls_versions_bound_what_a_real_client_can_agree(tmp_path, tls_files, serve_in_process,
                                                         extra, lowest, highest, agreed):
    port = serve_in_process(load_web_config(str(web_with(tmp_path, tls_files, extra))))
    context = client(tls_files[0], lowest, highest)
    if agreed is None:
        with pytest.raises(ssl.SSLError):
            handshake(port, context)
    else:
        assert handshake(port, context) == agreed


def test_openssl_s_client_cannot_speak_tls12_to_min_tls13(tmp_path, tls_files, serve_in_process):
    port = serve_in_process(load_web_config(str(web_with(tmp_path, tls_files,
                                                         "  min_version: TLS13\n"))))

    def s_client(flag: str) -> subprocess.CompletedProcess:
        return subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", flag,
                               "-CAfile", str(tls_files[0])], input="", capture_output=True,
                              text=True, timeout=30)

    refused = s_client("-tls1_2")
    assert refused.returncode != 0, refused.stdout
    accepted = s_client("-tls1_3")
    assert accepted.returncode == 0 and "TLSv1.3" in accepted.stdout, accepted.stderr


def test_min_version_above_max_version_is_refused_naming_both(tmp_path, tls_files):
    web = web_with(tmp_path, tls_files, "  min_version: TLS13\n  max_version: TLS12\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(str(web))
    assert "tls_server_config.min_version" in str(err.value)
    assert "tls_server_config.max_version" in str(err.value)
    done = metrics(tmp_path, "--listen", "127.0.0.1:0", "--web-config", str(web))
    assert done.returncode == 1
    assert done.stderr.startswith(f"podvm-gpu metrics: bad web config: {web}: "), done.stderr


@pytest.mark.parametrize("value", ["TLS14", "tls12", "1.2", "SSL30"])
def test_an_unknown_tls_version_is_refused(tmp_path, tls_files, value):
    web = web_with(tmp_path, tls_files, f"  max_version: {value}\n")
    with pytest.raises(WebConfigError, match="tls_server_config.max_version: must be one of "
                                             "TLS12, TLS13"):
        load_web_config(str(web))


@pytest.mark.parametrize("extra", ["  min_version: TLS10\n", "  min_version: TLS11\n",
                                   "  max_version: TLS11\n"])
def test_tls_1_0_and_1_1_are_refused_by_name_not_offered(tmp_path, tls_files, extra):
    """Deprecated (RFC 8996); OpenSSL 3 would speak them only at security level 0, which this
    server will not lower to."""
    web = web_with(tmp_path, tls_files, extra)
    with pytest.raises(WebConfigError, match="is not implemented: TLS 1.0 and 1.1 are deprecated"):
        load_web_config(str(web))


# --- 2. the textfile path ---------------------------------------------------------------------------


@pytest.mark.parametrize("path, why", [
    ("/var/run/cdi/nvidia.yaml", ".prom"),
    ("/run/podvm-gpu/status.json", ".prom"),
    ("/etc/podvm-gpu/config.yaml", ".prom"),
    ("/var/run/cdi/metrics.prom", "CDI spec folder"),
    ("/etc/cdi/x.prom", "CDI spec folder"),
    ("/run/cdi/sub/x.prom", "CDI spec folder"),
    ("/run/podvm-gpu/../cdi/x.prom", "CDI spec folder"),
    ("/etc/podvm-gpu/metrics.prom", "/etc/podvm-gpu"),
    ("/run/podvm-gpu/.prom", ".prom"),
])
def test_a_textfile_path_over_the_agents_own_files_is_refused(path, why):
    with pytest.raises(MetricsConfigError) as err:
        MetricsSettings.from_mapping({"textfile_path": path})
    assert err.value.key_path == "metrics.textfile_path"
    assert why in err.value.message


@pytest.mark.parametrize("path", ["/run/podvm-gpu/metrics.prom", "/var/lib/node_exporter/gpu.prom",
                                  "/run/cdi-not/x.prom"])
def test_a_textfile_path_node_exporter_reads_is_accepted(path):
    assert MetricsSettings.from_mapping({"textfile_path": path}).textfile_path == path


def test_config_and_boot_refuse_a_textfile_path_over_the_cdi_spec(tmp_path):
    root = tmp_path / "root"
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text(
        "metrics: {textfile: true, textfile_path: /var/run/cdi/nvidia.yaml}\n")
    env = metrics_env(None)
    config = subprocess.run([sys.executable, "-m", "podvm_gpu", "config", "--root", str(root)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert config.returncode == 1
    assert "metrics.textfile_path" in config.stderr + config.stdout
    booted = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert booted.returncode == 1, booted.stderr
    status = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "failed"
    assert "metrics.textfile_path" in status["reason"]
    spec = (root / "var/run/cdi/nvidia.yaml").read_text()
    assert "# HELP" not in spec and "podvm_gpu_boot_state" not in spec, "the unavailable spec stays"


def test_a_textfile_whose_folder_links_into_the_agents_config_folder_is_refused(tmp_path):
    """Issue 35 item 17: the path was checked as text only; through a link it wrote under
    /etc/podvm-gpu."""
    root = tmp_path / "root"
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text(
        "metrics: {textfile: true, textfile_path: /var/lib/node_exporter/gpu.prom}\n")
    (root / "var/lib").mkdir(parents=True)
    os.symlink("/etc/podvm-gpu", root / "var/lib/node_exporter")
    done = metrics(root, "--textfile")
    assert done.returncode == 1
    assert done.stderr == ("podvm-gpu metrics: cannot write /var/lib/node_exporter/gpu.prom: refused: "
                           "a link in its path leads to /etc/podvm-gpu/gpu.prom, under /etc/podvm-gpu "
                           "(the agent's config folder)\n"), done.stderr
    assert sorted(os.listdir(root / "etc/podvm-gpu")) == ["config.yaml"]


# --- 3. a FIFO where a file should be ---------------------------------------------------------------


def test_a_fifo_as_the_web_config_is_refused_not_waited_for(tmp_path):
    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)
    done = metrics(tmp_path, "--listen", "127.0.0.1:0", "--web-config", str(fifo), timeout=20)
    assert done.returncode == 1
    assert done.stderr == f"podvm-gpu metrics: bad web config: {fifo}: cannot read the web " \
                          "config: not a regular file\n"


def test_a_fifo_as_the_config_keys_web_config_under_the_root_is_refused(tmp_path):
    root = tmp_path / "root"
    (root / "etc/podvm-gpu").mkdir(parents=True)
    os.mkfifo(root / "etc/podvm-gpu/web.yml")
    (root / "etc/podvm-gpu/config.yaml").write_text("metrics: {web_config: /etc/podvm-gpu/web.yml}\n")
    done = metrics(root, "--listen", "127.0.0.1:0", timeout=20)
    assert done.returncode == 1
    assert "not a regular file" in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_link_to_the_web_config_is_followed(tmp_path):
    real = tmp_path / "real.yml"
    real.write_text("http_server_config: {http2: false}\n")
    (tmp_path / "web.yml").symlink_to(real)
    assert load_web_config(str(tmp_path / "web.yml")).ssl_context is None


@pytest.mark.parametrize("key", ["cert_file", "key_file", "client_ca_file"])
def test_a_fifo_as_a_certificate_key_or_ca_file_is_refused_by_name(tmp_path, tls_files, key):
    cert, tls_key = tls_files
    files = {"cert_file": str(cert), "key_file": str(tls_key), "client_ca_file": str(cert)}
    files[key] = str(tmp_path / "fifo")
    os.mkfifo(files[key])
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n" + "".join(f"  {k}: {v}\n" for k, v in files.items())
                   + "  client_auth_type: RequireAndVerifyClientCert\n")
    done = metrics(tmp_path, "--listen", "127.0.0.1:0", "--web-config", str(web), timeout=20)
    assert done.returncode == 1
    assert f"tls_server_config.{key}: {files[key]}: not a regular file" in done.stderr, done.stderr


# --- 4. q-values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("header, wanted", [
    ("gzip", True), ("GZIP", True), ("deflate, gzip;q=0.5", True), ("gzip; q=1.0", True),
    ("x-gzip", True), ("*", True), ("br;q=1, *;q=0.1", True),
    ("", False), ("identity", False), ("deflate", False),
    ("gzip;q=0", False), ("gzip;q=0.000", False), ("gzip;q=0, identity;q=0", False),
    ("gzip; Q=0", False), ("*;q=0", False), ("gzip;q=0, *", False), ("gzip;q=bad", False),
    ("gzip;q=2", False),
])
def test_gzip_is_accepted_by_its_q_value(header, wanted):
    assert gzip_accepted(header) is wanted


def test_the_exporter_sends_no_gzip_for_gzip_q0(tmp_path):
    served = start(tmp_path, metrics_env(None))
    try:
        def head_and_body(encoding: str) -> tuple[bytes, bytes]:
            answer = exchange(served.port, b"GET /metrics HTTP/1.1\r\nAccept-Encoding: "
                              + encoding.encode() + b"\r\n\r\n")
            return tuple(answer.split(b"\r\n\r\n", 1))

        head, body = head_and_body("gzip;q=0, identity;q=0")
        assert b"Content-Encoding" not in head and b"podvm_gpu_boot_state" in body
        head, body = head_and_body("gzip;q=0.8")
        assert b"Content-Encoding: gzip" in head and b"podvm_gpu" in gzip.decompress(body)
        head, _ = head_and_body("identity")
        answer = exchange(served.port, b"GET /metrics HTTP/1.1\r\nAccept: "
                          b"application/openmetrics-text;q=0, text/plain\r\n\r\n")
        assert b"Content-Type: text/plain" in answer.split(b"\r\n\r\n", 1)[0]
    finally:
        assert "Traceback" not in served.stop()


# --- 5. bare LF -------------------------------------------------------------------------------------


def test_a_request_ending_its_lines_with_bare_lf_is_answered(serve_in_process):
    port = serve_in_process(request_timeout_s=5)
    for request in (b"GET /metrics HTTP/1.1\n\n", b"GET /metrics HTTP/1.1\nHost: x\n\n",
                    b"GET /metrics HTTP/1.1\r\nHost: x\n\r\n"):
        answer = exchange(port, request, wait_s=2)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), (request, answer)
    answer = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: a\rb\r\n\r\n", wait_s=2)
    assert answer.startswith(b"HTTP/1.1 400 "), "a bare CR inside a line is refused"


# --- 6. errors in words -----------------------------------------------------------------------------


def test_an_address_in_use_is_said_in_words(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = metrics(tmp_path, "--listen", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert done.stderr == f"podvm-gpu metrics: cannot listen on 127.0.0.1:{port}: " \
                          "Address already in use\n"


def test_a_full_disk_for_the_metrics_is_said_in_words(tmp_path):
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(tmp_path)],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=30,
                              env=metrics_env(None))
    assert done.returncode == 1
    assert done.stderr == "podvm-gpu metrics: cannot write the metrics: No space left on device\n"


def test_a_textfile_that_is_a_folder_names_the_textfile_not_the_temporary_file(tmp_path):
    root = tmp_path / "root"
    (root / "run/podvm-gpu/metrics.prom").mkdir(parents=True)
    done = metrics(root, "--textfile")
    assert done.returncode == 1
    assert done.stderr == "podvm-gpu metrics: cannot write /run/podvm-gpu/metrics.prom: Is a " \
                          "directory\n"
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text("metrics: {textfile: true}\n")
    booted = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            capture_output=True, text=True, timeout=60, env=metrics_env(None))
    assert booted.returncode == 0, booted.stderr
    warned = [line for line in booted.stderr.splitlines() if "metrics:" in line]
    assert len(warned) == 1 and warned[0].endswith(
        "metrics: cannot write /run/podvm-gpu/metrics.prom: Is a directory"), booted.stderr
    assert not [n for n in os.listdir(root / "run/podvm-gpu") if n.endswith(".tmp")]


# --- 7. --web-config needs serving -----------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["--web-config", "web.yml"], "--web-config needs --serve or --listen"),
    (["--textfile", "--web-config=web.yml"], "--web-config needs --serve or --listen"),
    (["--openmetrics", "--web-config", "/nonexistent/web.yml"], "--web-config needs --serve or --listen"),
    (["--serve", "--web-config="], "--web-config is empty"),
    (["--listen", "127.0.0.1:0", "--web-config", ""], "--web-config is empty"),
])
def test_web_config_without_serving_or_empty_is_a_usage_error(tmp_path, args, says):
    (tmp_path / "web.yml").write_text("bogus: key\n")
    for program in (["-m", "podvm_gpu", "metrics"], ["-m", "podvm_gpu.metrics"]):
        done = subprocess.run([sys.executable, *program, "--root", str(tmp_path), *args],
                              capture_output=True, text=True, timeout=30, cwd=tmp_path,
                              env=metrics_env(None))
        assert done.returncode == 2, (program, done.stderr)
        assert done.stdout == ""
        assert f"podvm-gpu: error: {says}" in done.stderr
