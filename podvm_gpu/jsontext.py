"""JSON text of the agent's own documents (status.json, ``--json`` reports) without ``import json``.

The CPU fast path writes status.json on every CPU pod VM boot, and ``import json`` costs about
as much as the rest of that path together (it imports ``re`` for its pure-Python fallbacks;
bench/run.py has the figures). The strings are escaped by the json package's own C accelerator,
``_json.encode_basestring_ascii`` (the function ``json.dumps`` uses), and the layout is that of
``json.dumps(value, indent=2)``, character for character: tests/test_jsontext.py proves both
on generated documents. :func:`loads` reads the agent's own compiled config the same way, with
the accelerator's scanner (the one ``json.loads`` uses); every other JSON is read with the json
package.
"""

from __future__ import annotations

try:
    from _json import encode_basestring_ascii as _quote
    from _json import make_scanner as _make_scanner
except ImportError:  # an interpreter built without the accelerator: the json package's own
    from json.encoder import py_encode_basestring_ascii as _quote

    def _make_scanner(context):  # the error path of loads() does the work
        raise ValueError("no accelerator")


class _Context:
    """What the scanner asks of a decoder (json.decoder.JSONDecoder's attributes)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name: str):
        raise ValueError(f"JSON has no {name}")


def loads(text: str) -> object:
    """The JSON value that is ``text`` (one value, surrounded by nothing but whitespace), as
    ``json.loads`` reads it; NaN and Infinity are refused.

    Raises:
        ValueError: ``text`` is not one JSON value (``json.JSONDecodeError`` is one).
    """
    start = len(text) - len(text.lstrip(" \t\n\r"))
    try:
        value, end = _make_scanner(_Context())(text, start)
        if not text[end:].strip(" \t\n\r"):
            return value
    except Exception:  # noqa: S110 - any trouble: the json package says what is wrong
        pass
    import json  # the error path (or no accelerator): json's own message

    return json.loads(text, parse_constant=_Context.parse_constant)


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
