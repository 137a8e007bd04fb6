"""The numbers ``paddle-acp check`` reads in the script's namespaces (runtime/digests.py): a counter wherever a
script keeps one (a dict, a list, a deque, a closure, a class or object of its own, an lru_cache's size), and no
more than the bounds."""
import collections
import functools
import types

import numpy as np

from paddle_acp.runtime.digests import _MAX_ITEMS, _MAX_NUMBERS, _numbers


def _script_own(obj):
    obj.__module__ = "__main__"  # as if the script defined it
    return obj


def read(**names):
    out = {}
    for k, v in names.items():
        _numbers(out, k, v)
    return out


def test_counters_wherever_the_script_keeps_them():
    class Sched:
        steps = 7

    class Warm:
        def __init__(self):
            self.n = 3

    def make():
        n = 5

        def tick():
            return n
        return tick

    @functools.lru_cache(maxsize=None)
    def seen(i):
        return i
    seen(1), seen(2)
    for o in (Sched, Warm, make, seen):
        _script_own(o)
    tick = _script_own(make())
    got = read(GDICT={"step": 4, "nested": {"inner": {"step": 9}}}, GLIST=[1, 2.5], DQ=collections.deque([6]),
               Sched=Sched, warm=Warm(), tick=tick, seen=seen, ns=types.SimpleNamespace(k=np.int64(8)))
    assert got == {"GDICT['step']": 4, "GDICT['nested']['inner']['step']": 9, "GLIST[0]": 1, "GLIST[1]": 2.5,
                   "DQ[0]": 6, "Sched.steps": 7, "warm.n": 3, "tick.<closure n>": 5,
                   "seen.cache_info().currsize": 2, "ns.k": 8}, got


def test_bounds_other_modules_objects_and_raising_objects():
    class Foreign:  # not the script's own class: not looked into
        def __init__(self):
            self.n = 1

    class Raising:
        @property
        def __dict__(self):
            raise RuntimeError("no")
    _script_own(Raising)
    big = list(range(_MAX_ITEMS + 1))
    deep = {"a": {"b": {"c": {"d": 1}}}}
    assert read(big=big, foreign=Foreign(), raising=Raising(), deep=deep, flag=True, nan=float("nan")) == {
        "nan": "nan"}
    many = {}
    for i in range(_MAX_NUMBERS // 10 + 2):
        _numbers(many, f"l{i}", list(range(10)))
    assert len(many) == _MAX_NUMBERS
