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

from typing import Any, SupportsIndex


class Flag:
    """Raised by any change to a copy made for it."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False


class WatchedDict(dict[Any, Any]):
    __slots__ = ("_flag",)
    _flag: Flag

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return dict, (dict(self),)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._flag.raised = True
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self._flag.raised = True
        dict.__delitem__(self, key)

    def __ior__(self, other: Any) -> WatchedDict:  # type: ignore[misc]
        self._flag.raised = True
        dict.update(self, other)
        return self

    def clear(self) -> None:
        self._flag.raised = True
        dict.clear(self)

    def pop(self, *args: Any) -> Any:
        self._flag.raised = True
        return dict.pop(self, *args)

    def popitem(self) -> tuple[Any, Any]:
        self._flag.raised = True
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._flag.raised = True
        return dict.setdefault(self, key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._flag.raised = True
        dict.update(self, *args, **kwargs)


class WatchedList(list[Any]):
    __slots__ = ("_flag",)
    _flag: Flag

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return list, (list(self),)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._flag.raised = True
        list.__setitem__(self, index, value)

    def __delitem__(self, index: Any) -> None:
        self._flag.raised = True
        list.__delitem__(self, index)

    def __iadd__(self, other: Any) -> WatchedList:  # type: ignore[misc]
        self._flag.raised = True
        list.extend(self, other)
        return self

    def __imul__(self, count: SupportsIndex) -> WatchedList:
        self._flag.raised = True
        list.__imul__(self, count)
        return self

    def append(self, value: Any) -> None:
        self._flag.raised = True
        list.append(self, value)

    def extend(self, values: Any) -> None:
        self._flag.raised = True
        list.extend(self, values)

    def insert(self, index: SupportsIndex, value: Any) -> None:
        self._flag.raised = True
        list.insert(self, index, value)

    def pop(self, index: SupportsIndex = -1) -> Any:
        self._flag.raised = True
        return list.pop(self, index)

    def remove(self, value: Any) -> None:
        self._flag.raised = True
        list.remove(self, value)

    def clear(self) -> None:
        self._flag.raised = True
        list.clear(self)

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._flag.raised = True
        list.sort(self, *args, **kwargs)

    def reverse(self) -> None:
        self._flag.raised = True
        list.reverse(self)


_CONTAINERS = (dict, list, WatchedDict, WatchedList)


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
