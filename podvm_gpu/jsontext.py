"""JSON text of the agent's own documents (status.json, ``--json`` reports) without ``import json``.

The CPU fast path writes status.json on every CPU pod VM boot, and ``import json`` costs about
as much as the rest of that path together (it imports ``re`` for its pure-Python fallbacks;
bench/run.py has the figures). The strings are escaped by the json package's own C accelerator,
``_json.encode_basestring_ascii`` (the function ``json.dumps`` uses), and the layout is that of
``json.dumps(value, indent=2)``, character for character: tests/test_jsontext.py proves both
on generated documents. Reading JSON stays with the json package.
"""

from __future__ import annotations

try:
    from _json import encode_basestring_ascii as _quote
except ImportError:  # an interpreter built without the accelerator: the json package's own
    from json.encoder import py_encode_basestring_ascii as _quote


def dumps(value: object, indent: int = 2) -> str:
    """``value`` as JSON text laid out as ``json.dumps(value, indent=indent)`` lays it out.

    Args:
        value: dicts with string keys, lists, tuples, strings, ints, finite floats, booleans
            and None, nested.

    Raises:
        TypeError: a value of another type, or a key that is not a string.
        ValueError: a float that is infinite or NaN (JSON has none).
    """
    out: list[str] = []
    _write(value, out, "\n", " " * indent)
    return "".join(out)


def _write(value: object, out: list[str], newline: str, step: str) -> None:
    if isinstance(value, str):
        out.append(_quote(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"JSON has no {value!r}")
        out.append(float.__repr__(value))
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = newline + step
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"JSON keys must be strings, not {type(key).__name__}")
            out.append(("," if i else "") + inner + _quote(key) + ": ")
            _write(item, out, inner, step)
        out.append(newline + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = newline + step
        out.append("[")
        for i, item in enumerate(value):
            out.append(("," if i else "") + inner)
            _write(item, out, inner, step)
        out.append(newline + "]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")
