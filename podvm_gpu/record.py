"""Frozen value records without ``dataclasses``.

``import dataclasses`` pulls in ``inspect`` (and with it ``ast``, ``dis``, ``tokenize``...): about
10 ms here, more under umockdev, paid on every GPU boot and every ``check`` (bench/run.py). The
records the agent needs are plain: fields with defaults, immutable, compared by value.
"""

from __future__ import annotations

REQUIRED = object()  # the default of a field that must be given


class Record:
    """A frozen value. A subclass lists ``FIELDS`` as ``(name, default)`` pairs in order: the
    default :data:`REQUIRED`, a value, or ``list``/``dict`` for a new empty one each time;
    ``NOT_COMPARED`` names fields left out of ``==`` and ``repr`` (unknown keys kept aside).
    Fields are given by position or by name, as a dataclass takes them.

    Raises:
        TypeError: a field is missing, unknown or given twice.
        AttributeError: on assignment (records are frozen).
    """

    FIELDS: tuple = ()
    NOT_COMPARED: tuple = ()

    def __init__(self, *args, **kwargs):
        names = [name for name, _ in self.FIELDS]
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, not {len(args)}")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in values:
                raise TypeError(f"{type(self).__name__}: unknown or repeated field {key!r}")
            values[key] = value
        for name, default in self.FIELDS:
            if name in values:
                value = values[name]
            elif default is REQUIRED:
                raise TypeError(f"{type(self).__name__}: missing field {name!r}")
            else:
                value = default() if default in (list, dict) else default
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name}")

    def _compared(self) -> tuple:
        return tuple(getattr(self, n) for n, _ in self.FIELDS if n not in self.NOT_COMPARED)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._compared()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n, _ in self.FIELDS
                          if n not in self.NOT_COMPARED)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict:
        """The fields as a dict, in order (the compared ones)."""
        return {n: getattr(self, n) for n, _ in self.FIELDS if n not in self.NOT_COMPARED}
