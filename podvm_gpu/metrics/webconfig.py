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
...) is refused by name: a setting the server would silently ignore is a security hole. The
YAML is read as the agent's config is (``config.load.parse_yaml``: a key given twice, nesting
too deep, a message that never quotes the file's text). bcrypt is imported by
:meth:`WebConfig.check_password` only, on the serving path.
"""

from __future__ import annotations

import collections
import os
import re
import threading

from podvm_gpu.errors import ConfigError
from podvm_gpu.model import shown

MAX_FILE_BYTES = 1024 * 1024
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
             "max_version", "prefer_server_cipher_suites")
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
_CLIENT_AUTH = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_VERSIONS = ("TLS12", "TLS13")
# exporter-toolkit refuses these response headers too (they belong to the server)
_RESERVED_HEADERS = ("content-type", "content-length", "content-encoding", "www-authenticate",
                     "connection", "date", "server", "transfer-encoding")
# RFC 9110 section 5.6.2: a field name is a token; section 5.5: a value is visible characters,
# spaces and tabs (the server writes its head in ASCII: other text broke every answer)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE = re.compile(r"[\x20-\x7e\t]*")
# bcrypt's modular crypt form: $2a$, $2b$ or $2y$, a cost of 04-31, 53 characters of its base 64
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_BCRYPT_START = re.compile(r"\$2[aby]?\$\d\d\$")
_GOOD_PAIRS_MAX = 64  # right passwords only: a guess can never take a place here
_BAD_PAIRS_MAX = 4096  # wrong pairs, answered without bcrypt when sent again


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
        dummy_hash: the hash an unknown user's password is checked against: bcrypt of the
            highest cost among :attr:`users`' hashes, so a name nobody has costs what a
            configured name costs (an unknown user answered sooner tells the name is unknown).
        plain: why this file leaves the server plain HTTP without authentication (an empty
            file, ``null``, ``basic_auth_users: {}``, ``tls_server_config: null``, ...), for the
            warning the server prints; empty when it sets TLS or basic auth.
    """

    def __init__(self, path: str, ssl_context=None, users: dict | None = None,
                 headers: dict | None = None, plain: str = ""):
        self.path = path
        self.plain = plain
        self.ssl_context = ssl_context
        self.users = users or {}
        self.headers = headers or {}
        cost = max((int(hashed[4:6]) for hashed in self.users.values()), default=10)
        self.dummy_hash = b"$2b$%02d$" % cost + _DUMMY_HASH[7:]
        self._lock = threading.Lock()
        self._good: set[bytes] = set()
        self._bad: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def cached(self, user: str, password: bytes) -> bool | None:
        """What an earlier check of this pair found: True right, False wrong; None when it was
        not checked (or forgotten). Costs a SHA-256, no bcrypt: the server answers a known pair
        without a worker."""
        key = _pair(user, password)
        with self._lock:
            if key in self._good:
                return True
            if key in self._bad:
                self._bad.move_to_end(key)
                return False
        return None

    def check_password(self, user: str, password: bytes) -> bool:
        """True when ``user`` is configured and ``password`` matches its bcrypt hash.

        Every pair not checked before costs one bcrypt check of the configured cost, known user
        or not (:attr:`dummy_hash`); its result is kept by user and the password's SHA-256
        (Prometheus sends the same pair every scrape): the right pairs apart from the wrong
        ones, so no number of wrong guesses pushes a right pair out (at most 64 right and 4096
        wrong pairs, the oldest wrong one forgotten first; 32 bytes each, however long the
        name).

        Raises:
            ImportError: the ``bcrypt`` package is not installed (checked when serving starts).
        """
        import bcrypt

        known = self.cached(user, password)
        if known is not None:
            return known
        hashed = self.users.get(user)
        try:
            right = bcrypt.checkpw(password, hashed if hashed is not None else self.dummy_hash)
        except ValueError:
            right = False
        right = right and hashed is not None
        key = _pair(user, password)
        with self._lock:
            if right:
                if len(self._good) >= _GOOD_PAIRS_MAX:
                    self._good.clear()
                self._good.add(key)
            else:
                self._bad[key] = None
                if len(self._bad) > _BAD_PAIRS_MAX:
                    self._bad.popitem(last=False)
        return right


def _pair(user: str, password: bytes) -> bytes:
    """The SHA-256 of ``user:password`` (a user name has no colon: ``server.basic_auth`` splits
    at the first one, so no two pairs give the same text)."""
    import hashlib

    return hashlib.sha256(user.encode("utf-8", "surrogatepass") + b":" + password).digest()


# bcrypt of "x" (cost 10); WebConfig.dummy_hash puts the configured cost in its place: bcrypt
# runs 2^cost rounds whatever the salt and hash after it
_DUMMY_HASH = b"$2b$10$eZ7e3j1QKOW62CxnadrSZukCRCTnMh45UngIUkHU0qnVT1OADxBIC"


def load_web_config(path: str) -> WebConfig:
    """Read and check the web config at ``path`` (a real path on this machine).

    Loads the certificate and key into an SSL context and checks every bcrypt hash's form, so a
    bad file is refused when serving starts, never at the first scrape.

    Raises:
        WebConfigError: unreadable (or over 1 MiB), not UTF-8, not YAML (a key given twice,
            nested too deeply), not a mapping, an unknown or unimplemented key, a bad value, a
            certificate or key that does not load (an encrypted key: said so), or
            ``basic_auth_users`` without the ``bcrypt`` package installed.
    """
    doc, empty = _read_doc(path)
    if not isinstance(doc, dict):
        raise WebConfigError(f"{path}: must be a mapping of {', '.join(_TOP_KEYS)}")

    def bad(key: str, what: str) -> WebConfigError:
        # a key is the file's words: a newline or ESC in it is shown escaped, never raw
        return WebConfigError(f"{path}: {shown(key)}: {what}")

    for key in doc:
        if key not in _TOP_KEYS:
            raise bad(str(key), f"not implemented by this server (it implements "
                                f"{', '.join(_TOP_KEYS)})")
    base = os.path.dirname(os.path.abspath(path))
    tls = _section(doc, "tls_server_config", bad)
    context = _ssl_context(tls, base, bad) if tls is not None else None
    headers = _http_headers(_section(doc, "http_server_config", bad) or {}, bad)
    users = _users(_section(doc, "basic_auth_users", bad) or {}, bad)
    plain = ""
    if context is None and not users:
        given = [f"{key}: {'{}' if doc[key] == {} else 'null'}" for key in
                 ("tls_server_config", "basic_auth_users") if key in doc]
        plain = empty or ("; ".join(given) if given else
                          "it sets neither tls_server_config nor basic_auth_users")
    return WebConfig(path, context, users, headers, plain)


def _read_doc(path: str) -> tuple:
    """The web config's YAML document (None read as ``{}``) and, for an empty file or a null
    document, the words that say so ("" otherwise).

    Raises:
        WebConfigError: unreadable (or over 1 MiB), not UTF-8, not YAML.
    """
    from podvm_gpu.config.load import parse_yaml
    from podvm_gpu.host.fs import read_bounded

    try:
        # links followed here (a mounted secret is one), then read as every file the agent
        # reads: regular files only, without blocking (a FIFO hung the server's start)
        data = read_bounded(os.path.realpath(path), MAX_FILE_BYTES)
    except (OSError, ValueError) as err:  # ValueError: a NUL in the name
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        where = path.replace("\0", "\\x00")
        raise WebConfigError(f"{where}: cannot read the web config: {why}") from err
    try:
        doc = parse_yaml(data.decode("utf-8"), path)
    except UnicodeDecodeError as err:
        raise WebConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") \
            from None
    except ConfigError as err:
        raise WebConfigError(str(err)) from None
    empty = "the file is empty" if not data.strip() else "the document is null or only " \
        "comments" if doc is None else ""
    return ({} if doc is None else doc), empty


def _http_headers(http: dict, bad) -> dict:
    """``http_server_config``'s response headers; ``http2: false`` is accepted, every other
    key is refused through ``bad(key, what)`` (an error to raise)."""
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
    return headers


def _users(raw_users: dict, bad) -> dict:
    """``basic_auth_users`` as user name to bcrypt hash (bytes), each hash's form checked and
    the bcrypt package required when there is a user; refusals through ``bad(key, what)``."""
    users = {}
    for user, hashed in raw_users.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise bad("basic_auth_users", f"{user!r} is not a user name (no colon, not empty)")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            # a value that starts as a hash does is a damaged or cut hash, not a password
            # (issue 35 item 16); the value itself is never echoed: it may be a password
            what = f"this one is cut or damaged ({len(hashed)} characters)" \
                if isinstance(hashed, str) and _BCRYPT_START.match(hashed) else "not a password"
            raise bad(f"basic_auth_users.{user}", "must be a bcrypt hash ($2y$10$..., 60 "
                                                   "characters: $2a$, $2b$ or $2y$, a cost of 04 "
                                                   f"to 31, $ and 53 of ./A-Za-z0-9), {what}")
        users[user] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401 (refused now, not at the first scrape)
        except ImportError as err:
            raise bad("basic_auth_users", "needs the Python package bcrypt, which is not "
                                          f"installed ({err})") from err
    return users


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
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise bad("http_server_config.headers", f"{name!r} is not a header name (letters, "
                                                    "digits and !#$%&'*+.^_`|~- only: RFC 9110 "
                                                    "section 5.6.2)")
        if name.lower() in _RESERVED_HEADERS:
            raise bad(f"http_server_config.headers.{name}", "is set by the server itself")
        if not isinstance(text, str) or not _FIELD_VALUE.fullmatch(text):
            raise bad(f"http_server_config.headers.{name}", "must be one line of printable "
                                                            "ASCII (no control characters, no "
                                                            "NUL, no other text): RFC 9110 "
                                                            "section 5.5")
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
        if not isinstance(value, str) or not value or "\0" in value:  # no file name has a NUL
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
        # OpenSSL asks for the pass phrase of an encrypted key on the terminal (or fails with
        # EINVAL without one): a server has nobody to ask, so the question is refused
        context.load_cert_chain(cert, key, password=_no_pass_phrase)
    except _Encrypted:
        raise bad("tls_server_config.key_file", f"{key}: the key is encrypted (it needs a pass "
                                                "phrase, which a server cannot be asked for): "
                                                "give the key unencrypted, readable by the "
                                                "exporter only") from None
    except (OSError, ssl.SSLError) as err:
        said = err.strerror if isinstance(err, OSError) and err.strerror else err
        why = _pem_problem(cert, key) if isinstance(err, ssl.SSLError) else None
        raise bad("tls_server_config", f"cannot load the certificate {cert} with the key {key}: "
                                       f"{why or said}") from err
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


def _pem_problem(cert: str, key: str) -> str | None:
    """What OpenSSL's ``[SSL] PEM lib`` means for these two files, in words: a file without the
    PEM block it should hold, and whether it holds the other's (cert_file and key_file swapped,
    issue 35 item 16); None when both have their block (the error is then OpenSSL's own). Only
    the PEM headers are looked at; nothing of the files is said."""
    def blocks(path: str) -> tuple[bool, bool]:
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_FILE_BYTES)
        except OSError:
            return False, False
        return b"-----BEGIN CERTIFICATE-----" in text, \
            re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----", text) is not None

    cert_has_cert, cert_has_key = blocks(cert)
    key_has_cert, key_has_key = blocks(key)
    if not cert_has_cert and cert_has_key and key_has_cert and not key_has_key:
        return "cert_file and key_file are swapped (cert_file holds a private key, key_file a " \
            "certificate)"
    problems = []
    if not cert_has_cert:
        problems.append("cert_file holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
                        + (", only a private key" if cert_has_key else ""))
    if not key_has_key:
        problems.append("key_file holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)"
                        + (", only a certificate" if key_has_cert else ""))
    return "; ".join(problems) or None


class _Encrypted(Exception):
    """OpenSSL asked for a pass phrase: the key file is encrypted."""


def _no_pass_phrase():
    raise _Encrypted


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
