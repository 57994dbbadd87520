"""kata-agent's CDI wait as kata-agent itself works it out, for ``check``.

What a GPU request meets on a VM whose spec is the unavailable one (no GPU, or a failed boot)
depends on two facts about the image's kata-agent, read here the way kata-agent reads them
(kata-containers ``src/agent/src/config.rs``, ``main.rs`` and ``device/mod.rs``, main of
2026-08):

- Where its settings come from. Started with ``--config FILE`` or ``-c FILE`` (exactly those
  tokens, then the path: peer pods' ``kata-agent.service`` runs ``kata-agent --config
  /etc/agent-config.toml``), every setting comes from FILE and the kernel command line is not
  read. Otherwise the kernel command line: ``agent.config_file=FILE`` switches to FILE (the
  words after it are not read); else ``agent.cdi_timeout=N``, N whole seconds (0 keeps the
  default; the last one wins; a non-number stops kata-agent at start).
- ``cdi_timeout`` in FILE is a Rust ``std::time::Duration`` read by serde: a table
  ``{ secs = N, nanos = M }`` or an array ``[N, M]``, both fields required. A plain integer
  (``cdi_timeout = 100``) is refused, and with it the whole file: kata-agent does not start.
  Measured with serde 1.0.152 and toml 0.5.11 (tests/data/kata-agent/duration_probe.*); kata-agent
  links toml 1.x, which hands serde the same value types.
- The default is 100 s. kata-agent 3.32.0 and later fail a request at once when the requested
  device's kind is in ``/var/run/cdi`` but lacks the device (the unavailable spec's case); older
  ones retry every injection error once a second for ``cdi_timeout`` seconds, and then fail
  without podvm-gpu's reason.
"""

from __future__ import annotations

import re

from podvm_gpu.host.fs import Root
from podvm_gpu.record import REQUIRED, Record

DEFAULT_CDI_TIMEOUT_S = 100.0
FAILS_AT_ONCE_FROM = (3, 32, 0)  # kata-agent's first release that fails at once (2026-06)


class CdiWait(Record):
    """kata-agent's ``cdi_timeout``: ``seconds`` (None where it cannot be known, e.g. the kernel
    command line of an image), ``source`` (where it was read, for a detail line), ``error``
    (why kata-agent would refuse to start with these settings; empty when it starts) and
    ``written`` (the TOML value of a ``cdi_timeout`` kata-agent refuses, for the hint; else None)."""

    FIELDS = (("seconds", REQUIRED), ("source", REQUIRED), ("error", ""), ("written", None))


def config_file_argument(argv: list[str]) -> str | None:
    """The FILE of ``--config FILE`` / ``-c FILE`` in kata-agent's argv, as kata-agent finds it
    (the first such token followed by a value; ``--config=FILE`` is not that form)."""
    for i, arg in enumerate(argv[1:], 1):
        if arg in ("--config", "-c"):
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def ignored_config_arguments(argv: list[str]) -> list[str]:
    """The tokens of kata-agent's argv that look like a config file argument but that kata-agent
    does not read as one: ``--config=FILE`` (it takes ``--config FILE`` or ``-c FILE`` only,
    module docstring), in order. A unit written with ``=`` leaves kata-agent on the kernel
    command line's settings."""
    return [arg for arg in argv[1:] if arg.startswith("--config=")]


def cdi_wait(root: Root, argv: list[str] | None, cmdline: str | None) -> CdiWait:
    """kata-agent's ``cdi_timeout`` for the argv it is started with.

    Args:
        root: the VM's or image's root; the config file is read under it.
        argv: kata-agent's ``ExecStart`` argv, or None when unknown.
        cmdline: the kernel command line (``/proc/cmdline`` of the VM), or None where there is
            none to read (an image).
    """
    config = config_file_argument(argv or [])
    if config is not None:
        return _from_file(root, config, f"{config} (kata-agent --config)")
    if cmdline is None:
        return CdiWait(None, "the VM's kernel command line (agent.cdi_timeout=, default "
                       f"{DEFAULT_CDI_TIMEOUT_S:g} s; not in an image)")
    seconds, source = DEFAULT_CDI_TIMEOUT_S, "default; the kernel command line sets none"
    for word in cmdline.split():
        if word.startswith("agent.config_file="):
            path = word.split("=", 1)[1]
            return _from_file(root, path, f"{path} (agent.config_file= on the kernel command line)")
        if word.startswith("agent.cdi_timeout="):
            value = word.split("=", 1)[1]
            if not re.fullmatch(r"\d+", value):
                return CdiWait(None, "the kernel command line",
                               f"agent.cdi_timeout={value} is not a whole number of seconds")
            if int(value) > 0:
                seconds, source = float(value), "agent.cdi_timeout= on the kernel command line"
    return CdiWait(seconds, source)


def _from_file(root: Root, path: str, source: str) -> CdiWait:
    import tomllib  # only for an image with kata-agent's config file

    text, why = root.read_or_why(path)
    if text is None:
        return CdiWait(None, source, f"it cannot read its config: {why}")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        return CdiWait(None, source, f"{path} is not TOML: {err}")
    if "cdi_timeout" not in doc:
        return CdiWait(DEFAULT_CDI_TIMEOUT_S, f"default; {path} sets none")
    seconds = duration_s(doc["cdi_timeout"])
    if seconds is None:
        value = doc["cdi_timeout"]
        shown = f"{value!r}" if not isinstance(value, int) else str(value)
        return CdiWait(None, source, f"cdi_timeout = {shown} in {path} is not a Duration: "
                       "kata-agent reads it as { secs = N, nanos = 0 } and refuses the file", value)
    return CdiWait(seconds, source)


TOML_INT_MAX = 2**63 - 1  # TOML integers are 64-bit signed (toml.io, v1.0.0 "Integer")
U32_MAX = 2**32 - 1


def duration_s(value) -> float | None:
    """Seconds of a TOML value as serde reads a ``std::time::Duration`` (module docstring):
    ``{secs, nanos}`` with exactly those keys, or ``[secs, nanos]``; None for anything else."""
    if isinstance(value, dict) and set(value) == {"secs", "nanos"}:
        secs, nanos = value["secs"], value["nanos"]
    elif isinstance(value, list) and len(value) == 2:
        secs, nanos = value
    else:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (secs, nanos)):
        return None  # serde wants unsigned integers (u64 seconds, u32 nanoseconds)
    if secs > TOML_INT_MAX or nanos > U32_MAX:
        return None  # the toml crate refuses integers over i64; serde's nanos field is a u32
    return secs + nanos / 1e9


def version(text: str) -> tuple[int, int, int] | None:
    """kata-agent's version from ``kata-agent --version`` (``kata-agent version 3.32.0 (api
    version: ...)``), or None."""
    m = re.search(r"\bversion (\d+)\.(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
