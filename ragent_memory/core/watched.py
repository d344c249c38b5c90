"""The copies ``prepare`` hands out: ``dict``/``list`` subclasses whose mutating methods
raise a ``Flag`` shared by a view's copies, so "did the app change a copy?" is one attribute
read. Otherwise they are the builtins (equal, ``isinstance``, json/orjson encode them; copy,
deepcopy and pickle give plain data); a write past the methods goes unseen."""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any


class Flag:
    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False


def _watching(method: Callable[..., Any]) -> Any:
    def watched(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        self._flag.raised = True
        return method(self, *args, **kwargs)

    return watched


def _watched(base: type, methods: str) -> Any:
    """A subclass of ``base`` whose ``methods`` raise the flag first; copies of it are plain."""
    namespace: dict[str, Any] = {name: _watching(getattr(base, name)) for name in methods.split()}
    namespace.update(__slots__=("_flag",), __reduce_ex__=lambda self, _: (base, (base(self),)))
    return type(f"Watched{base.__name__.title()}", (base,), namespace)


WatchedDict = _watched(dict, "__setitem__ __delitem__ __ior__ clear pop popitem setdefault update")
WatchedList = _watched(
    list,
    "__setitem__ __delitem__ __iadd__ __imul__ append extend insert pop remove clear sort reverse",
)


def watched_copy(value: Any, flag: Flag) -> Any:
    """A copy of a JSON-like value down to its last dict and list (leaves shared), watched."""
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
