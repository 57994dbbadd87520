"""The exporter's web config: TLS and basic auth from a file in the Prometheus exporter-toolkit
format (the file node_exporter's ``--web.config.file`` reads; ``docs/interface.md`` section 10).

What is implemented::

    tls_server_config:
      cert_file: server.crt        # PEM; relative paths are relative to the file's directory
      key_file: server.key
      client_auth_type: NoClientCert   # or VerifyClientCertIfGiven, RequireAndVerifyClientCert
      client_ca_file: ca.crt       # needed by the two Verify types
      min_version: TLS12           # TLS10 .. TLS13 (exporter-toolkit's default: TLS12)
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
_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")
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

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise WebConfigError(f"{path}: cannot read the web config: {err.strerror or err}") from err
    if len(data) > MAX_FILE_BYTES:
        raise WebConfigError(f"{path}: over {MAX_FILE_BYTES} bytes: not a web config")
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

    cert, key = file_of("cert_file"), file_of("key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
    for option, default in (("min_version", "TLS12"), ("max_version", None)):
        value = tls.get(option, default)
        if value is None:
            continue
        if value not in versions:
            raise bad(f"tls_server_config.{option}", f"must be one of {', '.join(_VERSIONS)}, "
                                                     f"not {value!r}")
        try:
            setattr(context, option, versions[value])
        except (ValueError, ssl.SSLError) as err:
            raise bad(f"tls_server_config.{option}", f"{value} is refused by this Python's "
                                                     f"OpenSSL: {err}") from err
    if context.maximum_version != ssl.TLSVersion.MAXIMUM_SUPPORTED \
            and context.maximum_version < context.minimum_version:
        raise bad("tls_server_config.max_version", "is below min_version")
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
        ca = file_of("client_ca_file")
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
