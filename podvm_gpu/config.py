"""The optional config file ``/etc/podvm-gpu/config.yaml`` (contract section 7).

Every key has a default; unknown keys are errors that name the key. The keys ``budget_s``,
``timeouts``, ``persistenced``, ``confidential_computing`` and ``unavailable_spec`` are fixed by
the contract (the field cases use them); the rest are this project's.

The validator is a small table of fields rather than a pydantic model: every CPU pod VM whose
image ships a config file validates it at boot, before kata-agent starts, and importing pydantic
and building the models cost about 100 ms and 180 ms here (``python -c pass`` is 13-16 ms; see
bench/run.py). Only the standard library is imported at the top; PyYAML when a file is read.
Values are taken strictly: a boolean is not a number, a string is not a number, a number is not
a boolean (YAML's ``true`` would otherwise read as 1 second, ``"30"`` as 30).
"""

from __future__ import annotations

import math
import os
import stat

from podvm_gpu.errors import ConfigError, one_line
from podvm_gpu.host.fs import folder_trust_problems

MAX_CONFIG_BYTES = 1 << 20
MAX_SECONDS = 3600.0  # no wait or budget in a pod VM boot is longer than an hour
MAX_GPUS = 64  # far above any VM size sold (8 GPUs, 16 at most), still a bound
# The external tools of contract section 1 (and the ones this project added); config keys that
# name a tool must be one of them.
TOOLS = ("modprobe", "nvidia-ctk", "nvidia-persistenced", "nvidia-smi", "nv-fabricmanager",
         "nvidia-modprobe", "systemctl", "ldconfig", "modinfo", "systemd-run", "journalctl")
MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset")
OPTIONAL_MODULES = ("nvidia_modeset",)  # loaded after the required ones, may fail (modules.py)


class _Invalid(Exception):
    """One bad value: ``loc`` is the key path (``["persistenced", "per_gpu_s"]``)."""

    def __init__(self, loc: list, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message


def _kind(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping", type(None): "empty"}.get(type(value),
                                                                        type(value).__name__)


def seconds(minimum: float, inclusive: bool):
    """A validator of a number of seconds in ``minimum`` (exclusive unless ``inclusive``) to
    ``MAX_SECONDS``; returns it as a float."""
    bound = f"at least {minimum:g}" if inclusive else f"greater than {minimum:g}"

    def check(value: object, loc: list) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Invalid(loc, f"must be a number of seconds, not {_kind(value)}"
                           + _numeric_text(value))
        if not math.isfinite(value):
            raise _Invalid(loc, "must be a finite number of seconds")
        if value < minimum or (value == minimum and not inclusive) or value > MAX_SECONDS:
            raise _Invalid(loc, f"must be {bound} and at most {MAX_SECONDS:g} s, not {value!r}")
        return float(value)

    return check


def count(maximum: int):
    """A validator of a whole number from 0 to ``maximum``."""
    def check(value: object, loc: list) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(loc, f"must be a whole number, not {_kind(value)}")
        if not 0 <= value <= maximum:
            raise _Invalid(loc, f"must be from 0 to {maximum}, not {value}")
        return value

    return check


def boolean(value: object, loc: list) -> bool:
    """A validator of ``true``/``false``."""
    if not isinstance(value, bool):
        raise _Invalid(loc, f"must be true or false, not {_kind(value)}")
    return value


def _string(value: object, loc: list) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid(loc, "must be a non-empty string, not " + (
            "an empty one" if value == "" else _kind(value)))
    return value


def _numeric_text(value: object) -> str:
    """A hint for text that reads as a number: PyYAML (YAML 1.1) takes ``1e3`` as a string."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return f" ({value!r}: YAML reads it as text; write it with a dot, as 1.0e3, or in full)"
    return ""


def absolute_path(value: object, loc: list) -> str:
    """A validator of an absolute path."""
    text = _string(value, loc)
    if not os.path.isabs(text) or "\0" in text:
        raise _Invalid(loc, f"{text!r} is not an absolute path")
    return text


def string_list(value: object, loc: list) -> tuple[str, ...]:
    """A validator of a list of non-empty strings; returned as a tuple (the config is frozen)."""
    if not isinstance(value, list):
        raise _Invalid(loc, f"must be a list, not {_kind(value)}")
    return tuple(_string(item, [*loc, i]) for i, item in enumerate(value))


def one_of(names: tuple[str, ...]):
    """A validator of one of ``names``."""
    def check(value: object, loc: list) -> str:
        if value not in names:
            raise _Invalid(loc, f"must be one of {', '.join(names)}, not {value!r}")
        return value

    return check


def mapping(key, item):
    """A validator of a mapping whose keys pass ``key`` and values pass ``item``."""
    def check(value: object, loc: list) -> dict:
        if not isinstance(value, dict):
            raise _Invalid(loc, f"must be a mapping, not {_kind(value)}")
        return {key(k, [*loc, k]): item(v, [*loc, k]) for k, v in value.items()}

    return check


def _tool(value: object, loc: list) -> str:
    if value not in TOOLS:
        raise _Invalid(loc, f"unknown tool {value!r} (one of {', '.join(TOOLS)})")
    return value


def _module(value: object, loc: list) -> str:
    if value not in MODULES:
        raise _Invalid(loc, f"unknown module {value!r} ({', '.join(MODULES)})")
    return value


def _optional_modules(value: object, loc: list) -> tuple[str, ...]:
    """The modules that may fail with a warning: a sublist of ``OPTIONAL_MODULES`` (``[]``: none
    is loaded). Another name would be ignored by the modules step, so it is an error here."""
    names = string_list(value, loc)
    for i, name in enumerate(names):
        if name not in OPTIONAL_MODULES:
            raise _Invalid([*loc, i], f"not an optional module: {name!r} (only "
                           f"{', '.join(OPTIONAL_MODULES)}; nvidia and nvidia_uvm are required)")
    return names


def _parameter_name(value: object, loc: list) -> str:
    # [A-Za-z_][A-Za-z0-9_]*, as modprobe takes a parameter's name (no re: see the docstring)
    if not isinstance(value, str) or not value.isascii() or not value.isidentifier():
        raise _Invalid(loc, f"{value!r} is not a module parameter name")
    return value


def _parameter_value(value: object, loc: list) -> str | int | bool:
    # module parameters are one word each on modprobe's command line
    if isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value
    raise _Invalid(loc, f"{loc[-1]}: a value must be one word, a number or a boolean, "
                        f"not {value!r}")


class Section:
    """A frozen group of settings; subclasses list theirs in ``FIELDS`` (name -> (validator,
    default)). ``Section()`` holds the defaults; instances compare by value."""

    FIELDS: dict[str, tuple] = {}
    __slots__ = ()

    def __init__(self, **values: object):
        for name, (_check, default) in self.FIELDS.items():
            # a function as the default makes it (the metrics settings' class lives in the
            # metrics package, which imports this module)
            value = values[name] if name in values else default() if callable(default) \
                else default
            object.__setattr__(self, name, dict(value) if isinstance(value, dict) else value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"the config is frozen: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n in self.FIELDS)

    def __hash__(self) -> int:
        return hash(tuple(repr(getattr(self, n)) for n in self.FIELDS))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict:
        """The settings as plain data (sections as dicts, tuples as lists), for ``--json``."""
        def plain(value):
            if hasattr(value, "to_dict"):
                return value.to_dict()
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value

        return {n: plain(getattr(self, n)) for n in self.FIELDS}

    @classmethod
    def validate(cls, raw: object, loc: list, errors: list[_Invalid]):
        """A section from the mapping ``raw``; every bad key or value is appended to ``errors``
        (the section then holds the default for it)."""
        if not isinstance(raw, dict):
            errors.append(_Invalid(loc, f"must be a mapping of settings, not {_kind(raw)}"))
            return cls()
        values = {}
        for key, value in raw.items():
            where = [*loc, key]
            if key not in cls.FIELDS:
                errors.append(_Invalid(where, "unknown key"))
                continue
            check = cls.FIELDS[key][0]
            try:
                if isinstance(check, type) and issubclass(check, Section):
                    values[key] = check.validate(value, where, errors)
                else:
                    values[key] = check(value, where)
            except _Invalid as err:
                errors.append(err)
        return cls(**values)


class PersistencedConfig(Section):
    """nvidia-persistenced: the readiness wait is ``ready_timeout_s + per_gpu_s * GPUs`` seconds.

    The default (30 s + 15 s a GPU, 150 s for 8 GPUs) follows the field reports of 8-GPU
    machines needing about 150 s; ending the wait never kills the daemon. ``args`` are the
    daemon's options.
    """

    FIELDS = {"ready_timeout_s": (seconds(0, False), 30.0),
              "per_gpu_s": (seconds(0, True), 15.0),
              "args": (string_list, ("--persistence-mode", "--uvm-persistence-mode"))}
    __slots__ = tuple(FIELDS)


class FabricManagerConfig(Section):
    """nv-fabricmanager: wait ``ready_timeout_s + per_gpu_s * GPUs`` for fabric State Completed,
    querying it every ``poll_s`` seconds (0.1 s: a fabric that completes is seen within that; one
    ``nvidia-smi -q -d FABRIC`` runs at a time, so a slow query stretches the interval, never
    piles up)."""

    FIELDS = {"ready_timeout_s": (seconds(0, False), 60.0),
              "per_gpu_s": (seconds(0, True), 5.0),
              "config_file": (absolute_path, "/usr/share/nvidia/nvswitch/fabricmanager.cfg"),
              "poll_s": (seconds(0, False), 0.1)}
    __slots__ = tuple(FIELDS)


class ConfidentialComputingConfig(Section):
    """Whether boot may set the GPUs' CC ready state itself (``nvidia-smi conf-compute -srs 1``);
    whether CC mode ``DEVTOOLS`` (a development mode: no production confidentiality) is
    accepted with a warning instead of failing the boot (``allow_devtools``)."""

    FIELDS = {"set_ready_state": (boolean, False), "allow_devtools": (boolean, False)}
    __slots__ = tuple(FIELDS)


class ModulesConfig(Section):
    """Kernel modules: ``parameters`` per module (``{nvidia: {NVreg_EnableGpuFirmware: 1}}``)
    become ``modprobe <module> KEY=VALUE``; ``optional`` modules may fail with a warning;
    ``lock_after_boot`` writes 1 to ``/proc/sys/kernel/modules_disabled`` after the last module
    the boot loads (as NVRC does), so nothing can load a module until reboot. Off by default:
    kata-agent may load storage or network modules in some images."""

    FIELDS = {"parameters": (mapping(_module, mapping(_parameter_name, _parameter_value)), {}),
              "optional": (_optional_modules, OPTIONAL_MODULES),
              "lock_after_boot": (boolean, False)}
    __slots__ = tuple(FIELDS)


class HealthConfig(Section):
    """The health gate before the spec is installed (steps/health.py): a pending row remap or
    page retirement (it takes effect only after a GPU reset) fails the boot unless
    ``reset_pending_warns`` makes it a warning."""

    FIELDS = {"reset_pending_warns": (boolean, False)}
    __slots__ = tuple(FIELDS)


class DetectConfig(Section):
    """GPUs that appear after boot started (Hyper-V's vPCI, hot-plug).

    ``expected_gpus``: the NVIDIA GPUs every VM of this image has (0: no expectation); set it in
    an image that serves GPU VMs only, and boot waits for that many on PCI. Boot also waits,
    without any setting, for the PCI device of each VMBus PCI pass-through channel that has
    none yet. ``late_gpu_wait_s``: the longest of either wait, cut to what the boot budget has
    left. Nothing in the guest bounds the arrival otherwise: hv_pci waits for each answer of the
    host without a time limit (``wait_for_response`` in pci-hyperv.c gives up only when the
    channel is rescinded). The default, 60 s, is a judgement, not a measurement: a quarter of
    the default budget, it leaves 180 s for the setup of the GPUs that arrive (a 1-GPU setup
    takes seconds; persistenced's own wait is 45 s for one GPU). A VM without such a channel
    and without ``expected_gpus`` never waits.
    """

    FIELDS = {"expected_gpus": (count(MAX_GPUS), 0),
              "late_gpu_wait_s": (seconds(0, True), 60.0)}
    __slots__ = tuple(FIELDS)


def _metrics(value: object, loc: list):
    """The ``metrics:`` section: the exporter's own settings class checks it (README, Metrics)."""
    from podvm_gpu.metrics.settings import MetricsConfigError, MetricsSettings

    try:
        return MetricsSettings.from_mapping(value)
    except MetricsConfigError as err:
        raise _Invalid([*loc, *err.key_path.split(".")[1:]], err.message) from None
    except TypeError as err:  # a key the settings class does not take
        raise _Invalid(loc, str(err)) from None


def _default_metrics():
    from podvm_gpu.metrics.settings import MetricsSettings

    return MetricsSettings()


class Config(Section):
    """The whole config; ``Config()`` is the defaults."""

    FIELDS = {"budget_s": (seconds(0, False), 240.0),
              "timeouts": (mapping(_tool, seconds(0, False)), {}),
              "tools": (mapping(_tool, absolute_path), {}),
              "persistenced": (PersistencedConfig, PersistencedConfig()),
              "fabricmanager": (FabricManagerConfig, FabricManagerConfig()),
              "confidential_computing": (ConfidentialComputingConfig,
                                         ConfidentialComputingConfig()),
              "modules": (ModulesConfig, ModulesConfig()),
              "detect": (DetectConfig, DetectConfig()),
              "health": (HealthConfig, HealthConfig()),
              "unavailable_spec": (boolean, True),
              "metrics": (_metrics, _default_metrics)}
    __slots__ = tuple(FIELDS)


# Timeouts of one call, in seconds, for tools the config does not name (contract section 3:
# every external command has one). modprobe of nvidia on a big machine takes a few seconds.
DEFAULT_TIMEOUTS: dict[str, float] = {
    "modprobe": 60.0,
    "nvidia-ctk": 60.0,
    "nvidia-smi": 30.0,
    "nvidia-modprobe": 15.0,
    "nv-fabricmanager": 15.0,
    "nvidia-persistenced": 15.0,
    "ldconfig": 10.0,
    "systemctl": 10.0,
    "systemd-run": 10.0,
    "journalctl": 10.0,
    "modinfo": 10.0,
}


def parse_config(text: str, path: str) -> Config:
    """Validate the config text read from ``path`` (named in every message).

    Raises:
        ConfigError: not YAML, not a mapping, or a bad key or value; the message names the file
            and the first bad key (``persistenced.per_gpu_s``) and counts the others.
    """
    return validate(parse_yaml(text, path), path)


def parse_yaml(text: str, path: str) -> object:
    """The config text as PyYAML's safe loader reads it.

    Raises:
        ConfigError: not YAML (also: nested too deeply, a number of more than 4300 digits).
    """
    import yaml

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        # ValueError: a number Python will not read (more than 4300 digits)
        what = " ".join(str(err).split())
        if isinstance(err, RecursionError) or "nesting depth" in what:
            what = "nested too deeply"
        raise ConfigError(f"{path}: not valid YAML: {what[:300]}") from None


def validate(raw: object, path: str) -> Config:
    """The config from the parsed document ``raw`` (None: the defaults).

    Raises:
        ConfigError: not a mapping, or a bad key or value (see :func:`parse_config`).
    """
    if raw is None:
        return Config()
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a mapping of settings, not {type(raw).__name__}")
    errors: list[_Invalid] = []
    try:
        config = Config.validate(raw, [], errors)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if errors:
        first = errors[0]
        # a key may hold line breaks or be long: the message stays one bounded line
        key = one_line(".".join(str(p) for p in first.loc), 200) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        message = " ".join(first.message.split())[:300]
        raise ConfigError(f"{path}: {key}: {message}{more}")
    return config


# --- the compiled form: the YAML parsed once, at image build ----------------------------------
# Every CPU pod VM whose image ships a config file validates it at boot; PyYAML's import (it
# imports re) costs that boot about as much as all the rest of it (bench/run.py: 4x `python -c
# pass` with the YAML, 1.3x with this). So the image build (install-podvm-gpu.sh, or `podvm-gpu
# config --compile` after a change) writes, next to the config, the document PyYAML read from it
# together with the exact text it was read from. Boot uses it only while the config's text is
# that text, byte for byte, and validates it as it validates the YAML; otherwise it parses the
# YAML. Nothing is trusted that the YAML would not give.

COMPILED_SUFFIX = ".compiled.json"
COMPILED_FORMAT = "podvm-gpu config, compiled, 1"
_NOT_COMPILED = object()


def compiled_path(path: str) -> str:
    """Where the compiled form of the config at ``path`` lives: ``<path>.compiled.json``."""
    return path + COMPILED_SUFFIX


def compile_config(path: str) -> tuple[Config, str]:
    """Validate the config at ``path`` and write its compiled form beside it (atomically, 0644).

    Returns:
        The config and the compiled file's path.

    Raises:
        ConfigError: the config is missing, unreadable or invalid (nothing is written).
        OSError: the compiled file cannot be written.
    """
    from podvm_gpu.host.fs import atomic_write
    from podvm_gpu.jsontext import dumps

    text = read_config_text(path, required=True)
    raw = parse_yaml(text, path)
    config = validate(raw, path)
    target = compiled_path(path)
    atomic_write(target, dumps({"format": COMPILED_FORMAT, "source": text, "settings": raw}) + "\n")
    return config, target


def compiled_settings(path: str, text: str, trusted: bool = False) -> object:
    """The document of the compiled form of the config at ``path`` if it was made from exactly
    ``text``; :data:`_NOT_COMPILED` when there is none, it is stale, unreadable, not ours, or
    (``trusted``) another user than root could have written it."""
    from podvm_gpu.jsontext import loads

    try:
        fd = os.open(compiled_path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return _NOT_COMPILED
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 4 * MAX_CONFIG_BYTES or (
                trusted and untrusted_because(compiled_path(path), info)):
            return _NOT_COMPILED
        data = os.read(fd, 4 * MAX_CONFIG_BYTES + 1)
    except OSError:
        return _NOT_COMPILED
    finally:
        os.close(fd)
    try:
        doc = loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _NOT_COMPILED
    if not isinstance(doc, dict) or doc.get("format") != COMPILED_FORMAT \
            or doc.get("source") != text or "settings" not in doc:
        return _NOT_COMPILED
    return doc["settings"]


def compiled_state(path: str) -> str | None:
    """``None`` when the config at ``path`` has a current compiled form, else why not (for
    ``check --image``): missing, or made from another text."""
    try:
        text = read_config_text(path)
    except ConfigError:
        return None  # the config itself is the problem; the config check says so
    if text is None:
        return None
    if compiled_settings(path, text) is not _NOT_COMPILED:
        return None
    if os.path.lexists(compiled_path(path)):
        return f"{compiled_path(path)} was made from another version of the config"
    return f"{compiled_path(path)} is missing"


DEFAULT_PATH = "/etc/podvm-gpu/config.yaml"


def config_location(root, config: str | None) -> tuple[str, bool]:
    """Where a command's config is, and whether it must be read (``podvm-gpu config``, ``check``,
    ``metrics``; boot does the same on its fast path, boot.py ``_boot``).

    Args:
        root: the :class:`podvm_gpu.host.fs.Root`.
        config: ``--config`` / ``PODVM_GPU_CONFIG`` when given (it must then exist), else None.

    Returns:
        ``(path, required)``: the file's real path (the default path under the root, links
        followed chroot-style) and True when a file must be there: one was named, or an entry
        (a dangling link too) stands at the default path. ``(path, False)``: the defaults apply.

    Raises:
        ConfigError: the default path cannot be resolved under the root (a link loop).
    """
    if config:
        return config, True
    try:
        entry = root.resolve(DEFAULT_PATH, follow_last=False)
        if not os.path.lexists(entry):
            return entry, False
        return root.resolve(DEFAULT_PATH), True
    except OSError as err:
        raise ConfigError(f"{root.path.rstrip('/')}{DEFAULT_PATH}: cannot resolve: "
                          f"{err.strerror or err}") from err


def load_config(path: str, *, required: bool = False, trusted: bool = False) -> Config:
    """Load and validate the config file at ``path``; the defaults when there is no file.

    Read through its compiled form when that was made from the same text (see
    :func:`compile_config`), else parsed with PyYAML; validated in both cases.

    Args:
        path: the config file's real path.
        required: the file was asked for (``--config``, ``PODVM_GPU_CONFIG``), so a missing one
            is an error rather than the defaults.
        trusted: refuse a file that someone other than root could have written (boot, which
            runs the tools it names as root): see :func:`untrusted_because`.

    Raises:
        ConfigError: see :func:`read_config_text` and :func:`parse_config`.
    """
    text = read_config_text(path, required=required, trusted=trusted)
    if text is None:
        return Config()
    raw = compiled_settings(path, text, trusted)
    return parse_config(text, path) if raw is _NOT_COMPILED else validate(raw, path)


def trust_problems(path: str, info: os.stat_result | None = None, *,
                   owners: frozenset[int] | None = None, stop_at: str = "/") -> list[tuple[str, str]]:
    """What would let another user than root change a file that boot (as root) takes orders
    from: ``[("owner" | "mode", text), ...]``, empty when nothing does.

    The file, and every directory above its real path up to ``stop_at``, must be owned by one of
    ``owners`` (root and the user running the agent) and not be writable by its group or others.
    A directory with the sticky bit (``/tmp``) may be writable by others: nobody but an entry's
    owner can replace the entry. The rule of OpenSSH's ``safe_path`` for its keys.

    Args:
        path: the file's path.
        info: the file's ``os.fstat`` when it is already open (no race on the file itself).
        owners: the uids that may own them (default root and the effective uid).
        stop_at: the last directory checked (an image root for ``check --image``).
    """
    owners = owners if owners is not None else frozenset({0, os.geteuid()})
    problems: list[tuple[str, str]] = []
    try:
        info = info or os.stat(path)
    except OSError as err:
        return [("mode", f"cannot stat it: {err.strerror}")]
    if info.st_uid not in owners:
        problems.append(("owner", f"it is owned by uid {info.st_uid}, not root"))
    if info.st_mode & 0o022:
        problems.append(("mode", f"it is writable by group or others (mode "
                                 f"{stat.S_IMODE(info.st_mode):04o})"))
    return problems + [(kind, f"above it, {text}") for kind, text in folder_trust_problems(
        os.path.dirname(os.path.realpath(path)), owners, stop_at)]


def untrusted_because(path: str, info: os.stat_result | None = None) -> str | None:
    """The first of :func:`trust_problems` of ``path`` as one line, or None."""
    problems = trust_problems(path, info)
    return problems[0][1] if problems else None


def read_config_text(path: str, *, required: bool = False, trusted: bool = False) -> str | None:
    """The config file's text; None when it does not exist and was not asked for.

    Only a regular file of at most 1 MiB is read, opened without blocking: a FIFO or a device
    given as the config must not hang or flood the boot. A dangling link where the file should
    be is an error, not "no config".

    Raises:
        ConfigError: missing though required (or a dangling link), not a regular file, too
            large, unreadable, not UTF-8, or (``trusted``) writable by another user than root.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if required or os.path.islink(path):
            raise ConfigError(f"{path}: no such file" + (" (a dangling link)" if
                                                         os.path.islink(path) else "")) from None
        return None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
        why = untrusted_because(path, info) if trusted else None
        if why:
            raise ConfigError(f"{path}: not trusted: {why}; boot runs the tools a config names "
                              "as root, so only root may be able to write it")
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def timeouts_for(config: Config) -> dict[str, float]:
    """The per-tool timeouts: the defaults overridden by the config's ``timeouts``."""
    return {**DEFAULT_TIMEOUTS, **config.timeouts}
