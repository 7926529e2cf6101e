"""Courtesy regions where they cannot work (CI has no GPU): a process without CUDA and a
torch without the pool hooks each get CourtesyRegionUnavailable saying why and what to do;
bad arguments are refused by name; pause and resume with no region say so."""

from __future__ import annotations

import pytest
import torch

import memlab_rs
from memlab_rs import Courtesy, _core, _torch
from memlab_rs.courtesy import CourtesyRegionUnavailable, regions


@pytest.mark.skipif(torch.cuda.is_available(), reason="this checks a machine without CUDA")
def test_without_cuda_a_region_is_refused_with_the_reason():
    with pytest.raises(CourtesyRegionUnavailable, match="needs a CUDA device"):
        Courtesy.region("train")


def test_a_torch_without_the_pool_hooks_is_named(monkeypatch):
    monkeypatch.delattr(torch.cuda, "MemPool")
    with pytest.raises(LookupError, match=r"lacks torch\.cuda\.MemPool .*torch 2\.6 or newer"):
        _torch.PoolRouting()
    monkeypatch.setattr(regions, "_routing", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(CourtesyRegionUnavailable, match="upgrade torch"):
        Courtesy.region("train")


def test_this_torch_has_the_pool_hooks():
    # Every torch the project supports (2.8 and newer) has them, CUDA build or not.
    routing = _torch.PoolRouting()
    assert callable(routing.begin_all) and routing.pool_class is torch.cuda.MemPool


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tag": ""}, TypeError, "tag must be a non-empty str"),
        ({"tag": 3}, TypeError, "tag must be a non-empty str, got 3"),
        ({"keep_contents": 1}, TypeError, "keep_contents must be True or False"),
        ({"prepare_host": None}, TypeError, "prepare_host must be True or False"),
        ({"threads": "some"}, ValueError, "threads must be 'all' or 'current'"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        Courtesy.region(**kwargs)


def test_pause_and_resume_of_an_unknown_tag_name_it():
    with pytest.raises(ValueError, match="no open Courtesy region 'nope'"):
        Courtesy.pause("nope")
    with pytest.raises(TypeError, match="tag must be"):
        Courtesy.resume(5)


def test_pause_and_resume_with_no_region_say_so():
    report = Courtesy.pause()
    assert isinstance(report, memlab_rs.RegionReport)
    assert str(report) == "Courtesy pause: every region: nothing mapped to pause"
    assert str(Courtesy.resume()) == "Courtesy resume: every region: nothing paused to resume"


def test_the_allocator_functions_are_exported_by_the_library():
    import ctypes

    lib = ctypes.CDLL(_core.__file__)
    for slot in range(_core.courtesy.REGION_SLOTS):
        assert hasattr(lib, f"{_core.courtesy.REGION_MALLOC_PREFIX}{slot}")
    assert hasattr(lib, _core.courtesy.REGION_FREE)
    # Without a GPU the allocation function answers a null pointer, never a crash.
    malloc = getattr(lib, f"{_core.courtesy.REGION_MALLOC_PREFIX}0")
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    if not torch.cuda.is_available():
        assert malloc(2 << 20, 0, None) is None
    free = getattr(lib, _core.courtesy.REGION_FREE)
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    before = _core.courtesy.region_counters()[2]
    free(12345, 2 << 20, 0, None)  # an address no region gave out: counted, left alone
    assert _core.courtesy.region_counters()[2] == before + 1


def test_a_tag_without_segments_is_forgotten_at_close_and_its_slot_freed():
    slot = _core.courtesy.region_slot("closing")
    assert slot is not None and _core.courtesy.region_slot("closing") == slot
    assert _core.courtesy.region_close("closing") is True
    # The slot is free again: the next tag to ask may take it.
    assert _core.courtesy.region_slot("next") == slot
    assert _core.courtesy.region_close("next") is True
