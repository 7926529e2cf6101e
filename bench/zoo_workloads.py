"""The validation zoo's workloads (``bench/estimate_zoo.py``; a test may import them too).

Models people train, built with random weights from torchvision and transformers (nothing
downloaded), at small-to-medium sizes: CNNs of several kinds and a plain VGG-like conv stack,
vision transformers, encoders with a masked-LM head, decoder-only LMs with and without
grouped-query attention, encoder-decoders and a mixture of experts. Each ``Workload`` builds
its model on the CPU (``build()``) and its example inputs and targets (``make_inputs()``, CPU
tensors); a ``Row`` is a workload with its settings: precision, optimizer and its
implementation, activation checkpointing of the repeated blocks.

``rows(device, quick)`` is the zoo: every model in the four precisions with its family's usual
optimizer (CNNs SGD with momentum, transformers AdamW, foreach), an optimizer sweep (the six
forms) on four models in fp32, and checkpointing on six models in fp32 and autocast bf16. On
the CPU the inputs are smaller (a 2-core machine runs them); ``quick`` keeps the small models.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memlab_rs.estimation.checkpointing import enable_checkpointing as checkpoint_repeated_blocks

PRECISIONS = ("fp32", "bf16", "amp-bf16", "amp-fp16")
OPTIMIZERS = ("sgd", "adam", "adamw")
IMPLS = ("foreach", "fused")


@dataclass(frozen=True)
class Workload:
    name: str
    family: str  # cnn, vit, encoder, decoder, decoder-gqa, enc-dec, moe
    build: Callable[[], nn.Module] = field(compare=False, repr=False)
    make_inputs: Callable[[], tuple[Any, Any]] = field(compare=False, repr=False)
    shape: str  # the inputs, for the settings column
    small: bool  # in --quick
    hf: bool  # a transformers model: the loss is its output's, given labels
    # The family's usual optimizer.
    optimizer: str = "adamw"

    def loss_fn(self) -> Callable[..., torch.Tensor] | None:
        return None if self.hf else F.cross_entropy


@dataclass(frozen=True)
class Row:
    workload: Workload
    precision: str = "fp32"  # fp32, bf16 (model and inputs cast), amp-bf16, amp-fp16 (GradScaler)
    optimizer: str = "adamw"  # sgd (momentum 0.9), adam, adamw
    impl: str = "foreach"  # foreach or fused
    checkpointing: bool = False
    instance: bool = False  # also estimate with the optimizer instance (optimizer=opt)

    @property
    def settings(self) -> str:
        text = f"{self.precision} {self.optimizer}-{self.impl}"
        return text + (" ckpt" if self.checkpointing else "")

    @property
    def name(self) -> str:
        return f"{self.workload.name} {self.settings}"

    @property
    def autocast(self) -> torch.dtype | None:
        return {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(self.precision)

    @property
    def dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None

    @property
    def grad_scaler(self) -> bool:
        return self.precision == "amp-fp16"

    def optimizer_spec(self) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
        """The optimizer class and its keyword arguments."""
        flag = {"foreach": True} if self.impl == "foreach" else {"fused": True}
        if self.optimizer == "sgd":
            return torch.optim.SGD, {"lr": 0.01, "momentum": 0.9, **flag}
        if self.optimizer == "adam":
            return torch.optim.Adam, {"lr": 1e-3, **flag}
        return torch.optim.AdamW, {"lr": 1e-3, **flag}


# -- checkpointing -------------------------------------------------------------------------


def enable_checkpointing(model: nn.Module, workload: Workload) -> None:
    """The library's checkpointing of the repeated blocks (what ``estimate(...,
    checkpointing=True)`` applies to its fake copy), on the real model."""
    del workload  # every workload checkpoints its repeated blocks the same way
    checkpoint_repeated_blocks(model)


# -- torchvision -------------------------------------------------------------------------


class PlainConvNet(nn.Module):
    """A plain VGG-like conv stack (no batch norm): conv-ReLU pairs and max pooling, then a
    linear classifier."""

    def __init__(self, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for width in (64, 64, "pool", 128, 128, "pool", 256, 256, "pool"):
            if width == "pool":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(channels, int(width), 3, padding=1), nn.ReLU(inplace=True)]
                channels = int(width)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _images(batch: int, size: int, classes: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g)
    return x, torch.randint(0, classes, (batch,), generator=g)


def _torchvision(name: str, **kwargs: Any) -> nn.Module:
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None, **kwargs)


def _vision(name, family, batch, size, small, builder, classes=1000, optimizer="sgd") -> Workload:
    return Workload(
        name=name,
        family=family,
        build=builder,
        make_inputs=functools.partial(_images, batch, size, classes),
        shape=f"{batch}x3x{size}x{size}",
        small=small,
        hf=False,
        optimizer=optimizer,
    )


# -- transformers ------------------------------------------------------------------------


def _hf_model(cls_name: str, config_name: str, attn: str, **config: Any) -> nn.Module:
    """A transformers model from its config, with `attn` attention where the class has it
    (else its default: the table says which ran, from ``config._attn_implementation``)."""
    import transformers

    cfg_cls = getattr(transformers, config_name)
    model_cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    try:
        return model_cls(cfg_cls(attn_implementation=attn, **config))
    except ValueError:  # "does not support an attention implementation through ..."
        torch.manual_seed(0)
        return model_cls(cfg_cls(**config))


def _tokens(batch: int, seq: int, vocab: int, **extra: Any) -> tuple[dict[str, Any], None]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    inputs: dict[str, Any] = {"input_ids": ids}
    if extra.get("mlm"):
        labels = ids.clone()
        labels[torch.rand(batch, seq, generator=g) > 0.15] = -100  # MLM: 15% predicted
        inputs["labels"] = labels
    elif extra.get("target_seq"):
        inputs["labels"] = torch.randint(0, vocab, (batch, extra["target_seq"]), generator=g)
    else:
        inputs["labels"] = ids
    return inputs, None


def _hf_images(batch: int, size: int, classes: int) -> tuple[dict[str, Any], None]:
    x, y = _images(batch, size, classes)
    return {"pixel_values": x, "labels": y}, None


def _text(name, family, cls_name, config_name, batch, seq, small, attn="sdpa", **config):
    vocab = config["vocab_size"]
    extra = {k: config.pop(k) for k in ("mlm", "target_seq") if k in config}
    target = f"->{extra['target_seq']}" if "target_seq" in extra else ""
    return Workload(
        name=name,
        family=family,
        build=functools.partial(_hf_model, cls_name, config_name, attn, **config),
        make_inputs=functools.partial(_tokens, batch, seq, vocab, **extra),
        shape=f"{batch}x{seq}{target}",
        small=small,
        hf=True,
    )


def _decoder(hidden: int, layers: int, heads: int, kv: int, vocab: int = 32000, **more) -> dict:
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=hidden * 8 // 3 // 64 * 64,
        vocab_size=vocab,
        max_position_embeddings=2048,
        use_cache=False,
        **more,
    )


# -- the zoo -----------------------------------------------------------------------------


def workloads(device: str = "cuda") -> list[Workload]:
    """Every model of the zoo, sized for `device`: on "cuda" CNNs at batch 16-32 and 224 px
    (the plain stack 128 px), transformers 512 wide with 4-6 layers at 8-16 x 256-512 tokens;
    on "cpu" (a 2-core machine runs them) CNNs at 8 x 64 px, vision transformers at 2 x 112
    px, the others 256 wide with 2 layers, an 8,192-token vocabulary and 4 x 256 tokens (so
    that activations, not only the optimizer, set the peak)."""
    cpu = device == "cpu"
    wide = 256 if cpu else 512  # transformers' hidden size
    deep = 2 if cpu else 4  # and layers

    def img(gpu_batch: int, gpu_size: int = 224) -> tuple[int, int]:
        return (8, 64) if cpu else (gpu_batch, gpu_size)

    def seq(gpu_batch: int, gpu_seq: int) -> tuple[int, int]:
        return (4, 256) if cpu else (gpu_batch, gpu_seq)

    def vocab(gpu: int) -> int:
        return 8192 if cpu else gpu

    out: list[Workload] = []
    for name, batch, small in [
        ("resnet18", 32, True),
        ("resnet50", 32, False),
        ("resnext50_32x4d", 16, False),
        ("mobilenet_v2", 32, True),
        ("mobilenet_v3_large", 32, False),
        ("efficientnet_b0", 32, False),
        ("convnext_tiny", 16, False),
        ("regnet_y_400mf", 32, False),
        ("densenet121", 16, False),
        ("vgg11_bn", 16, False),
        ("squeezenet1_1", 32, True),
        ("shufflenet_v2_x1_0", 32, False),
    ]:
        b, px = img(batch)
        out.append(_vision(name, "cnn", b, px, small, functools.partial(_torchvision, name)))
    b, px = img(32, 128)
    out.append(_vision("plain_vgg", "cnn", b, px, True, _plain_conv_net, classes=10))

    # Vision transformers (torchvision's at their own size, 224 px).
    b = 2 if cpu else 16
    for name in ("vit_b_16", "swin_t"):
        builder = functools.partial(_torchvision, name)
        out.append(_vision(name, "vit", b, 224, False, builder, optimizer="adamw"))
    px = 112 if cpu else 224
    vit = dict(hidden_size=wide * 3 // 4, num_hidden_layers=deep + 2, num_attention_heads=6)
    out.append(
        Workload(
            name="hf_vit",
            family="vit",
            build=functools.partial(
                _hf_model,
                "ViTForImageClassification",
                "ViTConfig",
                "sdpa",
                intermediate_size=vit["hidden_size"] * 4,
                image_size=px,
                patch_size=16,
                num_labels=1000,
                **vit,
            ),
            make_inputs=functools.partial(_hf_images, b, px, 1000),
            shape=f"{b}x3x{px}x{px}",
            small=True,
            hf=True,
        )
    )

    # Encoders with a masked-LM head.
    b, n = seq(16, 256)
    enc = dict(
        hidden_size=wide,
        num_hidden_layers=deep,
        num_attention_heads=8,
        intermediate_size=wide * 4,
        mlm=True,
    )
    out.append(
        _text(
            "bert",
            "encoder",
            "BertForMaskedLM",
            "BertConfig",
            b,
            n,
            True,
            vocab_size=vocab(30522),
            **enc,
        )
    )
    out.append(
        _text(
            "roberta",
            "encoder",
            "RobertaForMaskedLM",
            "RobertaConfig",
            b,
            n,
            False,
            vocab_size=vocab(50265),
            max_position_embeddings=514,
            **enc,
        )
    )
    out.append(
        _text(
            "distilbert",
            "encoder",
            "DistilBertForMaskedLM",
            "DistilBertConfig",
            b,
            n,
            False,
            vocab_size=vocab(30522),
            dim=wide,
            n_layers=deep,
            n_heads=8,
            hidden_dim=wide * 4,
            mlm=True,
        )
    )

    # Decoder-only LMs, with and without grouped-query attention.
    b, n = seq(8, 512)
    out.append(
        _text(
            "gpt2",
            "decoder",
            "GPT2LMHeadModel",
            "GPT2Config",
            b,
            n,
            True,
            vocab_size=vocab(50257),
            n_embd=wide,
            n_layer=deep + 2,
            n_head=8,
            use_cache=False,
        )
    )
    llama = _decoder(wide, deep, 8, 8, vocab(32000))
    gqa = _decoder(wide, deep, 8, 2, vocab(32000))
    out.append(_text("llama", "decoder", "LlamaForCausalLM", "LlamaConfig", b, n, False, **llama))
    out.append(
        _text("llama_gqa", "decoder-gqa", "LlamaForCausalLM", "LlamaConfig", b, n, True, **gqa)
    )
    out.append(
        _text(
            "mistral_gqa", "decoder-gqa", "MistralForCausalLM", "MistralConfig", b, n, False, **gqa
        )
    )
    out.append(
        _text("qwen2_gqa", "decoder-gqa", "Qwen2ForCausalLM", "Qwen2Config", b, n, False, **gqa)
    )
    plain = dict(
        vocab_size=vocab(32000),
        hidden_size=wide,
        num_hidden_layers=deep,
        num_attention_heads=8,
        use_cache=False,
    )
    out.append(
        _text(
            "gpt_neox",
            "decoder",
            "GPTNeoXForCausalLM",
            "GPTNeoXConfig",
            b,
            n,
            False,
            intermediate_size=wide * 4,
            **plain,
        )
    )
    out.append(
        _text(
            "opt",
            "decoder",
            "OPTForCausalLM",
            "OPTConfig",
            b,
            n,
            False,
            ffn_dim=wide * 4,
            word_embed_proj_dim=wide,
            max_position_embeddings=2048,
            **plain,
        )
    )

    # Encoder-decoders: source tokens in, a shorter target (the labels) out.
    b, n = seq(8, 256)
    target = 32 if cpu else 64
    out.append(
        _text(
            "t5",
            "enc-dec",
            "T5ForConditionalGeneration",
            "T5Config",
            b,
            n,
            True,
            vocab_size=vocab(32128),
            d_model=wide,
            d_kv=64,
            d_ff=wide * 4,
            num_layers=deep,
            num_decoder_layers=deep,
            num_heads=8,
            pad_token_id=0,
            decoder_start_token_id=0,
            use_cache=False,
            target_seq=target,
        )
    )
    out.append(
        _text(
            "bart",
            "enc-dec",
            "BartForConditionalGeneration",
            "BartConfig",
            b,
            n,
            False,
            vocab_size=vocab(50265),
            d_model=wide,
            encoder_layers=deep,
            decoder_layers=deep,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=wide * 4,
            decoder_ffn_dim=wide * 4,
            use_cache=False,
            target_seq=target,
        )
    )

    # A mixture of experts (routing is data-dependent: the estimate may refuse it).
    b, n = seq(8, 256)
    moe = _decoder(256, 2, 4, 2, vocab(32000), num_local_experts=4, num_experts_per_tok=2)
    out.append(
        _text("mixtral_moe", "moe", "MixtralForCausalLM", "MixtralConfig", b, n, True, **moe)
    )
    return out


def _plain_conv_net() -> nn.Module:
    torch.manual_seed(0)
    return PlainConvNet()


# The optimizer sweep (all six forms, fp32) and the checkpointing rows (fp32, autocast bf16);
# --quick keeps fewer of them.
SWEEP = ("resnet18", "vit_b_16", "bert", "llama_gqa")
CHECKPOINTED = ("resnet18", "resnet50", "vit_b_16", "bert", "gpt2", "llama_gqa")
QUICK_SWEEP = ("resnet18",)
QUICK_CHECKPOINTED = ("resnet18", "gpt2")


# torch's CPU has no fast float16 convolution (a plain conv stack's three steps under fp16
# autocast took 460 s on a 2-core Xeon): on the CPU the CNNs leave that precision out.
CPU_LEFT_OUT = ("cnn", "amp-fp16")


def rows(device: str = "cuda", quick: bool = False) -> list[Row]:
    """The zoo's rows, grouped by model (each model is built once)."""
    out: list[Row] = []
    sweeps = QUICK_SWEEP if quick else SWEEP
    checkpointed = QUICK_CHECKPOINTED if quick else CHECKPOINTED
    for w in workloads(device):
        if quick and not w.small:
            continue
        usual = w.optimizer
        sweep = w.name in sweeps
        for precision in PRECISIONS:
            if device == "cpu" and (w.family, precision) == CPU_LEFT_OUT:
                continue
            out.append(Row(w, precision, usual, "foreach", instance=sweep and precision == "fp32"))
        if sweep:
            for opt in OPTIMIZERS:
                for impl in IMPLS:
                    if (opt, impl) != (usual, "foreach"):
                        out.append(Row(w, "fp32", opt, impl, instance=True))
        if w.name in checkpointed:
            for precision in ("fp32", "amp-bf16"):
                out.append(Row(w, precision, usual, "foreach", checkpointing=True))
    return out
