"""Headless Chromium for the HTML report's tests: find it, dump a page's DOM after its script ran, take a
screenshot; and a small DOM reader for the dump (html.parser, no dependency).

Chromium is Debian's `chromium` (.ci/run installs it); tests skip with the reason when it is missing.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
NO_BROWSER = "no chromium: install Debian's chromium (apt-get install chromium) to run this check"


def browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(binary: str, args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--force-device-scale-factor=1", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def page_url(page: Path, steps: str = "") -> str:
    """The file URL of `page`; with `steps`, the hash that makes report/page.js run them after load."""
    return page.resolve().as_uri() + (f"#test={steps}" if steps else "")


def dump_dom(binary: str, url: str, profile: Path, *, script: bool = True) -> str:
    """The DOM after load (the page's script has run, test steps included), serialised."""
    extra = [] if script else ["--blink-settings=scriptEnabled=false"]
    done = _run(binary, [*extra, "--window-size=1200,900", "--dump-dom", url], profile)
    assert "<body" in done.stdout, f"chromium dumped no DOM (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


def screenshot(binary: str, url: str, out: Path, profile: Path, size: tuple[int, int] = (1200, 900)) -> None:
    done = _run(binary, [f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", url], profile)
    assert out.is_file(), f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-3000:]}"


def without_script(page: str) -> str:
    """A report page as a browser with JavaScript off uses it: its inline script gone (the JSON element is
    inert anyway). Chromium's --dump-dom and --screenshot need scripts on, so switching them off is no option."""
    stripped, n = re.subn(r"<script>\n.*?</script>", "", page, flags=re.S)
    assert n == 1, f"expected one inline script, found {n}"
    return stripped


class Node:
    """An element of a parsed page: tag, attributes, children (elements and text)."""

    def __init__(self, tag: str, attrs: dict[str, str], parent: "Node | None") -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator["Node"]:
        for c in self.children:
            if isinstance(c, Node):
                yield c
                yield from c.walk()

    def all(self, tag: str = "", cls: str = "") -> list["Node"]:
        """Descendants with that tag and class (either may be left out), in document order."""
        return [n for n in self.walk() if (not tag or n.tag == tag) and (not cls or cls in n.classes())]

    def one(self, tag: str = "", cls: str = "") -> "Node":
        found = self.all(tag, cls)
        assert len(found) == 1, f"expected one <{tag or '*'} class={cls!r}>, found {len(found)}"
        return found[0]

    def by_id(self, ident: str) -> "Node":
        for n in self.walk():
            if n.attrs.get("id") == ident:
                return n
        raise AssertionError(f"no element with id {ident!r}")


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.at = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.at)
        self.at.children.append(node)
        if tag not in _VOID:
            self.at = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.at.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.at))

    def handle_endtag(self, tag: str) -> None:
        node = self.at
        while node is not None and node.tag != tag:  # close what was left open, as a browser would
            node = node.parent
        if node is not None and node.parent is not None:
            self.at = node.parent

    def handle_data(self, data: str) -> None:
        self.at.children.append(data)


def parse(page: str) -> Node:
    b = _Builder()
    b.feed(page)
    b.close()
    return b.root
