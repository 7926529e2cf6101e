"""The original tensor tracker's README example (Pytorch-Memory-Utils' ``gpu_mem_track``):
torchvision's VGG-19 ``features`` moved to the GPU, then five dummy tensors made and two
moved back, a ``track()`` between steps. Its rows as that README prints them, and the
model built by hand (no torchvision, no download: the weights' values do not matter)."""

from __future__ import annotations

import torch
from torch import nn

# VGG-19 ("E"): convolution widths, "M" a max pool.
VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M"] + [512, 512, 512, 512, "M"] * 2

PARAMETER = "<class 'torch.nn.parameter.Parameter'> | torch.float32"
TENSOR = "<class 'torch.Tensor'> | torch.float32"


def vgg19_features() -> nn.Sequential:
    layers: list[nn.Module] = []
    channels = 3
    for width in VGG19:
        if width == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(channels, int(width), 3, padding=1), nn.ReLU(inplace=True)]
            channels = int(width)
    return nn.Sequential(*layers)


# Each track()'s rows, as the README prints them (in a set's order there), and the
# "Total Tensor Used Memory" printed after them.
README_BLOCKS: list[tuple[set[str], str]] = [
    (
        {
            f"+ | 1 * Size:(64, 64, 3, 3)       | Memory: 0.1406 M | {PARAMETER}",
            f"+ | 1 * Size:(128, 128, 3, 3)     | Memory: 0.5625 M | {PARAMETER}",
            f"+ | 1 * Size:(256, 128, 3, 3)     | Memory: 1.125 M | {PARAMETER}",
            f"+ | 1 * Size:(512, 256, 3, 3)     | Memory: 4.5 M | {PARAMETER}",
            f"+ | 3 * Size:(256, 256, 3, 3)     | Memory: 6.75 M | {PARAMETER}",
            f"+ | 8 * Size:(512,)               | Memory: 0.0156 M | {PARAMETER}",
            f"+ | 2 * Size:(64,)                | Memory: 0.0004 M | {PARAMETER}",
            f"+ | 7 * Size:(512, 512, 3, 3)     | Memory: 63.0 M | {PARAMETER}",
            f"+ | 4 * Size:(256,)               | Memory: 0.0039 M | {PARAMETER}",
            f"+ | 1 * Size:(128, 64, 3, 3)      | Memory: 0.2812 M | {PARAMETER}",
            f"+ | 2 * Size:(128,)               | Memory: 0.0009 M | {PARAMETER}",
            f"+ | 1 * Size:(64, 3, 3, 3)        | Memory: 0.0065 M | {PARAMETER}",
        },
        "76.4",
    ),
    (
        {
            f"+ | 1 * Size:(60, 3, 512, 512)    | Memory: 180.0 M | {TENSOR}",
            f"+ | 1 * Size:(40, 3, 512, 512)    | Memory: 120.0 M | {TENSOR}",
            f"+ | 1 * Size:(30, 3, 512, 512)    | Memory: 90.0 M | {TENSOR}",
        },
        "466.4",
    ),
    (
        {
            f"+ | 1 * Size:(120, 3, 512, 512)   | Memory: 360.0 M | {TENSOR}",
            f"+ | 1 * Size:(80, 3, 512, 512)    | Memory: 240.0 M | {TENSOR}",
        },
        "1066.4",
    ),
    (
        {
            f"- | 1 * Size:(40, 3, 512, 512)    | Memory: 120.0 M | {TENSOR}",
            f"- | 1 * Size:(120, 3, 512, 512)   | Memory: 360.0 M | {TENSOR}",
        },
        "586.4",
    ),
]


def parameter_groups() -> dict[tuple[int, ...], int]:
    """VGG-19 features' parameter shapes and how many of each."""
    groups: dict[tuple[int, ...], int] = {}
    with torch.device("meta"):
        model = vgg19_features()
    for p in model.parameters():
        groups[tuple(p.shape)] = groups.get(tuple(p.shape), 0) + 1
    return groups


def cuda_blocks(nbytes: int) -> int:
    """What CUDA's caching allocator hands out for a storage: a multiple of 512 bytes."""
    return (nbytes + 511) // 512 * 512


def numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())
