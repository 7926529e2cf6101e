"""MemReporter speed: memlab_rs vs pytorch_memlab 0.3.2 on one process, side by side.

The process holds a 12-layer GPT-2-sized transformer after one AdamW step (parameters,
grads, optimizer state) and a large list of dicts, about 350,000 gc objects in all, on CPU.
Both reporters run alternately on the same process; we print median times and the ratio,
and apart from them the first report in the process (the only one that walks every list).

    python bench/reporter_walk.py [--repeats 15] [--objects 350000]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import time
import warnings

import torch

import memlab_rs
from memlab_rs.models import TinyGPT


def build_process(target_objects: int):
    torch.manual_seed(0)
    model = TinyGPT(vocab=50257, dim=768, layers=12, heads=12, context=1024)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 50257, (1, 65))
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(
        logits.reshape(-1, 50257), tokens[:, 1:].reshape(-1)
    ).backward()
    optimizer.step()
    del logits
    # Dicts holding a list are tracked by gc (two objects each), like parsed JSON records.
    records = []
    while len(gc.get_objects()) < target_objects:
        records.extend({"id": i, "tags": [i]} for i in range(10_000))
    return model, optimizer, records


def time_report(make_reporter) -> float:
    sink = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        make_reporter().report()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--objects", type=int, default=350_000)
    args = parser.parse_args()

    warnings.simplefilter("ignore")  # pytorch_memlab's walk triggers FutureWarnings
    import pytorch_memlab

    model, optimizer, records = build_process(args.objects)

    def ours():
        reporter = memlab_rs.MemReporter(model)
        reporter.add_optimizer(optimizer)
        return reporter

    def theirs():
        reporter = pytorch_memlab.MemReporter(model)
        reporter.add_optimizer(optimizer)
        return reporter

    # The first report in a process walks every gc list; later ones resume where the last
    # walk ended (see src/gc_walk/lists.rs), so time the first of each apart.
    first = {"memlab_rs": time_report(ours), "pytorch_memlab": time_report(theirs)}
    n_objects = len(gc.get_objects())
    n_tensors = len(memlab_rs.MemReporter(model).collect().rows)
    times = {"memlab_rs": [], "pytorch_memlab": []}
    for _ in range(args.repeats):  # alternate, so drift hits both alike
        times["pytorch_memlab"].append(time_report(theirs))
        times["memlab_rs"].append(time_report(ours))
    floor, walks, facts = [], [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        gc.get_objects()
        floor.append(time.perf_counter() - start)
        stats = ours().collect().to_data()["walk"]
        walks.append(stats["walk_seconds"])
        facts.append(stats["facts_seconds"])
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"process: {n_objects} gc objects, {n_tensors} report rows, torch {torch.__version__}")
    print(
        f"first report in the process: memlab_rs {first['memlab_rs'] * 1e3:.2f} ms, "
        f"pytorch_memlab {first['pytorch_memlab'] * 1e3:.2f} ms: "
        f"{first['pytorch_memlab'] / first['memlab_rs']:.1f}x"
    )
    for name, t in med.items():
        print(f"{name:>15}: median {t * 1e3:8.2f} ms over {args.repeats} reports")
    print(f"speed-up (pytorch_memlab / memlab_rs): {med['pytorch_memlab'] / med['memlab_rs']:.1f}x")
    print(
        f"memlab_rs medians: walk via {stats['strategy']} {statistics.median(walks) * 1e3:.2f} ms,"
        f" tensor facts {statistics.median(facts) * 1e3:.2f} ms; "
        f"gc.get_objects() alone: {statistics.median(floor) * 1e3:.2f} ms"
    )
    del records


if __name__ == "__main__":
    main()
