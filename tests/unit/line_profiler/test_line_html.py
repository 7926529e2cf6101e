"""The line profiler's HTML: well-formed, the rows and values of the text, code escaped,
bars scaled to each column's maximum."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import torch

from memlab_rs import LineProfiler

MiB = 1 << 20


class Table(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.rows, self.styles, self.titles = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)
        attrs = dict(attrs)
        if tag == "tr":
            self.rows.append([])
        if tag == "td":
            self.rows[-1].append("")
            self.styles.append(attrs.get("style", ""))
            self.titles.append(attrs.get("title"))

    def handle_endtag(self, tag):
        assert self.stack.pop() == tag, f"unbalanced </{tag}>"

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "td":
            self.rows[-1][-1] += data


def compare(a, b):
    if a < b:
        small = torch.empty(256, 1024)
        return small
    big = torch.empty(1024, 1024)
    return big


def test_html_has_every_line_its_values_and_escaped_code():
    with LineProfiler(compare, device="cpu") as lp:
        compare(1, 2)
        compare(2, 1)
    columns = ("allocated_bytes.all.allocated", "allocation.all.allocated")
    html = lp.display(columns=columns)._repr_html_()
    assert "<script" not in html and "http" not in html  # self-contained
    assert "if a &lt; b:" in html
    table = Table()
    table.feed(html)
    assert table.stack == []
    body = [r for r in table.rows if r]  # the header row has th cells only
    first = compare.__code__.co_firstlineno
    assert [int(r[2]) for r in body] == list(range(first, first + 6))
    by_code = {r[3].strip(): r for r in body}
    assert by_code["small = torch.empty(256, 1024)"][:2] == ["1.00M", "1"]
    assert by_code["big = torch.empty(1024, 1024)"][:2] == ["4.00M", "1"]
    assert by_code["if a < b:"][3] == "    if a < b:"
    # bars: the largest value of a column fills its cell, 1 MiB of 4 MiB a quarter
    widths = [float(m) for m in re.findall(r"0\.45\) ([0-9.]+)%", " ".join(table.styles))]
    assert 100.0 in widths and 25.0 in widths
    assert str(4 * MiB) + " bytes" in table.titles


def test_no_data_html():
    assert LineProfiler(compare, device="cpu").display()._repr_html_() == "<p>No data collected</p>"
