"""The check every module view of a trace agrees (tests/unit/trace/test_trace_views.py on
generated histories and CPU steps, tests/gpu/test_trace_cuda.py on CUDA steps): the module
rows, their text, CSV, JSON, HTML and data frame, the keyword groups and the untagged log
read one assignment of the live set at the peak."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

PHASES = ("forward:", "backward:", "optimizer:")
ROW = re.compile(r"^(\S+ \S*)  (\S+ \S*)  (\S+ \S*)  (\d+)  (.+)$")
UNTAGGED = re.compile(r"^Untagged: ([0-9.]+) MiB in (\d+) allocation\(s\), allocated at:$")


class ModuleTable(HTMLParser):
    """The HTML's module table: (bytes, key) per row."""

    def __init__(self):
        super().__init__()
        self.caption, self.in_modules, self.cells, self.rows = "", False, [], []
        self.title, self.data = None, ""

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self.title = dict(attrs).get("title")
            self.data = ""

    def handle_data(self, data):
        self.data += data

    def handle_endtag(self, tag):
        if tag == "caption":
            self.in_modules = self.data.endswith("by module")
        if tag == "td" and self.in_modules:
            self.cells.append((self.title, self.data))
            if len(self.cells) == 5:
                self.rows.append((int(self.cells[0][0].split()[0]), self.cells[4][1]))
                self.cells = []
        if tag == "caption":
            self.data = ""


def assert_views_agree(result, device="cpu"):
    """Every module view of `result` says what module_rows() says."""
    rows = result.module_rows(device)
    by_key = {r.location: r for r in rows}
    assert len(by_key) == len(rows)
    assert sum(r.bytes for r in rows) == result.max_mem(device)
    # CSV
    csv = result.to_csv(device=device).splitlines()
    assert csv[0] == "tag,MiB"
    assert [(line.rsplit(",", 1)[0], float(line.rsplit(",", 1)[1])) for line in csv[1:]] == [
        (r.location, round(r.bytes / 2**20, 6)) for r in rows
    ]
    # JSON
    (dev,) = [d for d in result.to_dict()["devices"] if d["device"] == device]
    assert [(m["key"], m["bytes"], m["count"], m["median"]) for m in dev["modules"]] == [
        (r.location, r.bytes, r.count, r.median) for r in rows
    ]
    # text
    lines = result.module_text().splitlines()
    assert lines[1] == "Mem, Cumulative Mem, Median, Count, Module"
    table = [ROW.match(line) for line in lines[2 : 2 + len(rows)]]
    assert [(m.group(5), int(m.group(4))) for m in table] == [(r.location, r.count) for r in rows]
    # HTML: the module table is there whenever some row is neither untraced nor untagged
    parser = ModuleTable()
    parser.feed(result._repr_html_())
    if any(r.location not in ("untraced", "(untagged)") for r in rows):
        assert parser.rows == [(r.bytes, r.location) for r in rows]
    # data frame
    frame = result.to_dataframe(device, by="module")
    assert list(zip(frame["module"], frame["bytes"])) == [(r.location, r.bytes) for r in rows]
    # keyword groups: a group takes exactly the rows whose key holds its keyword
    for r in rows:
        found = dict(result.keywords({"g": [r.location]}, None, device))
        taken = sum(x.bytes for x in rows if r.location in x.location)
        assert found == {"g": taken, "Others": result.max_mem(device) - taken}
    # the untagged log: the allocations of the (untagged) row, no more, no fewer
    headers = [UNTAGGED.match(line) for line in result.untagged_log(device=device).splitlines()]
    headers = [m for m in headers if m]
    untagged = by_key.get("(untagged)")
    assert sum(int(m.group(2)) for m in headers) == (untagged.count if untagged else 0)
    logged = sum(float(m.group(1)) for m in headers)
    assert logged == pytest.approx((untagged.bytes if untagged else 0) / 2**20, abs=1e-6 * 50)
    # no phase is shown with an empty module
    assert not any(r.location in PHASES for r in rows)


def nbytes(tensor):
    return tensor.untyped_storage().nbytes()
