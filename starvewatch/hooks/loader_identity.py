"""Which loader a `watch()` call is (issue 35 item 1): the identity rule, stated once.

A loader is its call site (the file and line that called `watch()`) plus its dataset object.
- A helper `def make(ds): return watch(DataLoader(ds, ...))` used for train and val: one call
  site, two datasets alive at once: two loaders.
- `for epoch ...: loader = watch(DataLoader(ds, ...))`: one call site, one dataset: one loader,
  re-created every epoch (its epochs count on; `LoaderTotals.rebuilds` counts the new objects).
- The dataset rebuilt too (`DataLoader(MyDataset(...))` inside the epoch loop): the site's
  earlier dataset is gone and the new one is of the same class: the same loader.
- An iterable without a dataset (a generator made anew each epoch): known by its class.
- The same settings besides (session.watch checks them): two loaders of one line with other
  batch sizes are two.

Naming (session.default_loader_name) and continuation (session.watch) both go through
`SiteBook.names_for`. Read once per `watch()` call, never on the hot path."""
from __future__ import annotations

import weakref


def call_site(frame) -> tuple[str, int] | None:
    if frame is None:
        return None
    try:
        return frame.f_code.co_filename, frame.f_lineno
    except AttributeError:
        return None


class _Ref:
    """A dataset held weakly where it can be (most classes), else by id (a reused id after
    the dataset is freed reads as the same dataset: the same call site makes that likely the
    rebuilt one anyway)."""

    def __init__(self, obj) -> None:
        self.cls = type(obj).__name__
        self.ident = id(obj)
        try:
            self.ref = weakref.ref(obj)
        except TypeError:
            self.ref = None

    def same(self, obj) -> bool:
        if self.ref is not None:
            return self.ref() is obj
        return self.ident == id(obj)

    def alive(self) -> bool:
        return self.ref is None or self.ref() is not None


class SiteBook:
    """Per session: for each call site, the (dataset, loader name) pairs watched there. An
    iterable without a dataset (a generator made anew each epoch) is known by its class."""

    def __init__(self) -> None:
        self._sites: dict[tuple[str, int], list[tuple[_Ref | None, str, str]]] = {}

    def names_for(self, site, loader) -> list[str]:
        """The names of the loaders this (call site, dataset) may continue, best first (the
        caller keeps the one whose settings match); empty for a new one."""
        if site is None:
            return []
        dataset = getattr(loader, "dataset", None)
        entries = self._sites.get(site) or []
        if dataset is None:
            return [name for ref, cls, name in entries if ref is None and cls == type(loader).__name__]
        same = [name for ref, _, name in entries if ref is not None and ref.same(dataset)]
        if same:
            return same
        rebuilt = []  # the dataset rebuilt: its predecessor at this site is gone
        for ref, cls, name in entries:
            if ref is not None and not ref.alive() and cls == type(dataset).__name__:
                ref.__init__(dataset)
                rebuilt.append(name)
        return rebuilt

    def remember(self, site, loader, name: str) -> None:
        if site is None:
            return
        dataset = getattr(loader, "dataset", None)
        entry = (None, type(loader).__name__, name) if dataset is None else (_Ref(dataset), type(dataset).__name__, name)
        self._sites.setdefault(site, []).append(entry)
