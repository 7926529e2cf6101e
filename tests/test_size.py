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
