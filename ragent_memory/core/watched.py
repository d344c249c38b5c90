"""The copies ``prepare`` hands out, and how it notices that the caller changed one.

Every prepared message is a copy down to its last dict and list (strings are shared), so an
app that decorates what it sends changes neither its history nor what later turns send. A
copy is handed out again on later turns while it is unchanged; the question "did the caller
change any copy since?" must then cost nothing per message in view.

The copies are ``dict`` and ``list`` subclasses whose mutating methods first raise the flag of
the view they were made for (one ``Flag`` shared by all of them), so the check is one
attribute read. Everything else is the builtin's: they are equal to plain dicts and lists,
``isinstance(x, dict)`` holds, ``json.dumps`` and orjson encode them as dicts and lists, and
``copy.copy``, ``copy.deepcopy`` and pickle give plain dicts and lists (a copy of a copy is
the caller's own, unwatched). Only a write that bypasses the methods
(``dict.__setitem__(copy, …)``) goes unseen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, SupportsIndex


class Flag:
    """Raised by any change to a copy made for it."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False


def _watching(method: Callable[..., Any]) -> Any:
    """The builtin ``method``, raising the copy's flag first."""

    def watched(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        self._flag.raised = True
        return method(self, *args, **kwargs)

    watched.__name__ = method.__name__
    return watched


class WatchedDict(dict[Any, Any]):
    __slots__ = ("_flag",)
    _flag: Flag

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return dict, (dict(self),)

    __setitem__ = _watching(dict.__setitem__)
    __delitem__ = _watching(dict.__delitem__)
    __ior__ = _watching(dict.__ior__)
    clear = _watching(dict.clear)
    pop = _watching(dict.pop)
    popitem = _watching(dict.popitem)
    setdefault = _watching(dict.setdefault)
    update = _watching(dict.update)


class WatchedList(list[Any]):
    __slots__ = ("_flag",)
    _flag: Flag

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return list, (list(self),)

    __setitem__ = _watching(list.__setitem__)
    __delitem__ = _watching(list.__delitem__)
    __iadd__ = _watching(list.__iadd__)
    __imul__ = _watching(list.__imul__)
    append = _watching(list.append)
    extend = _watching(list.extend)
    insert = _watching(list.insert)
    pop = _watching(list.pop)
    remove = _watching(list.remove)
    clear = _watching(list.clear)
    sort = _watching(list.sort)
    reverse = _watching(list.reverse)


_CONTAINERS = frozenset({dict, list, WatchedDict, WatchedList})


def watched_copy(value: Any, flag: Flag) -> Any:
    """A copy of a JSON-like value down to its last dict and list (strings and other leaves
    are shared), every dict and list in it watched by ``flag``."""
    copy: WatchedDict | WatchedList
    if isinstance(value, dict):
        copy = WatchedDict(value)  # the builtin's own copy (no watched method runs)...
        for key, item in value.items():
            if type(item) in _CONTAINERS:  # ...then the containers in it, copied in turn
                dict.__setitem__(copy, key, watched_copy(item, flag))
    elif isinstance(value, list):
        copy = WatchedList(value)
        for index, item in enumerate(value):
            if type(item) in _CONTAINERS:
                list.__setitem__(copy, index, watched_copy(item, flag))
    else:
        return value
    copy._flag = flag
    return copy
