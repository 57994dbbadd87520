"""Settings of the metrics exporter: the ``metrics:`` section of ``/etc/podvm-gpu/config.yaml``.

Plain Python (no pydantic): ``podvm-gpu metrics`` once must start fast, and the config loader
hands this module the section's mapping as YAML parsed it. Standard library only.
"""

from __future__ import annotations

import math

from podvm_gpu.errors import ConfigError

PROFILES = ("auto", "full", "cc-safe")
# dcgm-exporter's default port: scrape configs written for it find the pod VM's exporter too.
# Loopback by default: a pod VM's other interfaces face the cloud network (docs/metrics.md).
DEFAULT_LISTEN = "127.0.0.1:9400"
DEFAULT_TEXTFILE_PATH = "/run/podvm-gpu/metrics.prom"
MAX_SECONDS = 3600.0
# the textfile is read by node-exporter at each of its scrapes (15 s and more); rewriting it more
# often than every second only costs the VM (0.001 s wrote it, and its errors, 500 times a second)
MIN_TEXTFILE_INTERVAL_S = 1.0
# where a textfile must never go: CDI readers take every spec file there, the config is boot's
TEXTFILE_FORBIDDEN = tuple((folder, "a CDI spec folder (CDI readers load every file there)")
                           for folder in ("/etc/cdi", "/var/run/cdi", "/run/cdi")) + (
    ("/etc/podvm-gpu", "the agent's config folder"),)


class MetricsConfigError(ConfigError):
    """A value of the ``metrics:`` section is wrong.

    Attributes:
        key_path: the dotted key, e.g. ``metrics.listen``.
        message: what is wrong with it.
    The string form is ``<key_path>: <message>``; the config loader puts the file name in front.
    """

    def __init__(self, key_path: str, message: str):
        self.key_path = key_path
        self.message = message
        super().__init__(f"{key_path}: {message}")


def parse_listen(value: str, allow_any_port: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``; an IPv6 host is written in brackets (``[::1]:9400``).

    Args:
        value: the address; the host is an IP address (no names: nothing resolves at boot),
            ``0.0.0.0`` or ``[::]`` for every interface; the port is 1-65535.
        allow_any_port: also accept port 0 (the kernel picks a free one; tests).

    Raises:
        ValueError: the text is not of that shape.
    """
    import ipaddress  # only for an address set in the config or on the command line

    host, sep, port = value.rpartition(":")
    lowest = 0 if allow_any_port else 1
    # ASCII digits only: str.isdigit() takes "²" (int() then fails with Python's own words) and
    # Arabic-Indic digits, which int() reads, though no other tool takes such a port
    if not sep or not (port.isascii() and port.isdigit()) or not lowest <= int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT with a port {lowest}-65535")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    try:
        version = ipaddress.ip_address(host).version
    except ValueError as err:
        raise ValueError(f"{value!r}: the host must be an IP address ({err})") from err
    if bracketed and version != 6:
        raise ValueError(f"{value!r}: only an IPv6 address goes in brackets")
    if not bracketed and version != 4:
        raise ValueError(f"{value!r}: write an IPv6 address in brackets, [{host}]:{port}")
    return host, int(port)


class MetricsSettings:
    """What the exporter does; every value has a default.

    Attributes:
        profile: ``auto`` (``cc-safe`` when NVML reports the GPUs in confidential-computing
            mode, or cannot tell; ``full`` otherwise), ``full`` or ``cc-safe``.
        listen: ``HOST:PORT`` that ``serve`` listens on; ``""`` for no HTTP server.
        textfile: True: the boot writes :attr:`textfile_path` at its end and ``serve`` rewrites
            it every :attr:`textfile_interval_s` seconds (node-exporter's textfile collector).
        textfile_path: absolute path in the VM, default ``/run/podvm-gpu/metrics.prom``.
        textfile_interval_s: seconds between two textfile writes of ``serve``.
        nvml_timeout_s: the longest a scrape waits for NVML, seconds; an NVML call on a wedged
            GPU can block for minutes (field case C26), so a scrape answers without it then.
        web_config: absolute path in the VM of an exporter-toolkit web config (TLS, basic
            auth; ``webconfig.py``), read when serving starts; ``""``: plain HTTP, no auth.

    Raises:
        MetricsConfigError: a value has the wrong type or range (the key is named).
    """

    __slots__ = ("profile", "listen", "textfile", "textfile_path", "textfile_interval_s",
                 "nvml_timeout_s", "web_config", "reset_pending_warns")

    def __init__(self, profile: str = "auto", listen: str = DEFAULT_LISTEN, textfile: bool = False,
                 textfile_path: str = DEFAULT_TEXTFILE_PATH, textfile_interval_s: float = 30.0,
                 nvml_timeout_s: float = 5.0, web_config: str = ""):
        if profile not in PROFILES:
            raise MetricsConfigError("metrics.profile", f"must be one of {', '.join(PROFILES)}, "
                                                        f"not {profile!r}")
        if not isinstance(listen, str):
            raise MetricsConfigError("metrics.listen", "must be a string HOST:PORT")
        # the default is valid: every boot builds these settings, and need not import ipaddress
        if listen and listen != DEFAULT_LISTEN:
            try:
                parse_listen(listen)
            except ValueError as err:
                raise MetricsConfigError("metrics.listen", str(err)) from err
        if not isinstance(textfile, bool):
            raise MetricsConfigError("metrics.textfile", "must be true or false")
        if not isinstance(textfile_path, str) or not textfile_path.startswith("/") \
                or textfile_path.endswith("/"):
            raise MetricsConfigError("metrics.textfile_path", "must be an absolute file path")
        _no_nul("metrics.textfile_path", textfile_path)
        if textfile_path != DEFAULT_TEXTFILE_PATH:
            _check_textfile_path(textfile_path)
        if not isinstance(web_config, str) or web_config and (
                not web_config.startswith("/") or web_config.endswith("/")):
            raise MetricsConfigError("metrics.web_config", "must be an absolute file path, or "
                                                           "\"\" for none")
        _no_nul("metrics.web_config", web_config)
        self.profile = profile
        self.web_config = web_config
        self.listen = listen
        self.textfile = textfile
        self.textfile_path = textfile_path
        self.textfile_interval_s = _seconds("metrics.textfile_interval_s", textfile_interval_s,
                                            MIN_TEXTFILE_INTERVAL_S)
        self.nvml_timeout_s = _seconds("metrics.nvml_timeout_s", nvml_timeout_s)
        # not a key of metrics: the config's health.reset_pending_warns, set by the metrics
        # command, so that the exporter's podvm_gpu_health verdicts are boot's (issue 33)
        self.reset_pending_warns = False

    @classmethod
    def from_mapping(cls, section: object) -> MetricsSettings:
        """The settings from the ``metrics:`` mapping of the config file (None: all defaults).

        Raises:
            MetricsConfigError: the section is not a mapping, has an unknown key or a bad value.
        """
        if section is None:
            return cls()
        if not isinstance(section, dict):
            raise MetricsConfigError("metrics", "must be a mapping")
        for key in section:
            if key not in cls.__slots__:
                from podvm_gpu.config.fields import unknown_key

                raise MetricsConfigError(f"metrics.{key}", unknown_key(key, cls.__slots__))
        return cls(**section)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__ if k != "reset_pending_warns"}

    def __eq__(self, other: object) -> bool:  # as config.Section: settings are values
        return isinstance(other, MetricsSettings) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().items()))

    def __repr__(self) -> str:
        return f"MetricsSettings({self.to_dict()})"


def _check_textfile_path(path: str) -> None:
    """Refuse a textfile path that would overwrite the agent's own files.

    The textfile is written over whatever is at its path: ``/var/run/cdi/nvidia.yaml`` replaced
    the unavailable spec (kata-agent lost its fast failure), ``/run/podvm-gpu/status.json`` broke
    ``status``, ``/etc/podvm-gpu/config.yaml`` the config. The rule is the reader's: node-exporter's
    textfile collector reads only the files of its folder named ``*.prom`` (collector/textfile.go),
    so nothing else is a textfile; and none goes under a CDI spec folder or the agent's config
    folder, whatever its name.
    """
    import posixpath

    name = posixpath.basename(path)
    if not name.endswith(".prom") or name == ".prom":
        raise MetricsConfigError("metrics.textfile_path", f"{path!r}: must be a file named "
                                 "NAME.prom: node-exporter's textfile collector reads only those "
                                 "(and any other name may be one of the agent's own files)")
    forbidden = forbidden_folder(path)
    if forbidden:
        raise MetricsConfigError("metrics.textfile_path", f"{path!r}: not under {forbidden[0]}: "
                                                          f"{forbidden[1]}")


def forbidden_folder(path: str) -> tuple[str, str] | None:
    """The folder of :data:`TEXTFILE_FORBIDDEN` an absolute VM path lies under, and why no
    textfile goes there; None when it lies under none. The config's text is checked with it
    when loaded, and the path its folders' links lead to when the textfile is written
    (metrics/command.py: a link in the path must not lead under these, issue 35 item 17)."""
    import posixpath

    normal = posixpath.normpath(path)
    return next(((folder, what) for folder, what in TEXTFILE_FORBIDDEN
                 if normal.startswith(folder + "/")), None)


def _no_nul(key: str, path: str) -> None:
    """Refuse a NUL in a path: no file name holds one, and every system call that takes the path
    fails on it (Python raises ValueError, which nothing on the way expects)."""
    if "\0" in path:
        raise MetricsConfigError(key, "holds a NUL character: no file name can")


def _seconds(key: str, value: object, at_least: float | None = None) -> float:
    # YAML's true would otherwise read as 1 second
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MetricsConfigError(key, "must be a number of seconds")
    # the range first: math.isfinite of a 310-digit int raises OverflowError (nan fails it too)
    if not 0 < value <= MAX_SECONDS or not math.isfinite(value):
        raise MetricsConfigError(key, f"must be more than 0 and at most {MAX_SECONDS:g} s")
    if at_least is not None and value < at_least:
        raise MetricsConfigError(key, f"must be at least {at_least:g} s (and at most "
                                      f"{MAX_SECONDS:g} s)")
    return float(value)
