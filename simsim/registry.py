"""One registry shape for every plug-in: a name, a factory, and what the factory takes.

Schedulers, routers, backends and engines are each chosen by name (in a scenario file, on
the command line, in Python), and each kind keeps its names in a :class:`Registry`:

* ``registry[name]`` is the factory (a class or a function); ``name in registry``,
  ``list(registry)`` and ``len(registry)`` work as on a read-only dict;
* :meth:`Registry.lookup` is ``registry[name]`` with an error that guesses what a
  misspelt name meant (``unknown scheduler policy 'fcfss' (did you mean 'fcfs'?)``);
* :meth:`Registry.options` reads the keyword options a factory takes from its signature,
  and :meth:`Registry.seeded` says whether one of them is ``seed``; scenario files take
  their allowed keys from there, so a factory's signature is all it declares;
* :meth:`Registry.build` makes one, refusing options the factory does not take;
* :meth:`Registry.register` adds a user's own (a duplicate name is refused unless
  ``replace=True``).

Vidur's ``utils/base_registry.py`` gave the idea of one class for every kind of plug-in.
This module imports nothing of simsim but :mod:`simsim.checks`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from simsim.checks import check_choice

__all__ = ["Registry", "option_names"]

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Mapping[str, F], Generic[F]):
    """Factories of one kind of plug-in by name, in the order they were registered.

    *kind* names one entry in messages (``"router"``, ``"scheduler policy"``), *plural*
    several (default: *kind* plus ``s``).
    """

    __slots__ = ("_entries", "_kind", "_plural")

    def __init__(self, kind: str, plural: str | None = None) -> None:
        self._kind = kind
        self._plural = plural if plural is not None else kind + "s"
        self._entries: dict[str, F] = {}

    @property
    def kind(self) -> str:
        """What one entry is, as messages name it (``"router"``)."""
        return self._kind

    def __getitem__(self, name: str) -> F:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self._kind!r}, names={list(self._entries)!r})"

    def __setitem__(self, name: str, factory: F) -> None:
        """``registry[name] = factory``: :meth:`register` with ``replace=True``."""
        self.register(name, factory, replace=True)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def register(self, name: str, factory: F, *, replace: bool = False) -> F:
        """Add *factory* under *name* and return it.

        *name* must be a non-empty ``str`` and *factory* callable (``TypeError``
        otherwise). A name already registered raises ``ValueError`` unless *replace* is
        true, so two plug-ins never silently take the same name.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self._kind} name must be a non-empty str, got {name!r}")
        if not callable(factory):
            raise TypeError(
                f"{self._kind} {name!r}: the factory must be callable (a class or a "
                f"function), got {type(factory).__name__} {factory!r}"
            )
        if name in self._entries and not replace:
            raise ValueError(
                f"{self._kind} {name!r} is already registered ({self._entries[name]!r}); "
                "pass replace=True to replace it"
            )
        self._entries[name] = self._entry(name, factory)
        return factory

    def _entry(self, name: str, factory: F) -> F:
        """What is stored for *factory* (a subclass may wrap it)."""
        return factory

    def unregister(self, name: str) -> None:
        """Remove *name* (an unknown name raises ``ValueError`` with a guess)."""
        del self._entries[self.check(name)]

    def check(self, name: object) -> str:
        """*name* if it is registered; ``ValueError`` with a guess at a misspelling
        otherwise (``TypeError`` for a non-``str``)."""
        if isinstance(name, str) and name in self._entries:
            return name
        return check_choice(name, self._kind, self._entries, known=self._plural)

    def lookup(self, name: object) -> F:
        """The factory registered as *name* (see :meth:`check` for the errors)."""
        return self._entries[self.check(name)]

    def options(self, name: str) -> tuple[str, ...] | None:
        """The keyword options *name*'s factory takes, from its signature, in order;
        ``None`` when it takes any (``**kwargs``) or its signature cannot be read."""
        return option_names(self.lookup(name))

    def defaults(self, name: str) -> dict[str, Any]:
        """The default value of each of *name*'s options that has one, by option name."""
        try:
            parameters = inspect.signature(self.lookup(name)).parameters
        except (TypeError, ValueError):
            return {}
        return {
            key: parameter.default
            for key, parameter in parameters.items()
            if parameter.default is not parameter.empty
        }

    def seeded(self, name: str) -> bool:
        """Whether *name*'s factory takes a ``seed`` option (drawn at random, seeded)."""
        return "seed" in (self.options(name) or ())

    def build(self, name: object, **options: Any) -> Any:
        """A new plug-in: *name*'s factory called with *options*.

        An unknown name raises ``ValueError`` (with a guess); an option the factory does
        not take raises ``TypeError`` naming those it takes; a bad option value raises
        the factory's own error.
        """
        checked = self.check(name)
        factory = self._entries[checked]
        accepted = option_names(factory)
        if accepted is not None:
            unknown = sorted(set(options) - set(accepted))
            if unknown:
                takes = (
                    f"its options are {', '.join(accepted)}" if accepted else "it takes no options"
                )
                raise TypeError(
                    f"{self._kind} {checked!r} has no option {', '.join(map(repr, unknown))}; "
                    f"{takes}"
                )
        return factory(**options)


def option_names(factory: Callable[..., Any]) -> tuple[str, ...] | None:
    """The keyword options *factory* takes (parameters that may be passed by name), or
    ``None`` when it takes any (``**kwargs``) or its signature cannot be read."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    names = []
    for parameter in parameters:
        if parameter.kind is parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            names.append(parameter.name)
    return tuple(names)
