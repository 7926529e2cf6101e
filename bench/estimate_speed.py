"""How long a GPT-2 124M estimate takes, end to end: importing torch, transformers and
memlab_rs, building GPT2LMHeadModel(n_layer=12, n_embd=768, n_head=12) on the meta device,
and estimating a step at 8 x 512 tokens with AdamW (two steps: the second is the steady one).

Run: ``python bench/estimate_speed.py`` (needs transformers).
"""

import time

t0 = time.perf_counter()
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import memlab_rs  # noqa: E402

t1 = time.perf_counter()
with torch.device("meta"):
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12))
ids = torch.zeros(8, 512, dtype=torch.long)
est = memlab_rs.estimate(model, {"input_ids": ids, "labels": ids}, optimizer=torch.optim.AdamW)
t2 = time.perf_counter()
print(
    f"imports {t1 - t0:.2f} s, build on meta + estimate {t2 - t1:.2f} s "
    f"(estimate alone {est.seconds:.2f} s), total {t2 - t0:.2f} s, "
    f"peak allocated {est.peak_allocated} bytes, {est.allocations} storages"
)
