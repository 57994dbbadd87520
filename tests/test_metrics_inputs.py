"""What a new user found the exporter taking badly, round 3 (issue 29 items 5, 6, 8, 9, 14, 15,
16, 18, 21 and 26): web-config headers, encrypted keys, NULs in paths, YAML bombs and duplicate
keys in the web config, a garbled status.json, textfile errors in a loop, a password echoed in
an error, a stderr on a full disk, odd digits in ``--listen``, a config others can write.

Every child process has a timeout; every server is on loopback and stopped.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import pytest
from fake_nvml import metrics_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from metrics_serving import make_cert, start
from prometheus_client.parser import text_string_to_metric_families

from podvm_gpu.config.metrics import MetricsConfigError, MetricsSettings
from podvm_gpu.host.fs import Root
from podvm_gpu.metrics.webconfig import WebConfigError, load_web_config


def metrics(root, *args, timeout=30, **kw):
    return subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=timeout, env=metrics_env(None),
                          **kw)


def podvm(root, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "podvm_gpu", *args, "--root", str(root)],
                          capture_output=True, text=True, timeout=timeout, env=metrics_env(None))


def web_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def refused(path: Path) -> str:
    with pytest.raises(WebConfigError) as err:
        load_web_config(str(path))
    return str(err.value)


def config(root: Path, text: str) -> Path:
    path = root / "etc/podvm-gpu/config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- item 5: header values the server cannot send -------------------------------------------------


@pytest.mark.parametrize("yaml_value", ['"日本"', '"a\\0b"', '"\\e[2J"', '"caf\\xe9"', '"a\\x7fb"'])
def test_a_header_value_that_is_not_printable_ascii_is_refused_by_key_at_load(tmp_path,
                                                                              yaml_value):
    """The issue: ``X-Note: "日本"`` was taken, then every scrape got an empty reply and nothing
    was logged; a NUL gave a malformed reply."""
    text = refused(web_file(tmp_path, f"http_server_config:\n  headers: {{X-Note: {yaml_value}}}\n"))
    assert "http_server_config.headers.X-Note: must be one line of printable ASCII" in text


@pytest.mark.parametrize("name", ["X Note", "Nötig", "X-Note\x00", "(x)", "a/b"])
def test_a_header_name_that_is_not_a_token_is_refused(tmp_path, name):
    path = tmp_path / "web.yml"
    path.write_text(json.dumps({"http_server_config": {"headers": {name: "v"}}}))
    assert "is not a header name" in refused(path)


def test_printable_header_values_with_spaces_and_tabs_are_sent(tmp_path):
    web = load_web_config(str(web_file(
        tmp_path, 'http_server_config:\n  headers: {X-Note: "a b\\tc ~!", X-Frame-Options: deny}\n')))
    assert web.headers == {"X-Note": "a b\tc ~!", "X-Frame-Options": "deny"}


# --- item 6: an encrypted key ---------------------------------------------------------------------


@pytest.fixture
def encrypted_key(tmp_path):
    cert, key = make_cert(tmp_path / "tls")
    encrypted = tmp_path / "tls/encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:secret",
                    "-out", str(encrypted)], check=True, capture_output=True, timeout=60)
    return cert, encrypted


def test_an_encrypted_key_is_said_to_be_encrypted(tmp_path, encrypted_key):
    cert, key = encrypted_key
    text = refused(web_file(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n"
                                      f"  key_file: {key}\n"))
    assert f"tls_server_config.key_file: {key}: the key is encrypted" in text


def test_an_encrypted_key_never_prompts_on_a_terminal(tmp_path, encrypted_key):
    """The issue: start-up prompted ``Enter PEM pass phrase:`` on the terminal and waited. Here
    the exporter has a terminal of its own (a pty as its controlling tty and stdin): it must exit
    1 with the one line, never ask."""
    cert, key = encrypted_key
    web = web_file(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    master, slave = os.openpty()

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        proc = subprocess.Popen([sys.executable, "-m", "podvm_gpu.metrics", "--root",
                                 str(tmp_path), "--listen", "127.0.0.1:0", "--web-config",
                                 str(web)], stdin=slave, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=metrics_env(None),
                                preexec_fn=own_terminal)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)
            pytest.fail("the exporter waited for a pass phrase")
        os.set_blocking(master, False)
        try:
            on_terminal = os.read(master, 4096)
        except OSError:
            on_terminal = b""
    finally:
        os.close(master)
        os.close(slave)
    assert b"pass phrase" not in on_terminal.lower()
    assert proc.returncode == 1
    assert "the key is encrypted" in err and len(err.splitlines()) == 1, err


# --- item 8, the metrics half: a NUL in a path ----------------------------------------------------


@pytest.mark.parametrize("key, value", [("textfile_path", "/run/podvm-gpu/a\\0b.prom"),
                                        ("web_config", "/etc/podvm-gpu/web\\0.yml")])
def test_a_nul_in_a_metrics_path_is_refused_by_key_and_metrics_never_tracebacks(tmp_path, key,
                                                                               value):
    config(tmp_path, f'metrics: {{textfile: true, {key}: "{value}"}}\n')
    checked = podvm(tmp_path, "config")
    assert checked.returncode == 1
    assert f"metrics.{key}: holds a NUL character" in checked.stderr
    for args in ([], ["--textfile"], ["--serve"], ["--listen", "127.0.0.1:0"]):
        done = metrics(tmp_path, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert f"metrics.{key}: holds a NUL character" in done.stderr
    with pytest.raises(MetricsConfigError):
        MetricsSettings.from_mapping({key: value.replace("\\0", "\0")})


# --- item 9: the web config parsed as the config is -----------------------------------------------


def test_a_deeply_nested_web_config_is_refused_in_one_line(tmp_path):
    web = web_file(tmp_path, "basic_auth_users: " + "[" * 100_000 + "\n")
    done = metrics(tmp_path, "--listen", "127.0.0.1:0", "--web-config", str(web))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert "nested too deeply" in done.stderr


def test_a_key_given_twice_in_the_web_config_is_refused(tmp_path, tmp_path_factory):
    cert, key = make_cert(tmp_path_factory.mktemp("tls"))
    one = f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
    text = refused(web_file(tmp_path, one + one))  # the issue: the last one was taken
    assert "tls_server_config: duplicate key (lines 1 and 4)" in text
    text = refused(web_file(tmp_path, "basic_auth_users:\n  a: x\n  a: y\n"))
    assert "basic_auth_users.a: duplicate key" in text


# --- item 16: never quote the file ----------------------------------------------------------------


@pytest.mark.parametrize("libyaml", [True, False])
def test_a_malformed_line_is_never_quoted_so_a_password_there_is_not_logged(tmp_path,
                                                                           monkeypatch, libyaml):
    import yaml

    if not libyaml:  # PyYAML's own loader quotes the line in its marks; libyaml's do not
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    text = refused(web_file(tmp_path, "basic_auth_users:\n  prometheus: S3cr3tP@ss: oops\n"))
    assert "S3cr3tP@ss" not in text
    assert "not valid YAML" in text and "line 2, column 25" in text


# --- item 14: a garbled status.json --------------------------------------------------------------


def status_doc(**fields) -> dict:
    return {"version": 2, "state": "ready", "reason": None, "warnings": [], **fields}


def write_status(root: Path, doc: dict) -> None:
    path = root / "run/podvm-gpu/status.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("fields", [{"steps": 5}, {"steps": "x"}, {"steps": [{"name": []}]},
                                    {"steps": [{"name": "detect", "duration_s": 10 ** 400}]},
                                    {"fabric": 5, "steps": {"a": 1}}])
def test_a_garbled_status_keeps_the_boot_state_once_and_when_served(tmp_path, fields):
    """The issue: ``"steps": 5`` (with a valid state) made ``metrics`` print a traceback and
    every scrape return 500, losing even podvm_gpu_boot_state. A failed document keeps its
    state (a ready one that breaks the ready rules is unreadable: issue 35 item 8, below)."""
    write_status(tmp_path, status_doc(state="failed", reason="modules: boom", **fields))
    done = metrics(tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    families = {f.name: f for f in text_string_to_metric_families(done.stdout)}
    failed = [s.value for s in families["podvm_gpu_boot_state"].samples
              if s.labels["state"] == "failed"]
    assert failed == [1]
    served = start(tmp_path, metrics_env(None))
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
    finally:
        err = served.stop()
    assert answer.startswith(b"HTTP/1.1 200 ") and b'podvm_gpu_boot_state{state="failed"} 1.0' in answer
    assert "Traceback" not in err and "error answering" not in err


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=10)
STEP = st.fixed_dictionaries({}, optional={"name": JSON | st.sampled_from(
    ["persistenced", "fabricmanager"]), "result": JSON | st.sampled_from(["ok", "failed"]),
                                           "duration_s": JSON})
FIELDS = st.fixed_dictionaries({}, optional={
    "steps": JSON | st.lists(STEP | JSON, max_size=4), "fabric": JSON | st.fixed_dictionaries(
        {}, optional={"kind": JSON | st.sampled_from(["nvswitch", "nvlink5"]), "port": JSON,
                      "port_guid": JSON}),
    "gpus": JSON, "nvswitches": JSON, "cdi": JSON | st.fixed_dictionaries({"devices": JSON}),
    "started_at": JSON, "finished_at": JSON | st.just("2026-12-02T00:00:00+00:00"),
    "version": JSON})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=st.sampled_from(["ready", "failed", "running", "no-gpu"]), fields=FIELDS)
def test_any_status_with_a_valid_state_gives_every_boot_family(state, fields):
    """A property of item 14: whatever the other fields hold, a scrape renders, with the state;
    but a ready document that breaks the rules of ready (interface.md 4.2) is unreadable, every
    state 0 and the reason saying why (issue 35 item 8: ``"gpus": "lots"`` was ready=1)."""
    from podvm_gpu.metrics.exporter import Exporter, render
    from podvm_gpu.status import not_ready_why

    doc = {**status_doc(**fields), "state": state}
    with tempfile.TemporaryDirectory() as folder:
        write_status(Path(folder), doc)
        exporter = Exporter(Root(folder), MetricsSettings())
        try:
            text = render(exporter.families()).decode()
        finally:
            exporter.close()
    if state == "ready" and not_ready_why(doc):
        assert 'podvm_gpu_boot_state{state="ready"} 0.0' in text
        assert "says ready, but" in text
    else:
        assert f'podvm_gpu_boot_state{{state="{state}"}} 1.0' in text


# --- item 15: textfile errors in a loop, and the interval's floor ---------------------------------


class StopAfter:
    """A stop event for ``serve`` whose wait returns at once and which is set after ``n``."""

    def __init__(self, n: int):
        self.n = n
        self.waits = 0

    def is_set(self) -> bool:
        return self.waits >= self.n

    def wait(self, timeout=None) -> bool:
        self.waits += 1
        return self.is_set()


def test_textfile_write_errors_are_said_once_a_minute_not_at_every_write(tmp_path, capfd):
    """The issue: 1426 lines in 3 s with ``textfile_interval_s: 0.001``."""
    from podvm_gpu.metrics.command import serve

    (tmp_path / "run/podvm-gpu/metrics.prom").mkdir(parents=True)  # cannot be written
    settings_ = MetricsSettings(listen="", textfile=True)
    stop = StopAfter(200)
    assert serve(Root(str(tmp_path)), settings_, stop=stop) == 0
    assert stop.waits == 200, "it went on writing"
    lines = capfd.readouterr().err.splitlines()
    assert lines == ["podvm-gpu metrics: cannot write /run/podvm-gpu/metrics.prom: Is a directory "
                     "(said at most once a minute)"]


def test_a_bug_making_the_textfile_is_one_line_a_minute_and_serving_goes_on(tmp_path, capfd,
                                                                           monkeypatch):
    from podvm_gpu.metrics import command, exporter

    def broken(self, with_nvml=True):
        raise KeyError("a bug")

    monkeypatch.setattr(exporter.Exporter, "families", broken)
    stop = StopAfter(50)
    assert command.serve(Root(str(tmp_path)), MetricsSettings(listen="", textfile=True),
                         stop=stop) == 0
    assert stop.waits == 50
    assert capfd.readouterr().err.splitlines() == [
        "podvm-gpu metrics: error writing /run/podvm-gpu/metrics.prom: KeyError: 'a bug'"]


@pytest.mark.parametrize("value", [0.001, 0.5, 0.999])
def test_the_textfile_interval_has_a_floor_of_a_second(value):
    with pytest.raises(MetricsConfigError) as err:
        MetricsSettings.from_mapping({"textfile_interval_s": value})
    assert err.value.key_path == "metrics.textfile_interval_s"
    assert "at least 1 s" in err.value.message
    assert MetricsSettings.from_mapping({"textfile_interval_s": 1}).textfile_interval_s == 1.0


# --- item 18: stderr on a full disk ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listen_with_stderr_on_a_full_disk_keeps_serving(tmp_path):
    """The issue: ``metrics --listen`` with stderr on /dev/full exited 1 without serving: its
    ``serving`` line is best effort."""
    port = free_port()
    with open("/dev/full", "w") as full:
        proc = subprocess.Popen([sys.executable, "-m", "podvm_gpu.metrics", "--root",
                                 str(tmp_path), "--listen", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=full, env=metrics_env(None))
    try:
        deadline, answer = time.monotonic() + 30, b""
        while time.monotonic() < deadline and proc.poll() is None and not answer:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                    while chunk := s.recv(65536):
                        answer += chunk
            except ConnectionRefusedError:
                time.sleep(0.1)
        assert proc.poll() is None, f"it exited {proc.returncode}"
        assert answer.startswith(b"HTTP/1.1 200 ") and b"podvm_gpu_boot_state" in answer
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- item 21: --listen ---------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["127.0.0.1:\u0669\u0664\u0660\u0660", "127.0.0.1:²",
                                    "127.0.0.1:9\uff1400", "localhost:9400", "127.0.0.1:"])
def test_a_listen_address_of_the_wrong_shape_is_a_usage_error_in_words(tmp_path, listen):
    for program in (["-m", "podvm_gpu", "metrics"], ["-m", "podvm_gpu.metrics"]):
        done = subprocess.run([sys.executable, *program, "--root", str(tmp_path), "--listen",
                               listen], capture_output=True, text=True, timeout=30,
                              env=metrics_env(None))
        assert done.returncode == 2, (program, done.stderr)
        assert done.stderr.startswith("usage: podvm-gpu metrics"), done.stderr
        assert f"podvm-gpu: error: --listen {listen!r}" in done.stderr
        assert "invalid literal" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("listen", ["127.0.0.1:²", "127.0.0.1:\u0669\u0664\u0660\u0660"])
def test_the_config_key_listen_takes_ascii_digits_only(listen):
    with pytest.raises(MetricsConfigError) as err:
        MetricsSettings.from_mapping({"listen": listen})
    assert err.value.message == f"{listen!r} is not HOST:PORT with a port 1-65535"


# --- item 26: a config others can write -----------------------------------------------------------


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_metrics_refuses_a_config_that_boot_config_and_check_refuse(tmp_path, mode):
    path = config(tmp_path, "metrics: {textfile: true}\n")
    path.chmod(mode)
    done = metrics(tmp_path, "--textfile")
    assert done.returncode == 2
    assert "not trusted: it is writable by group or others" in done.stderr
    assert not (tmp_path / "run/podvm-gpu/metrics.prom").exists()
    assert podvm(tmp_path, "config").returncode == 1


# --- item 9 as a property: whatever the web config holds, a WebConfigError or a config -----------


KEYS = st.sampled_from(["tls_server_config", "http_server_config", "basic_auth_users",
                        "cert_file", "key_file", "client_auth_type", "client_ca_file",
                        "min_version", "max_version", "prefer_server_cipher_suites", "http2",
                        "headers", "prometheus", "X-Note", "TLS12", "a\0b", "日本"])
LEAF = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
        | st.sampled_from(["TLS13", "NoClientCert", "RequireAndVerifyClientCert", "a\0b",
                           "/dev/null", "/", "$2b$10$" + "a" * 53, "$2b$99$" + "a" * 53]))
FILES = st.sampled_from(["a\0b", "/dev/null", "/dev/zero", "/", "missing", ""]) | LEAF
ANY = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=3)
                   | st.dictionaries(KEYS | st.text(max_size=6), inner, max_size=4),
                   max_leaves=12)
WEB = ANY | st.fixed_dictionaries({}, optional={
    "tls_server_config": ANY | st.fixed_dictionaries({}, optional={
        **{key: FILES for key in ("cert_file", "key_file", "client_ca_file")},
        **{key: LEAF for key in ("client_auth_type", "min_version", "max_version",
                                 "prefer_server_cipher_suites")}}),
    "http_server_config": ANY | st.fixed_dictionaries({}, optional={
        "http2": LEAF, "headers": ANY | st.dictionaries(KEYS | st.text(max_size=6), LEAF)}),
    "basic_auth_users": ANY | st.dictionaries(KEYS | st.text(max_size=6), LEAF)})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=WEB)
def test_any_web_config_document_is_loaded_or_refused_by_a_web_config_error(doc):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "web.yml")
        path.write_text(json.dumps(doc))  # JSON is YAML: the structure is what is generated
        try:
            load_web_config(str(path))
        except WebConfigError as err:
            assert "\n" not in str(err)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")))
def test_any_web_config_text_is_loaded_or_refused_by_a_web_config_error(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "web.yml")
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            load_web_config(str(path))
        except WebConfigError as err:
            assert "\n" not in str(err)


@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "link loop", "dangling link",
                                  "huge"])
def test_a_web_config_of_any_file_type_or_size_is_refused_or_taken_at_once(tmp_path, kind):
    path = tmp_path / "web.yml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "link loop":
        path.symlink_to(path)
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "none")
    else:
        path.write_bytes(b"#" * (1024 * 1024 + 1))
    done = metrics(tmp_path, "--listen", "127.0.0.1:0", "--web-config", str(path), timeout=20)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"podvm-gpu metrics: bad web config: {path}: "), done.stderr


def test_a_web_config_key_with_a_newline_is_named_on_one_line(tmp_path):
    """Found by hypothesis: a top-level key ``"\\n"`` was echoed raw, so the error (and the
    journal line) broke in two."""
    from podvm_gpu.metrics.webconfig import WebConfigError, load_web_config

    path = tmp_path / "web.yml"
    path.write_text('"a\\nb\\u001b[2J": 1\n')
    with pytest.raises(WebConfigError) as err:
        load_web_config(str(path))
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value), str(err.value)
    assert "a\\x0ab\\x1b[2J: not implemented by this server" in str(err.value), str(err.value)
