"""Allocation sites: where a block was made, as the report names it.

Takes frames (the first frame of an allocation stack's user suffix, see
frames.py) or the reason there is none; gives `Site`s, interned by
`SiteTable` so that blocks carry a small integer site id.

A block made on a thread without Python frames (autograd's engine), before
the log began, or in a log written without stacks has no frame: it gets one
of the stand-ins NO_PYTHON, BEFORE_LOG or NO_STACKS.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .frames import Frame


class Site(NamedTuple):
    """Where a block was allocated: the user's frame, or a stand-in when there is none."""

    label: str  # short: "train.py:42 main"
    location: str  # long: "/path/train.py:42 in main"
    frame: Frame | None


NO_PYTHON = Site("(no Python stack)", "a thread without Python frames (autograd's engine, a C++ thread)", None)
BEFORE_LOG = Site("(before the log began)", "allocated before the log was opened", None)
NO_STACKS = Site("(no stacks recorded)", "the log was written without stacks:1", None)


def site_of_frame(frame: Frame) -> Site:
    return Site(frame.short(), frame.long(), frame)


class SiteTable:
    """Interns sites; ids are indices into `.sites`."""

    def __init__(self) -> None:
        self.sites: list[Site] = []
        self._ids: dict[Any, int] = {}

    def id(self, site: Site) -> int:
        key = site.frame if site.frame is not None else site.label
        if key not in self._ids:
            self._ids[key] = len(self.sites)
            self.sites.append(site)
        return self._ids[key]

    def of_frame(self, frame: Frame | None) -> int:
        """The id of the site of `frame`; -1 for None (no frame: e.g. a free without Python)."""
        return -1 if frame is None else self.id(site_of_frame(frame))
