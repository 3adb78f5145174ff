"""The docs quote the tools as they print today (issue 35, item 5): every block the README and docs/*.md mark as a
quote is what its maker in doc_quotes.py makes from the bundled data, every marker names a maker, every maker is
quoted somewhere, and a stale block is caught and rewritten.

The makers run `torchalloc` in this process; doc_quotes caches each command's output, so the demo's report runs
once for the whole session however many quotes take lines from it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doc_quotes  # noqa: E402  (beside this file, not a package)

QUOTES = [q for path in doc_quotes.DOCS for q in doc_quotes.quotes_in(path)]


def test_the_docs_quote_every_maker_and_only_makers() -> None:
    named = {q.name for q in QUOTES}
    assert named - doc_quotes.QUOTES.keys() == set(), "markers that name no maker in doc_quotes.QUOTES"
    assert doc_quotes.QUOTES.keys() - named == set(), "makers no document quotes"


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.path.name}:{q.name}")
def test_each_quote_is_what_its_maker_prints_today(quote: doc_quotes.Quote) -> None:
    assert quote.lines, f"{doc_quotes.where(quote)}: quote {quote.name} is empty"
    assert quote.lines == doc_quotes.made(quote.name), (
        f"{doc_quotes.where(quote)}: quote {quote.name} is stale: python3 python/tests/doc_quotes.py --write")


def test_each_maker_takes_real_lines_from_the_tools() -> None:
    """A maker whose pattern matched nothing would raise; one that matched the wrong line would quote a few
    words: each quote must carry a figure with its unit."""
    for name in doc_quotes.QUOTES:
        text = "\n".join(doc_quotes.made(name))
        assert any(unit in text for unit in (" MiB", " GiB", " KB")), f"{name}: {text!r}"


STALE_DOC = """\
# A page

- an item that quotes the optimizer's phase line:

  <!-- quote: demo-optimizer -->
  ```text
  optimizer: reserved 1.0 MiB more over 6 occurrences; an old figure
  ```

The end.
"""


def test_a_stale_block_is_caught_and_write_makes_it_the_tools_lines(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "page.md"
    page.write_text(STALE_DOC)
    [quote] = doc_quotes.quotes_in(page)
    assert (quote.name, quote.indent, quote.lines) == (
        "demo-optimizer", "  ", ["optimizer: reserved 1.0 MiB more over 6 occurrences; an old figure"])

    assert doc_quotes.main([], paths=[page]) == 1
    assert f"{page}:7: quote demo-optimizer is stale" in capsys.readouterr().out

    assert doc_quotes.main(["--write"], paths=[page]) == 0
    made = doc_quotes.made("demo-optimizer")
    assert page.read_text() == STALE_DOC.replace(
        "  optimizer: reserved 1.0 MiB more over 6 occurrences; an old figure\n",
        "".join(f"  {line}\n" for line in made))
    assert doc_quotes.main([], paths=[page]) == 0
    assert doc_quotes.rewrite(page) is False  # fresh: nothing to write


def test_a_marker_without_its_block_or_maker_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- quote: demo-summary -->\nno block here\n")
    with pytest.raises(ValueError, match="not followed by a fenced block"):
        doc_quotes.quotes_in(page)
    page.write_text("<!-- quote: demo-summary -->\n```text\nnever closed\n")
    with pytest.raises(ValueError, match="never closes"):
        doc_quotes.quotes_in(page)
    page.write_text("<!-- quote: no-such-maker -->\n```text\n```\n")
    with pytest.raises(KeyError, match="no maker for the quote 'no-such-maker'"):
        doc_quotes.stale([page])
