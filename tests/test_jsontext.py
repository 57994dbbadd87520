"""podvm_gpu.jsontext: the fast path's JSON writer must be json.dumps(indent=2), exactly."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tier import examples

from podvm_gpu.jsontext import dumps

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text())
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(), inner, max_size=4), max_leaves=30)


@settings(max_examples=examples(400, 100), deadline=None)
@given(DOCUMENTS)
def test_the_text_is_what_json_dumps_with_indent_2_writes(doc):
    assert dumps(doc) == json.dumps(doc, indent=2)


def test_control_characters_and_non_ascii_are_escaped_as_json_does():
    doc = {"reason": 'a "quoted" \\ back\nslash \x00 caf\u00e9 \U0001f600'}

    assert dumps(doc) == json.dumps(doc, indent=2)
    assert json.loads(dumps(doc)) == doc


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_float_json_cannot_hold_is_refused(value):
    with pytest.raises(ValueError):
        dumps({"x": value})


@pytest.mark.parametrize("value", [{1: "a"}, {"x": object()}, {"x": {1, 2}}])
def test_a_value_json_cannot_hold_is_refused(value):
    with pytest.raises(TypeError):
        dumps(value)


@settings(max_examples=examples(400, 100), deadline=None)
@given(DOCUMENTS)
def test_loads_reads_back_what_dumps_and_json_dumps_write(doc):
    from podvm_gpu.jsontext import loads

    assert loads(dumps(doc)) == doc
    assert loads(json.dumps(doc)) == json.loads(json.dumps(doc))


@pytest.mark.parametrize("text", ["", "{", "{} x", "NaN", "[Infinity]", '"\x01"', "[1,]"])
def test_loads_refuses_what_is_not_one_json_value_as_json_does(text):
    from podvm_gpu.jsontext import loads

    with pytest.raises(ValueError):
        loads(text)
