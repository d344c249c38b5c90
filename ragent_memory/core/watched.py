"""The copies ``prepare`` hands out, and how the engine notices that the app changed one.

A copy goes down to the last dict and list (strings are shared) and is handed out again while
unchanged, so "did the app change any copy?" must cost nothing per message. The copies are
``dict`` and ``list`` subclasses whose mutating methods first raise a ``Flag`` shared by a
view's copies: the check is one attribute read. Otherwise they are the builtins: equal to
plain data, ``isinstance`` dict/list, encoded as such by json and orjson, and ``copy``,
``deepcopy`` and pickle give plain dicts and lists. Only a write past the methods
(``dict.__setitem__(copy, …)``) goes unseen."""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any, SupportsIndex


class Flag:
    """Raised by any change to a copy made for it."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False


def _watching(method: Callable[..., Any]) -> Any:
    def watched(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        self._flag.raised = True
        return method(self, *args, **kwargs)

    watched.__name__ = method.__name__
    return watched


def _watched(base: type, methods: str) -> Any:
    """A subclass of ``base`` whose ``methods`` raise the flag first; copies of it are plain."""
    namespace: dict[str, Any] = {name: _watching(getattr(base, name)) for name in methods.split()}
    namespace["__slots__"] = ("_flag",)
    namespace["__reduce_ex__"] = lambda self, protocol: (base, (base(self),))
    return type(f"Watched{base.__name__.title()}", (base,), namespace)


WatchedDict = _watched(dict, "__setitem__ __delitem__ __ior__ clear pop popitem setdefault update")
WatchedList = _watched(
    list,
    "__setitem__ __delitem__ __iadd__ __imul__ append extend insert pop remove clear sort reverse",
)


def watched_copy(value: Any, flag: Flag) -> Any:
    """A copy of a JSON-like value down to its last dict and list (other leaves are shared),
    each dict and list in it raising ``flag`` when changed."""
    if isinstance(value, dict):
        copy = WatchedDict(value)  # the builtin's own copy, then the containers in it
        for key, item in value.items():
            if isinstance(item, dict | list):
                dict.__setitem__(copy, key, watched_copy(item, flag))
    elif isinstance(value, list):
        copy = WatchedList(map(watched_copy, value, repeat(flag)))
    else:
        return value
    copy._flag = flag
    return copy
