"""``acp.Value`` and ``acp.Counter``: a number (or any plain value) a checkpoint saves and restores in place."""

from __future__ import annotations

import operator
from typing import Any, Dict, TypeVar

__all__ = ["Counter", "Value"]

_V = TypeVar("_V", bound="Value")


class Value:
    """A mutable value a checkpoint saves and restores in place: ``lr = acp.Value(0.1)``; read and write ``.value``.

    ``+=``, ``-=``, ``*=``, ``/=`` change it in place; arithmetic, comparisons and conversions use the value.
    """

    __slots__ = ("value",)
    __hash__ = None  # type: ignore[assignment]  # mutable

    def __init__(self, value: Any = 0) -> None:
        self.value = value

    def state_dict(self) -> Dict[str, Any]:
        return {"value": self.value}

    def set_state_dict(self, state: Dict[str, Any]) -> None:
        self.value = state["value"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"

    def __iadd__(self: _V, other: object) -> _V:
        self.value += other
        return self

    def __isub__(self: _V, other: object) -> _V:
        self.value -= other
        return self

    def __imul__(self: _V, other: object) -> _V:
        self.value *= other
        return self

    def __itruediv__(self: _V, other: object) -> _V:
        self.value /= other
        return self

    def __int__(self) -> int:
        return int(self.value)

    def __float__(self) -> float:
        return float(self.value)

    def __index__(self) -> int:
        return operator.index(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __add__(self, o: object) -> Any: return self.value + _v(o)
    def __radd__(self, o: object) -> Any: return _v(o) + self.value
    def __sub__(self, o: object) -> Any: return self.value - _v(o)
    def __rsub__(self, o: object) -> Any: return _v(o) - self.value
    def __mul__(self, o: object) -> Any: return self.value * _v(o)
    def __rmul__(self, o: object) -> Any: return _v(o) * self.value
    def __truediv__(self, o: object) -> Any: return self.value / _v(o)
    def __rtruediv__(self, o: object) -> Any: return _v(o) / self.value
    def __floordiv__(self, o: object) -> Any: return self.value // _v(o)
    def __mod__(self, o: object) -> Any: return self.value % _v(o)
    def __eq__(self, o: object) -> Any: return self.value == _v(o)
    def __lt__(self, o: object) -> Any: return self.value < _v(o)
    def __le__(self, o: object) -> Any: return self.value <= _v(o)
    def __gt__(self, o: object) -> Any: return self.value > _v(o)
    def __ge__(self, o: object) -> Any: return self.value >= _v(o)


class Counter(Value):
    """An integer counter a checkpoint saves and restores: ``step = acp.Counter()``; ``step += 1``."""

    __slots__ = ()

    def __init__(self, value: int = 0) -> None:
        super().__init__(value)

    def increment(self, n: int = 1) -> int:
        """Add ``n`` and return the new value."""
        self.value += n
        new: int = self.value  # a Counter holds an int (Value's value is whatever the script gave)
        return new


def _v(o: Any) -> Any:
    return o.value if isinstance(o, Value) else o
