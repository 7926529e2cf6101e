"""What the trace's picture tests share: a made-up timeline view of a training run, a
parser of the HTML page, and a PNG decoder with the colour checks (no imaging library
needed). tests/unit/trace/test_trace_render.py and tests/integration/test_trace_browser.py
use them."""

from __future__ import annotations

import math
import struct
import zlib
from html.parser import HTMLParser

import numpy as np

MiB = 1 << 20
PEAK_RGB = (0xB0, 0x00, 0x20)
FIRST_LAYER_RGB = (0x4E, 0x79, 0xA7)

NAMES = [
    "/home/alice/gpt/model.py:88 (forward)",
    "/home/alice/gpt/model.py:61 (forward)",
    "/home/alice/gpt/train.py:40 (<module>)",
    "/home/alice/.venv/lib/python3.11/site-packages/torch/optim/adamw.py:471 (_multi_tensor_adamw)",
    "/home/alice/gpt/model.py:95 (backward)",
]


def training_view(steps: int = 2, per_step: int = 300) -> dict:
    """A made-up trace of two training steps: activations grow in the forward pass and are
    freed in the backward pass, gradients and optimizer state appear; the peak is in the
    second step's forward pass."""
    cols: dict[str, list[int]] = {n: [] for n in [*NAMES, "other"]}
    time_us, now = [], 1_700_000_000_000_000
    for step in range(steps):
        for i in range(per_step):
            f = i / per_step
            opt = 800 * MiB if step > 0 or f > 0.85 else 0
            if f < 0.45:
                k, grads = f / 0.45, 0
            elif f < 0.85:
                k = 1 - (f - 0.45) / 0.4
                grads = int(400 * MiB * (1 - k))
            else:
                k, grads = 0.0, 400 * MiB if f < 0.95 else 0
            other = int((20 + 15 * math.sin(i / 7)) * MiB) + (i * 7919) % (4 * MiB)
            values = [int(900 * MiB * k), int(600 * MiB * k), 400 * MiB, opt, grads, other]
            for name, value in zip(cols, values):
                cols[name].append(value)
            time_us.append(now)
            now += 1400 + (i * 31) % 600
    total = [sum(v[i] for v in cols.values()) for i in range(len(time_us))]
    peak = max(range(len(total)), key=lambda i: (total[i], -i))
    layers = sorted(((n, cols[n]) for n in NAMES), key=lambda layer: -max(layer[1]))
    return {
        "title": "cpu — traced region",
        "time_us": time_us,
        "total": total,
        "layers": [*layers, ("other", cols["other"])],
        "peak_index": peak,
        "peak_bytes": total[peak],
        "notices": ["2 allocations were made on threads without a Python stack."],
    }


VOID = {"meta", "br", "line", "circle"}  # no end tag here (the SVG ones are self-closed)


class Page(HTMLParser):
    """What the checks need from the page: tags with their attributes, the text of the
    elements of each class (as textContent: descendants included), the scripts."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.open: list[tuple[str, dict]] = []
        self.text: dict[str, str] = {}
        self.scripts: list[tuple[dict, str]] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag not in VOID:
            self.open.append((tag, attrs))
        if tag == "script":
            self.scripts.append((attrs, ""))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:  # a browser's serialisation writes </line>
            return
        assert self.open and self.open[-1][0] == tag, f"unbalanced </{tag}>"
        self.open.pop()

    def handle_data(self, data):
        if self.open and self.open[-1][0] == "script":
            self.scripts[-1] = (self.scripts[-1][0], self.scripts[-1][1] + data)
        for _, attrs in self.open:
            for cls in (attrs.get("class") or "").split():
                self.text[cls] = self.text.get(cls, "") + data

    def find(self, tag, **attrs):
        return [
            a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())
        ]


def read_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA, non-interlaced PNG as an (height, width, 3) array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    ch = 3 if color == 2 else 4
    stride = width * ch
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 1:  # sub: a running sum along each channel
            line = np.cumsum(line.reshape(width, ch), axis=0).reshape(-1) & 0xFF
        elif kind == 2:  # up
            line = (line + prev) & 0xFF
        elif kind in (3, 4):  # average, Paeth: each byte needs the one decoded before it
            row = line.tolist()
            up = prev.tolist()
            for i in range(stride):
                left = row[i - ch] if i >= ch else 0
                if kind == 3:
                    row[i] = (row[i] + (left + up[i]) // 2) & 0xFF
                else:
                    corner = up[i - ch] if i >= ch else 0
                    p = left + up[i] - corner
                    pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - corner)
                    guess = left if pa <= pb and pa <= pc else up[i] if pb <= pc else corner
                    row[i] = (row[i] + guess) & 0xFF
            line = np.array(row, dtype=np.int32)
        out[y] = line
        prev = line
    return out.reshape(height, width, ch)[:, :, :3]


def blended(rgb, alpha=0.85):
    """A colour drawn with opacity `alpha` over white."""
    return tuple(round(alpha * c + (1 - alpha) * 255) for c in rgb)


def share_near(pixels: np.ndarray, rgb, tolerance=14) -> float:
    distance = np.abs(pixels.astype(np.int32) - np.array(rgb)).max(axis=2)
    return float((distance <= tolerance).mean())


def assert_a_plot(pixels: np.ndarray):
    """Not blank, and the peak marker and the biggest layer are on it."""
    flat = pixels.reshape(-1, 3)
    assert len(np.unique(flat, axis=0)) > 50, "the picture is (nearly) one colour"
    assert share_near(pixels, (255, 255, 255), 0) < 0.85, "the picture is mostly empty"
    assert share_near(pixels, PEAK_RGB, 40) > 0.0002, "no peak marker"
    assert share_near(pixels, blended(FIRST_LAYER_RGB)) > 0.02, "no biggest layer"
