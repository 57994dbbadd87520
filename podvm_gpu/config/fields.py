"""How a config value is checked: the validators of the fields, one function each, and
:class:`Section`, a frozen group of fields (podvm_gpu.config.model lists the sections).

Values are taken strictly: a boolean is not a number, a string is not a number, a number is not
a boolean (YAML's ``true`` would otherwise read as 1 second, ``"30"`` as 30).
"""

from __future__ import annotations

import math
import os

from podvm_gpu.nvidia_ctk import DISABLE_HOOK_NAMES

MAX_CONFIG_BYTES = 1 << 20
MAX_SECONDS = 3600.0  # no wait or budget in a pod VM boot is longer than an hour
MAX_GPUS = 64  # far above any VM size sold (8 GPUs, 16 at most), still a bound
# The external tools of contract section 1 (and the ones this project added); config keys that
# name a tool must be one of them.
TOOLS = ("modprobe", "nvidia-ctk", "nvidia-persistenced", "nvidia-smi", "nv-fabricmanager",
         "nvidia-modprobe", "systemctl", "ldconfig", "modinfo", "systemd-run", "journalctl",
         "nvlsm", "nvattest")
ATTESTATION_MODES = ("auto", "required", "off")
MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset")
OPTIONAL_MODULES = ("nvidia_modeset",)  # loaded after the required ones, may fail (modules.py)
REQUIRED_MODULES = tuple(m for m in MODULES if m not in OPTIONAL_MODULES)


class Invalid(Exception):
    """One bad value: ``loc`` is the key path (``["persistenced", "per_gpu_s"]``)."""

    def __init__(self, loc: list, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message


def _kind(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping", type(None): "empty"}.get(type(value),
                                                                        type(value).__name__)


def unknown_key(key: object, known) -> str:
    """The message for an unknown ``key``: ``unknown key``, with the nearest of ``known`` (the
    section's keys; difflib's close matches, cutoff 0.6) when one is near (issue 47 item 20):
    ``unknown key (did you mean budget_s?)``."""
    import difflib

    near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1) \
        if isinstance(key, str) else []
    return f"unknown key (did you mean {near[0]}?)" if near else "unknown key"


def seconds(minimum: float, inclusive: bool):
    """A validator of a number of seconds in ``minimum`` (exclusive unless ``inclusive``) to
    ``MAX_SECONDS``; returns it as a float."""
    bound = f"at least {minimum:g}" if inclusive else f"greater than {minimum:g}"

    def check(value: object, loc: list) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(loc, f"must be a number of seconds, not {_kind(value)}"
                           + (_quoted_number(value, loc, False) or _numeric_text(value)))
        # an int is compared as an int: math.isfinite(10**309) and float() raise OverflowError
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(loc, "must be a finite number of seconds")
        if value < minimum or (value == minimum and not inclusive) or value > MAX_SECONDS:
            raise Invalid(loc, f"must be {bound} and at most {MAX_SECONDS:g} s, not "
                               f"{_number_text(value)}")
        return float(value)

    return check


def _number_text(value: int | float) -> str:
    """``value`` for a message, bounded: a 300-digit integer is said by its size."""
    if isinstance(value, int) and not -10**15 < value < 10**15:
        try:
            digits = f"{len(str(abs(value)))} digits"
        except ValueError:  # beyond Python's 4300-digit conversion limit
            digits = "more than 4300 digits"
        return f"{'a negative' if value < 0 else 'an'} integer of {digits}"
    return repr(value)


def count(maximum: int):
    """A validator of a whole number from 0 to ``maximum``."""
    def check(value: object, loc: list) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            shown = repr(value) if isinstance(value, float) else _kind(value)
            raise Invalid(loc, f"must be a whole number, not {shown}"
                          + _quoted_number(value, loc, True))
        if not 0 <= value <= maximum:
            raise Invalid(loc, f"must be from 0 to {maximum}, not {_number_text(value)}")
        return value

    return check


def boolean(value: object, loc: list) -> bool:
    """A validator of ``true``/``false``."""
    if not isinstance(value, bool):
        raise Invalid(loc, f"must be true or false, not {_kind(value)}")
    return value


def _string(value: object, loc: list) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid(loc, "must be a non-empty string, not " + (
            "an empty one" if value == "" else _kind(value)))
    return value


def _quoted_number(value: object, loc: list, whole: bool) -> str:
    """A hint for a number written in quotes (``budget_s: "5"``): text that YAML 1.1 reads as a
    decimal number when written plain (``5``, ``-2``, ``2.5``, ``1.0e+3``; ``whole``: integers
    only) can only be a string because it was quoted (or is a string in the compiled form), so
    the hint says to drop the quotes, with the key as it would be written: ``("5" is quoted;
    write it without quotes: budget_s: 5)``. ``""`` for anything else (``1e3`` is text to YAML
    1.1 even unquoted: :func:`_numeric_text` says what to write instead)."""
    if not isinstance(value, str) or not _yaml_decimal(value, whole):
        return ""
    key = loc[-1] if loc and isinstance(loc[-1], str) else None
    return f' ("{value}" is quoted; write it without quotes: ' \
        f'{f"{key}: " if key is not None else ""}{value})'


def _yaml_decimal(text: str, whole: bool) -> bool:
    """Whether YAML 1.1's resolver (the one PyYAML's safe loader uses) reads the plain scalar
    ``text`` as a decimal int, or (not ``whole``) a float that is not inf or nan: ``[-+]?(0|
    [1-9][0-9_]*)`` and ``[-+]?([0-9][0-9_]*)?\\.[0-9_]*([eE][-+][0-9]+)?`` with a digit."""
    import re

    number = r"[-+]?(?:0|[1-9][0-9_]*)"
    if not whole:
        number += r"|[-+]?(?=\.?[0-9])(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][-+][0-9]+)?"
    return text.isascii() and re.fullmatch(number, text) is not None


def _numeric_text(value: object) -> str:
    """A hint for text that reads as a number: PyYAML (YAML 1.1) takes ``1e3`` and ``1.0e3`` as
    strings (its float needs a dot and a signed exponent). The hint is the value written as
    YAML 1.1 reads a float (``1000.0``, ``1.0e-320``): fed back, it is a number."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return f" ({value!r}: YAML reads it as text, and as a number it is beyond any float)"
    return f" ({value!r}: YAML reads it as text; write it as {yaml_float(number)})"


def yaml_float(number: float) -> str:
    """``number`` as YAML 1.1's float resolver takes it: a dot in the mantissa and a signed
    exponent (``[-+]?([0-9][0-9_]*)?\\.[0-9.]*([eE][-+][0-9]+)?``, the YAML 1.1 float type)."""
    text = repr(number)
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if e and exponent[:1] not in "+-":
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}" if e else mantissa


def absolute_path(value: object, loc: list) -> str:
    """A validator of an absolute path."""
    text = _string(value, loc)
    if not os.path.isabs(text) or "\0" in text:
        raise Invalid(loc, f"{text!r} is not an absolute path")
    return text


def string_list(value: object, loc: list) -> tuple[str, ...]:
    """A validator of a list of non-empty strings; returned as a tuple (the config is frozen)."""
    if not isinstance(value, list):
        raise Invalid(loc, f"must be a list, not {_kind(value)}")
    return tuple(_string(item, [*loc, i]) for i, item in enumerate(value))


# IMEX channels: the driver makes NVreg_ImexChannelCount of them (2048 by default, its maximum),
# so an id is below 2048. A pod uses one channel (the DRA driver hands out channel 0 by default);
# 64 in a list is a judgement, far above any use, that keeps the nodes and the spec small.
MAX_IMEX_CHANNEL = 2047
MAX_IMEX_CHANNELS = 64


def imex_channels(value: object, loc: list) -> tuple[int, ...]:
    """A validator of ``imex.channels``: a list of at most :data:`MAX_IMEX_CHANNELS` distinct
    channel ids, each a whole number from 0 to :data:`MAX_IMEX_CHANNEL`; returned sorted, as a
    tuple (the config is frozen)."""
    if not isinstance(value, list):
        raise Invalid(loc, f"must be a list of channel ids, not {_kind(value)}")
    if len(value) > MAX_IMEX_CHANNELS:
        raise Invalid(loc, f"at most {MAX_IMEX_CHANNELS} channels, not {len(value)}")
    ids = tuple(count(MAX_IMEX_CHANNEL)(item, [*loc, i]) for i, item in enumerate(value))
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise Invalid(loc, f"channel {twice[0]} is listed twice")
    return tuple(sorted(ids))


def cdi_hooks(value: object, loc: list) -> tuple[str, ...]:
    """A validator of ``cdi.disable_hooks``: a list of distinct names of
    :data:`podvm_gpu.nvidia_ctk.DISABLE_HOOK_NAMES`; returned as a tuple in the order given (the
    config is frozen)."""
    if not isinstance(value, list):
        raise Invalid(loc, f"must be a list of hook names, not {_kind(value)}")
    names = tuple(_string(item, [*loc, i]) for i, item in enumerate(value))
    for i, name in enumerate(names):
        if name not in DISABLE_HOOK_NAMES:
            raise Invalid([*loc, i], f"must be one of {', '.join(DISABLE_HOOK_NAMES)}, not {name!r}")
        if name in names[:i]:
            raise Invalid(loc, f"hook {name} is listed twice")
    return names


def one_of(names: tuple[str, ...]):
    """A validator of one of ``names``."""
    def check(value: object, loc: list) -> str:
        if value not in names:
            raise Invalid(loc, f"must be one of {', '.join(names)}, not {value!r}")
        return value

    return check


def mapping(key, item):
    """A validator of a mapping whose keys pass ``key`` and values pass ``item``."""
    def check(value: object, loc: list) -> dict:
        if not isinstance(value, dict):
            raise Invalid(loc, f"must be a mapping, not {_kind(value)}")
        return {key(k, [*loc, k]): item(v, [*loc, k]) for k, v in value.items()}

    return check


def tool(value: object, loc: list) -> str:
    if value not in TOOLS:
        raise Invalid(loc, f"unknown tool {value!r} (one of {', '.join(TOOLS)})")
    return value


def attestation_mode(value: object, loc: list) -> str:
    """``auto``, ``required`` or ``off``; YAML 1.1 reads an unquoted ``off`` as false, and the
    error says to quote it (a boolean is not taken for a word: values are strict)."""
    if value is False:
        raise Invalid(loc, "must be one of auto, required, off, not false (YAML reads an "
                      "unquoted off as false: write 'off')")
    return one_of(ATTESTATION_MODES)(value, loc)


def timeout_tool(value: object, loc: list) -> str:
    """A tool of ``timeouts:``: any of :data:`TOOLS` but ``nvattest``, whose runs are bounded by
    ``confidential_computing.attestation_timeout_s`` and ``attestation_per_device_s`` (a
    per-device term a single number cannot give)."""
    if value == "nvattest":
        raise Invalid(loc, "nvattest's time limit is confidential_computing."
                      "attestation_timeout_s + attestation_per_device_s per device, not timeouts")
    return tool(value, loc)


def url(value: object, loc: list) -> str:
    """A validator of an ``https://`` or ``http://`` URL (one word, no control characters)."""
    text = _string(value, loc)
    if not text.startswith(("https://", "http://")) or any(c.isspace() or ord(c) < 32
                                                           for c in text):
        raise Invalid(loc, f"{text[:80]!r} is not an http(s) URL")
    return text


def module(value: object, loc: list) -> str:
    if value not in MODULES:
        raise Invalid(loc, f"unknown module {value!r} ({', '.join(MODULES)})")
    return value


def optional_modules(value: object, loc: list) -> tuple[str, ...]:
    """The modules that may fail with a warning: a sublist of ``OPTIONAL_MODULES`` (``[]``: none
    is loaded). Another name would be ignored by the modules step, so it is an error here."""
    names = string_list(value, loc)
    for i, name in enumerate(names):
        if name not in OPTIONAL_MODULES:
            raise Invalid([*loc, i], f"not an optional module: {name!r} (only "
                           f"{', '.join(OPTIONAL_MODULES)}; nvidia and nvidia_uvm are required)")
    return names


def module_names(value: object, loc: list) -> tuple[str, ...]:
    """A non-empty list of kernel module names (ASCII letters, digits, ``_`` and ``-``, as
    modprobe takes a name; ``mlx5_core``)."""
    names = string_list(value, loc)
    if not names:
        raise Invalid(loc, "must name at least one module")
    for i, name in enumerate(names):
        if not name.isascii() or not name.replace("-", "_").isidentifier():
            raise Invalid([*loc, i], f"{name!r} is not a module name")
    return names


def parameter_name(value: object, loc: list) -> str:
    # [A-Za-z_][A-Za-z0-9_]*, as modprobe takes a parameter's name (no re: see the docstring)
    if not isinstance(value, str) or not value.isascii() or not value.isidentifier():
        raise Invalid(loc, f"{value!r} is not a module parameter name")
    return value


def parameter_value(value: object, loc: list) -> str | int | bool:
    # module parameters are one word each on modprobe's command line
    if isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value
    raise Invalid(loc, f"must be one word, a number or a boolean, not {value!r}")


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
    def validate(cls, raw: object, loc: list, errors: list[Invalid]):
        """A section from the mapping ``raw``; every bad key or value is appended to ``errors``
        (the section then holds the default for it). ``null`` is taken for a key whose default
        is null (unset), and for no other."""
        if raw is None and loc:
            # YAML's "persistenced:" with nothing after it is null: a section is a mapping, and
            # null is taken only for a key whose default is null (docs/interface.md 7)
            name = loc[-1]
            errors.append(Invalid(loc, f"must be a mapping of settings, not null (leave {name} "
                                       f"out, or write {name}: {{}}, for its defaults)"))
            return cls()
        if not isinstance(raw, dict):
            errors.append(Invalid(loc, f"must be a mapping of settings, not {_kind(raw)}"))
            return cls()
        values = {}
        for key, value in raw.items():
            where = [*loc, key]
            if key not in cls.FIELDS:
                errors.append(Invalid(where, unknown_key(key, cls.FIELDS)))
                continue
            check, default = cls.FIELDS[key]
            if value is None and default is None:
                # null where the documented default is "null (unset)": what config --json
                # prints for it, so its settings can be fed back (issue 35 item 5)
                values[key] = None
                continue
            try:
                if isinstance(check, type) and issubclass(check, Section):
                    values[key] = check.validate(value, where, errors)
                else:
                    values[key] = check(value, where)
            except Invalid as err:
                errors.append(err)
        return cls(**values)
