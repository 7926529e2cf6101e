"""readable_size: pytorch_memlab's exact strings."""

import math

import pytest
import torch

from memlab_rs import readable_size


@pytest.mark.parametrize(
    "num_bytes, text",
    [
        (0, "0.00B"),
        (512, "512.00B"),
        (1024, "1.00K"),
        (1048575, "1024.00K"),
        (4 * 1024 * 1024, "4.00M"),
        (-2048, "-2.00K"),
        (1152, "1.12K"),  # 1.125 is a tie: rounded half to even, as Python does
        (3 * 1024**3 + 1, "3.00G"),
        (5 * 1024**4, "5.00T"),
        (7 * 1024**5, "7.00P"),
        (1024**6, "1024.00P"),
        (0.5, "0.50B"),
        (1536.0, "1.50K"),
    ],
)
def test_exact_strings(num_bytes, text):
    assert readable_size(num_bytes) == text


def test_nan_is_empty():
    assert readable_size(float("nan")) == ""


def test_agrees_with_pytorch_memlab_everywhere():
    from pytorch_memlab.utils import readable_size as theirs

    values = [0, 1, 511, 512, 1023, 1024, 1025, 2**20 - 1, 2**20, 2**30 + 2**29, 2**53 + 1, 2**70]
    values += [-v for v in values] + [k * 1000.5 for k in range(0, 5000, 37)]
    values += [int(1.7**k) for k in range(120)]
    for v in values:
        assert readable_size(v) == theirs(v), v


def test_numpy_scalars_are_numbers():
    import numpy as np

    assert readable_size(np.int64(4096)) == "4.00K"


def test_symbolic_size_prints_as_its_str():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    sym = env.create_unbacked_symint()
    assert isinstance(sym, torch.SymInt)
    assert readable_size(sym) == str(sym)


def test_bad_input_names_the_problem():
    with pytest.raises(TypeError, match="readable_size\\(\\) expects a number of bytes"):
        readable_size("4K")


def test_inf_like_pytorch_memlab():
    assert readable_size(math.inf) == "infP"


# -- parse_size: sizes as people write them, exact ------------------------------------------


@pytest.mark.parametrize(
    "text, num_bytes",
    [
        ("512 MB", 512_000_000),
        ("1.5GiB", 1_610_612_736),
        ("2 GB", 2_000_000_000),
        ("1048576", 1_048_576),  # a bare number is bytes
        ("2 MiB", 2 * 1024 * 1024),
        ("512 KiB", 512 * 1024),
        ("512kib", 512 * 1024),  # any case
        ("1K", 1000),
        ("1Ki", 1024),
        ("0 B", 0),
        ("4.1 MB", 4_100_000),  # bytesize's f64 product would give 4099999
        ("0.5 KiB", 512),
        ("18446744073709551615", 2**64 - 1),
        (4096, 4096),  # an int is bytes
        (0, 0),
    ],
)
def test_parse_size_exact(text, num_bytes):
    from memlab_rs._core import parse_size

    assert parse_size(text) == num_bytes


@pytest.mark.parametrize(
    "value, error, message",
    [
        ("", ValueError, "'' is not a size: it is empty; give a whole number of bytes"),
        ("lots", ValueError, "'lots' is not a size: it does not start with a number; give"),
        ("-1 MB", ValueError, "'-1 MB' is not a size: a size cannot be negative; give"),
        ("2 GBs", ValueError, "'2 GBs' is not a size: 'GBs' is not a unit; give"),
        ("0.1 KiB", ValueError, "it is 102.4 bytes, not a whole number of bytes"),
        ("16 EiB", ValueError, "it is more than 18446744073709551615 bytes"),
        (-1, ValueError, "-1 is not a size: a size cannot be negative"),
        (2**64, ValueError, "18446744073709551616 is not a size: more than"),
        (1.5, TypeError, "a size must be a string or an int of bytes, not float (1.5)"),
        (True, TypeError, "a size must be a string or an int of bytes, not bool (True)"),
        (None, TypeError, "not NoneType (None); give a whole number of bytes (1048576) or"),
    ],
)
def test_parse_size_rejects(value, error, message):
    from memlab_rs._core import parse_size

    with pytest.raises(error) as raised:
        parse_size(value)
    assert message in str(raised.value).replace('"', "'")
