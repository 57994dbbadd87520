"""Basic auth under password guesses (issue 29 items 3 and 7): what a guess may cost, where it
is checked, and what an unknown user name costs.

The mechanism is asserted, not wall times: bcrypt is held by a gate the test opens, so "a
guess cannot occupy a worker" is shown by a scrape answered while a guess's check is held, and
"the dummy hash costs what the configured hashes cost" by the cost field bcrypt is given. One
end-to-end run with real bcrypt repeats the issue's flood. Every server is on loopback and
stopped; every exchange has a timeout.
"""

from __future__ import annotations

import base64
import functools
import socket
import ssl
import threading
import time

import bcrypt
import pytest
from fake_nvml import metrics_env
from metrics_serving import make_cert, start

from podvm_gpu.metrics import auth
from podvm_gpu.metrics.server import MetricsServer, Response
from podvm_gpu.metrics.webconfig import load_web_config

WAIT_S = 10.0  # the most any exchange here may take; a refusal comes at once, far below it


def hashed(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def request(user: str, password: str, method: str = "GET") -> bytes:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return f"{method} /metrics HTTP/1.1\r\nAuthorization: Basic {token}\r\n\r\n".encode()


def exchange_over(port: int, data: bytes, source: str = "127.0.0.1",
                  context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """Send ``data`` from the address ``source`` (any of 127/8 reaches the server), over TLS
    with ``context``; the status code and the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S,
                                  source_address=(source, 0)) as s:
        if context is not None:
            s = context.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return (int(out.split(b" ", 2)[1]) if out else 0), out


exchange = exchange_over


class HeldBcrypt:
    """``bcrypt.checkpw`` that records each call (its thread and the hash's cost) and waits
    while :attr:`gate` is closed."""

    def __init__(self, real):
        self.real = real
        self.gate = threading.Event()
        self.gate.set()
        self.calls: list[tuple[str, int]] = []
        self.entered = threading.Semaphore(0)

    def __call__(self, password: bytes, hashed_: bytes) -> bool:
        self.calls.append((threading.current_thread().name, int(hashed_[4:6])))
        self.entered.release()
        assert self.gate.wait(WAIT_S * 3), "the test never opened the gate"
        return self.real(password, hashed_)


@pytest.fixture
def held(monkeypatch):
    fake = HeldBcrypt(bcrypt.checkpw)
    monkeypatch.setattr(bcrypt, "checkpw", fake)
    yield fake
    fake.gate.set()


@pytest.fixture
def auth_server(tmp_path):
    """A MetricsServer on loopback with user ``prometheus`` (password ``right``) answering
    "ok"; yields ``(server, port)``."""
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed('right')}\n")
    server = MetricsServer("127.0.0.1", 0, lambda r: Response(200, b"ok\n"),
                           load_web_config(str(web)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, server.server_address[1]
    server.shutdown()
    server.server_close()


def test_guesses_from_one_client_cost_one_check_and_never_a_worker(auth_server, held):
    server, port = auth_server
    server._gate.fail_delay_s = 60.0  # the delay's length is not what is tested: a slow machine
    assert exchange(port, request("prometheus", "right"))[0] == 200  # checked once, kept
    assert held.entered.acquire(timeout=WAIT_S)  # that check's entry: the next one is the guess's
    held.gate.clear()
    first = threading.Thread(target=exchange, args=(port, request("prometheus", "guess-0")))
    first.start()
    assert held.entered.acquire(timeout=WAIT_S), "the first guess is checked"
    # while that check is held: every further guess of this client is refused at once, by the
    # selector thread, without a check
    answers = [exchange(port, request("prometheus", f"guess-{i}"))[0] for i in range(1, 31)]
    assert answers == [429] * 30
    # ... and the authorised scraper is answered by a worker: the guess occupies none
    for _ in range(10):
        assert exchange(port, request("prometheus", "right"))[0] == 200
    assert len(held.calls) == 2
    held.gate.set()
    first.join(WAIT_S)
    assert not first.is_alive()
    # a client whose guess was wrong waits (a second, here a minute) for its next check
    assert exchange(port, request("prometheus", "guess-31"))[0] == 429
    # a pair found wrong before is answered 401 again, at once, without a check
    assert exchange(port, request("prometheus", "guess-0"))[0] == 401
    assert len(held.calls) == 2
    assert {name.split("_")[0] for name, _ in held.calls} == {"podvm-gpu-auth"}, \
        "bcrypt never runs in a worker (podvm-gpu-http)"


def test_guesses_from_many_clients_are_bounded_in_all_and_the_scraper_still_served(auth_server,
                                                                                   held):
    server, port = auth_server
    assert exchange(port, request("prometheus", "right"))[0] == 200
    held.gate.clear()
    calls_before = len(held.calls)
    waiting = []
    for i in range(auth.MAX_CHECKS):  # one check each: all the checks there may be at once
        t = threading.Thread(target=exchange, args=(port, request("prometheus", f"g{i}"),
                                                    f"127.0.1.{i + 1}"))
        t.start()
        waiting.append(t)
    deadline = time.monotonic() + WAIT_S
    while (server._gate.checking() < auth.MAX_CHECKS
           or len(held.calls) - calls_before < auth.CHECK_THREADS) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server._gate.checking() == auth.MAX_CHECKS
    # one more client: busy at once; the authorised scraper: answered
    assert exchange(port, request("prometheus", "g-more"), "127.0.2.1")[0] == 503
    assert exchange(port, request("nobody", "x"), "127.0.2.2")[0] == 503
    assert exchange(port, request("prometheus", "right"), "127.0.2.3")[0] == 200
    running = len(held.calls) - calls_before
    assert running == auth.CHECK_THREADS, "only the check threads run bcrypt"
    held.gate.set()
    for t in waiting:
        t.join(WAIT_S)
    assert len(held.calls) - calls_before == auth.MAX_CHECKS


def test_no_password_or_a_malformed_one_is_401_without_a_check(auth_server, held):
    _, port = auth_server
    assert exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")[0] == 401
    assert exchange(port, b"GET /metrics HTTP/1.1\r\nAuthorization: Basic !!\r\n\r\n")[0] == 401
    code, answer = exchange(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert code == 401 and answer.endswith(b"\r\n\r\n"), "HEAD: no body"
    assert held.calls == []


def test_no_number_of_wrong_pairs_pushes_the_right_one_out_of_the_cache(tmp_path, held):
    """The issue: 64 different wrong pairs emptied the one 64-entry cache, right pair included."""
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed('right')}\n")
    config = load_web_config(str(web))
    assert config.check_password("prometheus", b"right")
    for i in range(200):
        assert not config.check_password("prometheus", f"wrong-{i}".encode())
        assert not config.check_password(f"nobody-{i}", b"x")
    checks = len(held.calls)
    assert config.cached("prometheus", b"right") is True
    assert config.check_password("prometheus", b"right")
    assert len(held.calls) == checks, "answered from the cache"


def test_the_gate_admits_one_check_per_client_and_delays_a_wrong_one():
    now = [100.0]
    gate = auth.ClientGate(fail_delay_s=1.0, max_checks=2, max_clients=3, clock=lambda: now[0])
    assert gate.admit("a") is None
    assert gate.admit("a") == auth.THROTTLED
    assert gate.admit("b") is None
    assert gate.admit("c") == auth.BUSY
    gate.done("a", right=False)
    assert gate.admit("a") == auth.THROTTLED
    now[0] += 1.0
    assert gate.admit("a") is None
    gate.done("a", right=True)
    assert gate.admit("a") is None, "a right password costs no delay"
    gate.done("a", right=False)
    gate.done("b", right=False)
    assert gate.admit("c") is None
    gate.done("c", right=False)
    assert gate.admit("d") == auth.BUSY, "three remembered clients in their delay"
    now[0] += 1.0
    assert gate.admit("d") is None, "clients whose delay is over are forgotten"


# --- item 7: an unknown user costs what a known one costs ------------------------------------------


@pytest.mark.parametrize("costs, dummy", [((12,), 12), ((10,), 10), ((4,), 4), ((4, 11), 11)])
def test_an_unknown_user_is_checked_against_a_hash_of_the_configured_cost(tmp_path, held, costs,
                                                                          dummy):
    """The issue: an unknown user cost a cost-10 dummy check (~0.06 s), a known one its cost-12
    hash (~0.37 s): the time told which names exist."""
    tail = hashed("x")[7:]  # a hash's form is checked at load; bcrypt runs 2^cost rounds
    users = "".join(f"  user{i}: $2b${cost:02d}${tail}\n" for i, cost in enumerate(costs))
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n{users}")
    config = load_web_config(str(web))
    held.real = lambda password, hashed_: False  # the cost is what is asserted, not the time
    assert not config.check_password("nobody", b"guess")
    assert not config.check_password(f"user{len(costs) - 1}", b"guess")
    assert [cost for _, cost in held.calls] == [dummy, dummy]


@pytest.mark.parametrize("value", ["$2b$03$" + "a" * 53, "$2b$32$" + "a" * 53,
                                   "$2b$1x$" + "a" * 53, "$2b$10$" + "a" * 52 + "!"])
def test_a_hash_of_no_bcrypt_cost_or_alphabet_is_refused_at_load(tmp_path, value):
    from podvm_gpu.metrics.webconfig import WebConfigError

    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{value}'\n")
    with pytest.raises(WebConfigError, match="basic_auth_users.prometheus: must be a bcrypt hash"):
        load_web_config(str(web))


# --- item 3 end to end: the flood, real bcrypt, the real exporter ------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_flood_of_wrong_passwords_does_not_shut_the_scraper_out(tmp_path, tls):
    """The issue: 24 clients looping with wrong passwords made 8 of 10 right scrapes get 503
    (over TLS, 11 of 12). Here 24 clients guess (real bcrypt, cost 10) from 127.0.0.1 while the
    scraper scrapes from 127.0.0.2: every one of its scrapes is answered 200."""
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed('right', 10)}\n")
    context = None
    if tls:
        cert, key = make_cert(tmp_path / "tls")
        web.write_text(web.read_text() + f"tls_server_config: {{cert_file: {cert}, "
                                         f"key_file: {key}}}\n")
        context = ssl.create_default_context(cafile=str(cert))
    served = start(tmp_path, metrics_env(None), "--web-config", str(web))
    exchange = functools.partial(exchange_over, context=context)
    stop = threading.Event()
    guessed: list[int] = []

    def guess(n: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                guessed.append(exchange(served.port, request("prometheus", f"{n}-{i}"))[0])
            except OSError:
                guessed.append(0)
            i += 1

    flood = [threading.Thread(target=guess, args=(n,)) for n in range(24)]
    try:
        for t in flood:
            t.start()
        time.sleep(0.5)
        right = [exchange(served.port, request("prometheus", "right"), "127.0.0.2")[0]
                 for _ in range(10)]
    finally:
        stop.set()
        for t in flood:
            t.join(WAIT_S * 2)
        err = served.stop()
    assert right == [200] * 10
    assert set(guessed) <= {401, 429}, sorted(set(guessed))
    assert 429 in guessed, "the guessing client was throttled"
    assert "Traceback" not in err


def test_users_of_different_costs_each_check_against_their_own_hash(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  a: {hashed('pa', 5)}\n  b: {hashed('pb', 4)}\n")
    config = load_web_config(str(web))
    assert config.check_password("a", b"pa") and config.check_password("b", b"pb")
    assert not config.check_password("b", b"pa") and not config.check_password("c", b"pa")
    assert config.dummy_hash.startswith(b"$2b$05$")


# --- issue 35 item 16: a web config that secures nothing, a cut hash, swapped PEM files ---------


@pytest.mark.parametrize("text, why", [
    ("", "the file is empty"),
    ("null\n", "the document is null or only comments"),
    ("# TLS comes later\n", "the document is null or only comments"),
    ("basic_auth_users: {}\n", "basic_auth_users: {}"),
    ("tls_server_config: null\n", "tls_server_config: null"),
    ("tls_server_config:\nbasic_auth_users: {}\n", "tls_server_config: null; basic_auth_users: {}"),
    ("http_server_config: {headers: {X-Frame-Options: deny}}\n",
     "it sets neither tls_server_config nor basic_auth_users"),
])
def test_a_web_config_that_secures_nothing_is_served_with_a_warning(tmp_path, text, why):
    """It served plain HTTP without authentication and without a word, as if it were secured."""
    web = tmp_path / "web.yml"
    web.write_text(text)
    assert load_web_config(str(web)).plain == why
    import os
    import select
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(tmp_path),
                             "--listen", "127.0.0.1:0", "--web-config", str(web)],
                            stderr=subprocess.PIPE, env=metrics_env(None))
    got = b""
    try:  # raw reads of its stderr until two lines came (or 20 s)
        deadline = time.monotonic() + 20
        while got.count(b"\n") < 2 and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    break
                got += chunk
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    err = got.decode()
    assert err.splitlines()[1:2] == [f"podvm-gpu metrics: warning: the web config {web} sets no "
                                     f"TLS and no basic auth ({why}): serving plain HTTP without "
                                     "authentication"], err


def test_a_web_config_with_auth_or_tls_has_no_plain_warning(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: '$2b$04$" + "a" * 53 + "'\n")
    assert load_web_config(str(web)).plain == ""


@pytest.mark.parametrize("value, what", [
    ("$2b$04$short", "this one is cut or damaged (12 characters)"),
    ("$2y$10$" + "a" * 52, "this one is cut or damaged (59 characters)"),
    ("hunter2", "not a password"),
])
def test_a_cut_bcrypt_hash_is_called_cut_not_a_password(tmp_path, value, what):
    from podvm_gpu.metrics.webconfig import WebConfigError

    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{value}'\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(str(web))
    assert str(err.value).endswith(what), err.value
    assert value not in str(err.value)


def test_swapped_cert_and_key_are_said_in_words(tmp_path):
    """It was OpenSSL's `[SSL] PEM lib (_ssl.c:3905)`."""
    from podvm_gpu.metrics.webconfig import WebConfigError

    cert, key = make_cert(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {key}\n  key_file: {cert}\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(str(web))
    assert str(err.value).endswith("cert_file and key_file are swapped (cert_file holds a private "
                                   "key, key_file a certificate)"), err.value
    (tmp_path / "empty.key").write_text("")
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {tmp_path / 'empty.key'}\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(str(web))
    assert "key_file holds no PEM private key" in str(err.value) and "PEM lib" not in str(err.value)
