"""memlab_rs.fragmentation's analysis on synthesized snapshots (no GPU here): the sums,
the largest block, the request's verdict against an independent replay of torch's malloc
path, damaged snapshots, saving, loading and rendering."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memlab_rs
from memlab_rs.doctor import FragmentationResult, from_snapshot

MiB = 1 << 20
STATES = ("active_allocated", "active_pending_free", "inactive")


@st.composite
def snapshots(draw):
    """Segments laid one after another, each tiled by blocks (sizes multiples of 512),
    small segments of 2 MiB and large ones of any size, on two streams and two pools."""
    segments = []
    address = 1 << 40
    for _ in range(draw(st.integers(0, 8))):
        small = draw(st.booleans())
        stream = draw(st.sampled_from([0, 7]))
        pool_id = draw(st.sampled_from([[0, 0], [1, 0]]))
        units = 4096 if small else draw(st.integers(2, 120)) * 4096  # 512-byte units
        blocks = []
        left = units
        while left:
            n = min(left, draw(st.integers(1, max(1, units // 2))))
            blocks.append({"size": n * 512, "requested_size": n * 512,
                           "state": draw(st.sampled_from(STATES))})  # fmt: skip
            left -= n
        segments.append({
            "address": address, "total_size": units * 512, "stream": stream,
            "segment_type": "small" if small else "large", "segment_pool_id": pool_id,
            "is_expandable": False, "blocks": blocks,
        })  # fmt: skip
        address += units * 512 + 4096 * 512
    return segments


def _free_blocks(segments):
    for seg in segments:
        at = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "inactive":
                yield seg, at, b["size"]
            at += b["size"]


# Example counts per session: every CPython's session draws its own (300 and 400 snapshots
# per `make test`), and drawing the nested snapshots is most of the time.
@settings(max_examples=60, deadline=None)
@given(snapshots())
def test_the_breakdowns_sum_to_reserved_minus_allocated(segments):
    r = from_snapshot(segments)
    data = r.to_data()
    reserved = sum(s["total_size"] for s in segments)
    by_state = {s: 0 for s in STATES}
    for seg in segments:
        for b in seg["blocks"]:
            by_state[b["state"]] += b["size"]
    assert r.reserved_bytes == reserved
    assert r.allocated_bytes == by_state["active_allocated"]
    assert r.free_bytes == by_state["inactive"]
    assert reserved - r.allocated_bytes == r.free_bytes + data["pending_free_bytes"]
    for rows in (data["pools"], data["segments"]):
        assert sum(p["free_bytes"] for p in rows) == r.free_bytes
        assert sum(p["pending_free_bytes"] for p in rows) == data["pending_free_bytes"]
        for p in rows:
            size = p.get("reserved_bytes", p.get("size"))
            assert size - p["allocated_bytes"] - p["pending_free_bytes"] == p["free_bytes"]
    assert sum(p["reserved_bytes"] for p in data["pools"]) == reserved
    frees = [size for _, _, size in _free_blocks(segments)]
    assert r.largest_free_block == max(frees, default=0)
    assert sum(b["bytes"] for b in data["free_sizes"]) == r.free_bytes
    assert sum(b["blocks"] for b in data["free_sizes"]) == len(frees)
    for b in data["free_sizes"]:
        assert b["from"] <= b["bytes"] // max(b["blocks"], 1) < b["to"]
    split = sum(
        b["size"]
        for seg in segments
        if len(seg["blocks"]) > 1
        for b in seg["blocks"]
        if b["state"] == "inactive"
    )
    assert r.inactive_split_bytes == split
    for fmt in ("text", "html", "json", "csv"):
        assert r.render(fmt)


def _reference(segments, size, stream, pool_id, device_free, allowed):
    """torch's malloc path, written again from CUDACachingAllocator.cpp for the default
    settings: round, pool, smallest free block of the pool and stream, else a new segment
    (within the limit and the device's free memory), else release wholly free segments of
    the default pools and retry, else out of memory."""
    size = max(512, -(-size // 512) * 512)
    small = size <= MiB
    fits = [
        (b, at)
        for seg, at, b in _free_blocks(segments)
        if (seg["segment_type"] == "small") == small
        and seg["stream"] == stream
        and seg["segment_pool_id"] == pool_id
        and b >= size
    ]
    if fits:
        return "reuses_cached_block", min(fits)
    if small:
        segment = 2 * MiB
    elif size < 10 * MiB:
        segment = 20 * MiB
    else:
        segment = -(-size // (2 * MiB)) * 2 * MiB
    reserved = sum(s["total_size"] for s in segments)

    def gives(released):
        if allowed is not None and reserved - released + segment > allowed:
            return False
        return segment <= device_free + released

    if gives(0):
        return "grows_cache", None
    released = sum(
        s["total_size"]
        for s in segments
        if s["segment_pool_id"] == [0, 0]
        and all(b["state"] != "active_allocated" for b in s["blocks"])
    )
    return ("grows_after_release" if gives(released) else "out_of_memory"), None


@settings(max_examples=80, deadline=None)
@given(
    snapshots(),
    st.integers(1, 40 * MiB),
    st.sampled_from([0, 7]),
    st.sampled_from([[0, 0], [1, 0]]),
    st.integers(0, 64 * MiB),
    st.one_of(st.none(), st.integers(0, 400 * MiB)),
)
def test_the_verdict_agrees_with_torchs_malloc_path(
    segments, size, stream, pool_id, device_free, allowed
):
    r = from_snapshot(
        segments,
        request=size,
        stream=stream,
        pool_id=tuple(pool_id),
        device_free_bytes=device_free,
        allowed_bytes=allowed,
    )
    v = r.verdict
    outcome, block = _reference(segments, size, stream, pool_id, device_free, allowed)
    assert v["configured"]["outcome"] == outcome
    if block is not None:
        assert (v["configured"]["block_size"], v["configured"]["block"]) == block
    assert r.fits_without_growing() == (outcome == "reuses_cached_block")
    free = [
        b
        for seg, _, b in _free_blocks(segments)
        if (seg["segment_type"] == "small") == (v["rounded_bytes"] <= MiB)
        and seg["stream"] == stream
        and seg["segment_pool_id"] == pool_id
    ]
    assert v["free_bytes"] == sum(free)
    assert v["largest_free"] == max(free, default=0)
    assert r.fragmented() == (sum(free) >= v["rounded_bytes"] > max(free, default=0))
    # Expandable segments meet at least what a cached block meets.
    if outcome == "reuses_cached_block":
        assert r.fits("expandable_segments:True") is True


def _carved():
    """One 100 MiB segment of 25 blocks of 4 MiB with blocks 5-9 and 15-19 freed: what
    tests/gpu/test_doctor_fragmentation_cuda.py builds on a GPU."""
    blocks = []
    for i in range(25):
        if 5 <= i < 10 or 15 <= i < 20:
            if i in (5, 15):
                blocks.append({"size": 20 * MiB, "requested_size": 4 * MiB, "state": "inactive"})
        else:
            blocks.append({"size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated"})
    return [{"address": 1 << 40, "total_size": 100 * MiB, "stream": 0, "segment_type": "large",
             "segment_pool_id": (0, 0), "is_expandable": False, "blocks": blocks}]  # fmt: skip


def test_a_carved_segment_is_fragmentation_and_expandable_segments_would_fit():
    r = from_snapshot(_carved(), request="30 MiB", device_free_bytes=1 << 34,
                      allowed_bytes=110 * MiB)  # fmt: skip
    assert (r.free_bytes, r.largest_free_block, r.inactive_split_bytes) == (
        40 * MiB,
        20 * MiB,
        40 * MiB,
    )
    assert r.fragmented()
    assert r.fits() is False
    assert r.fits("expandable_segments:True") is True
    v = r.verdict
    assert v["expandable"]["released_bytes"] == 40 * MiB
    assert v["expandable"]["device_bytes"] == 40 * MiB
    assert v["max_split"]["setting"] == "max_split_size_mb:100"
    assert v["max_split"]["estimate"] is True
    assert r.fits("max_split_size_mb") is True
    text = r.text()
    assert (
        "fragmentation: 40.0 MiB free in this pool and stream, "
        "but the largest free block is 20.0 MiB" in text
    )
    assert "as configured: out of memory" in text
    assert "with expandable_segments:True: fits after the allocator gives back 40.0 MiB" in text


def test_save_load_and_render(tmp_path):
    r = from_snapshot(_carved(), request=30 * MiB, device_free_bytes=0)
    path = tmp_path / "frag.json"
    r.save(path)
    back = memlab_rs.load(path)
    assert isinstance(back, FragmentationResult)
    assert back.to_data() == r.to_data()
    assert back.text() == r.text()
    assert back.html().startswith('<div class="memlab-fragmentation">')
    assert json.loads(back.render("json")) == r.to_data()
    csv = back.render("csv").splitlines()
    assert csv[0].startswith("address,pool,")
    assert csv[1].split(",")[4:] == ["false", str(100 * MiB), "17", str(60 * MiB), "0",
                                     str(40 * MiB), str(20 * MiB)]  # fmt: skip
    with pytest.raises(ValueError, match="renders as text, html, json, csv"):
        r.render("png")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s[0].update(total_size=99 * MiB), "segments[0].total_size"),
        (lambda s: s[0]["blocks"][0].update(state="gone"), "segments[0].blocks[0].state"),
        (lambda s: s[0]["blocks"][1].update(address=5), "segments[0].blocks[1].address"),
        (lambda s: s[0]["blocks"][0].update(size=-1), "segments[0].blocks[0].size"),
        (lambda s: s[0].pop("segment_type"), "segments[0]"),
        (lambda s: s[0].update(segment_type="huge"), "segments[0].segment_type"),
        (lambda s: s[0].update(blocks=[]), "segments[0].blocks"),
        (lambda s: s.append(dict(s[0], address=s[0]["address"] + MiB)), "segments[1].address"),
        (lambda s: s[0].update(stream="x"), "segments[0].stream"),
    ],
)
def test_a_damaged_snapshot_is_a_value_error_naming_the_field(change, field):
    segments = _carved()
    change(segments)
    with pytest.raises(ValueError) as info:
        from_snapshot(segments)
    assert str(info.value).startswith(field), str(info.value)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="request"):
        from_snapshot(_carved(), request="lots")
    with pytest.raises(ValueError, match="request must be a positive"):
        from_snapshot(_carved(), request=0)
    with pytest.raises(TypeError, match="pool_id"):
        from_snapshot(_carved(), request=1, pool_id=(0,))
    with pytest.raises(TypeError, match="segments must be a list"):
        from_snapshot("x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allocator_conf: max_split_size_mb"):
        from_snapshot(_carved(), allocator_conf="max_split_size_mb:1")
    with pytest.raises(ValueError, match="device='cpu'"):
        memlab_rs.fragmentation("cpu")
    with pytest.raises(ValueError, match="answers no request"):
        from_snapshot(_carved()).fits()


def test_public_names():
    assert memlab_rs.fragmentation is memlab_rs.doctor.fragmentation
    assert memlab_rs.FragmentationResult is FragmentationResult
