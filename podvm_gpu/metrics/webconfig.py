"""The exporter's web config: TLS and basic auth from a file in the Prometheus exporter-toolkit
format (the file node_exporter's ``--web.config.file`` reads; ``docs/interface.md`` section 10).

What is implemented::

    tls_server_config:
      cert_file: server.crt        # PEM; relative paths are relative to the file's directory
      key_file: server.key
      client_auth_type: NoClientCert   # or VerifyClientCertIfGiven, RequireAndVerifyClientCert
      client_ca_file: ca.crt       # needed by the two Verify types
      min_version: TLS12           # TLS12 or TLS13 (exporter-toolkit's default: TLS12)
      max_version: TLS13
    http_server_config:
      http2: false                 # only false: the server speaks HTTP/1.1
      headers: {X-Frame-Options: deny}
    basic_auth_users:
      prometheus: $2b$10$...       # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

Every other key (``cipher_suites``, ``curve_preferences``, ``client_allowed_sans``, ``cert``,
...) is refused by name: a setting the server would silently ignore is a security hole. bcrypt
is imported by :meth:`WebConfig.check_password` only, on the serving path.
"""

from __future__ import annotations

import os

from podvm_gpu.errors import ConfigError

MAX_FILE_BYTES = 1024 * 1024
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version", "prefer_server_cipher_suites")
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
_CLIENT_AUTH = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_VERSIONS = ("TLS12", "TLS13")
# exporter-toolkit refuses these response headers too (they belong to the server)
_RESERVED_HEADERS = ("content-type", "content-length", "content-encoding", "www-authenticate",
                     "connection", "date", "server", "transfer-encoding")
_AUTH_CACHE_MAX = 64


class WebConfigError(ConfigError):
    """The web config file cannot be read, is not YAML, or has a bad or unimplemented key.

    The string form is ``<file>: <key path>: <what is wrong>``.
    """


class WebConfig:
    """A loaded web config.

    Attributes:
        path: the file, as given.
        ssl_context: an ``ssl.SSLContext`` (server side) when ``tls_server_config`` is set,
            else None.
        users: user name -> bcrypt hash (bytes); empty for no authentication.
        headers: extra response headers, name -> value.
    """

    def __init__(self, path: str, ssl_context=None, users: dict | None = None,
                 headers: dict | None = None):
        self.path = path
        self.ssl_context = ssl_context
        self.users = users or {}
        self.headers = headers or {}
        self._checked: dict[tuple[str, bytes], bool] = {}

    def check_password(self, user: str, password: bytes) -> bool:
        """True when ``user`` is configured and ``password`` matches its bcrypt hash.

        A result is cached by user and the password's SHA-256 (a bcrypt check costs tens of
        milliseconds and Prometheus sends the same pair every scrape), at most 64 entries.

        Raises:
            ImportError: the ``bcrypt`` package is not installed (checked when serving starts).
        """
        import hashlib

        import bcrypt

        hashed = self.users.get(user)
        if hashed is None:
            bcrypt.checkpw(b"x", _DUMMY_HASH)  # the same time as for a known user
            return False
        key = (user, hashlib.sha256(password).digest())
        known = self._checked.get(key)
        if known is None:
            try:
                known = bcrypt.checkpw(password, hashed)
            except ValueError:
                known = False
            if len(self._checked) >= _AUTH_CACHE_MAX:
                self._checked.clear()
            self._checked[key] = known
        return known


# bcrypt of "x" with cost 10: a check against it costs what a real user's check costs
_DUMMY_HASH = b"$2b$10$eZ7e3j1QKOW62CxnadrSZukCRCTnMh45UngIUkHU0qnVT1OADxBIC"


def load_web_config(path: str) -> WebConfig:
    """Read and check the web config at ``path`` (a real path on this machine).

    Loads the certificate and key into an SSL context and checks every bcrypt hash's form, so a
    bad file is refused when serving starts, never at the first scrape.

    Raises:
        WebConfigError: unreadable (or over 1 MiB), not YAML, not a mapping, an unknown or
            unimplemented key, a bad value, a certificate or key that does not load, or
            ``basic_auth_users`` without the ``bcrypt`` package installed.
    """
    import yaml

    from podvm_gpu.host.fs import read_bounded

    try:
        # links followed here (a mounted secret is one), then read as every file the agent
        # reads: regular files only, without blocking (a FIFO hung the server's start)
        data = read_bounded(os.path.realpath(path), MAX_FILE_BYTES)
    except OSError as err:
        raise WebConfigError(f"{path}: cannot read the web config: {err.strerror or err}") from err
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as err:
        raise WebConfigError(f"{path}: not YAML: {' '.join(str(err).split())}") from err
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise WebConfigError(f"{path}: must be a mapping of {', '.join(_TOP_KEYS)}")

    def bad(key: str, what: str) -> WebConfigError:
        return WebConfigError(f"{path}: {key}: {what}")

    for key in doc:
        if key not in _TOP_KEYS:
            raise bad(str(key), f"not implemented by this server (it implements "
                                f"{', '.join(_TOP_KEYS)})")
    base = os.path.dirname(os.path.abspath(path))
    tls = _section(doc, "tls_server_config", bad)
    context = _ssl_context(tls, base, bad) if tls is not None else None
    http = _section(doc, "http_server_config", bad) or {}
    headers = {}
    for key, value in http.items():
        if key == "http2":
            if value is not False:
                raise bad("http_server_config.http2", "HTTP/2 is not implemented: set it to "
                                                      "false or leave it out")
        elif key == "headers":
            headers = _headers(value, bad)
        else:
            raise bad(f"http_server_config.{key}", "not implemented by this server")
    users = {}
    raw_users = _section(doc, "basic_auth_users", bad) or {}
    for user, hashed in raw_users.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise bad("basic_auth_users", f"{user!r} is not a user name (no colon, not empty)")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) \
                or len(hashed) != 60:
            raise bad(f"basic_auth_users.{user}", "must be a bcrypt hash ($2y$10$..., 60 "
                                                   "characters), not a password")
        users[user] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401 (refused now, not at the first scrape)
        except ImportError as err:
            raise bad("basic_auth_users", "needs the Python package bcrypt, which is not "
                                          f"installed ({err})") from err
    return WebConfig(path, context, users, headers)


def _section(doc: dict, key: str, bad):
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad(key, "must be a mapping")
    return value


def _headers(value, bad) -> dict:
    if not isinstance(value, dict):
        raise bad("http_server_config.headers", "must be a mapping of header names to values")
    out = {}
    for name, text in value.items():
        if not isinstance(name, str) or not name or any(c in name for c in " :\r\n\t"):
            raise bad("http_server_config.headers", f"{name!r} is not a header name")
        if name.lower() in _RESERVED_HEADERS:
            raise bad(f"http_server_config.headers.{name}", "is set by the server itself")
        if not isinstance(text, str) or "\r" in text or "\n" in text:
            raise bad(f"http_server_config.headers.{name}", "must be a one-line string")
        out[name] = text
    return out


def _ssl_context(tls: dict, base: str, bad):
    import ssl

    for key in tls:
        if key not in _TLS_KEYS:
            raise bad(f"tls_server_config.{key}", f"not implemented by this server (it "
                                                  f"implements {', '.join(_TLS_KEYS)})")

    def file_of(key: str) -> str:
        value = tls.get(key)
        if not isinstance(value, str) or not value:
            raise bad(f"tls_server_config.{key}", "must be a file path")
        return value if os.path.isabs(value) else os.path.join(base, value)

    cert, key = _regular(file_of("cert_file"), "cert_file", bad), \
        _regular(file_of("key_file"), "key_file", bad)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _versions(context, tls, bad)
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise bad("tls_server_config.prefer_server_cipher_suites", "must be true or false")
    if prefer:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise bad("tls_server_config", f"cannot load the certificate {cert} with the key {key}: "
                                       f"{err.strerror if isinstance(err, OSError) and err.strerror else err}"
                  ) from err
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise bad("tls_server_config.client_auth_type", f"must be one of "
                  f"{', '.join(_CLIENT_AUTH)} (others are not implemented), not {auth!r}")
    if auth != "NoClientCert":
        ca = _regular(file_of("client_ca_file"), "client_ca_file", bad)
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as err:
            raise bad("tls_server_config.client_ca_file", f"cannot load {ca}: {err}") from err
        context.verify_mode = ssl.CERT_REQUIRED if auth == "RequireAndVerifyClientCert" \
            else ssl.CERT_OPTIONAL
    elif "client_ca_file" in tls:
        raise bad("tls_server_config.client_ca_file", "is used only with a client_auth_type "
                                                      "that verifies client certificates")
    return context


# exporter-toolkit's names; its default minimum is TLS12, its maximum the newest there is
_TLS_NAMES = {"TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
# TLS 1.0 and 1.1 are deprecated (RFC 8996), and OpenSSL 3 speaks them only below security level
# 1: a server a confidential VM exposes refuses to offer them rather than lower its level
_DEPRECATED = ("TLS10", "TLS11")


def _versions(context, tls: dict, bad) -> None:
    """``tls_server_config.min_version``/``max_version`` onto the context's
    ``minimum_version``/``maximum_version`` (``ssl.SSLContext`` has no ``min_version``: setting
    that name did nothing, and ``min_version: TLS13`` still spoke TLS 1.2). ``TLS10`` and
    ``TLS11`` are exporter-toolkit's names too, refused by name here (RFC 8996)."""
    import ssl

    chosen = {}
    for option, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = tls.get(option, default)
        if value in _DEPRECATED:
            raise bad(f"tls_server_config.{option}", f"{value} is not implemented: TLS 1.0 and "
                                                     "1.1 are deprecated (RFC 8996); this "
                                                     "server speaks TLS12 and TLS13")
        if not isinstance(value, str) or value not in _TLS_NAMES:
            raise bad(f"tls_server_config.{option}", f"must be one of {', '.join(_VERSIONS)}, "
                                                     f"not {value!r}")
        chosen[option] = value
    low, high = chosen["min_version"], chosen["max_version"]
    if _VERSIONS.index(low) > _VERSIONS.index(high):
        raise bad("tls_server_config.min_version", f"{low} is above tls_server_config."
                                                   f"max_version {high}: no version is left")
    for option, attribute in (("min_version", "minimum_version"),
                              ("max_version", "maximum_version")):
        value = chosen[option]
        try:
            setattr(context, attribute, getattr(ssl.TLSVersion, _TLS_NAMES[value]))
        except (ValueError, ssl.SSLError) as err:
            raise bad(f"tls_server_config.{option}", f"{value} is refused by this Python's "
                                                     f"OpenSSL: {err}") from err


def _regular(path: str, key: str, bad) -> str:
    """``path`` when it is a regular file (links followed) or missing (the load then says so);
    ssl opens these files by their path itself, so a FIFO there would block the server's start
    for ever: it is refused by name first."""
    import stat

    try:
        info = os.stat(path)
    except OSError:
        return path
    if not stat.S_ISREG(info.st_mode):
        raise bad(f"tls_server_config.{key}", f"{path}: not a regular file")
    return path
