"""A model-based randomized check of the gc walk, run as a script in a fresh interpreter.

Each sequence is a random program: objects are created in containers, dropped, put in
reference cycles (some with finalisers or weakref callbacks that walk while the collector
runs), collected by generation, frozen and unfrozen, churned through automatic collections;
at random points (not after every step) the walk runs and must return exactly the objects
the model knows to be alive: those whose weak reference still resolves, plus those a
finaliser resurrected. Each walk is also checked against ``gc.get_objects()``.

    python gc_walk_model.py --kind node --sequences 2000 --seed 1

``--kind node`` walks for instances of a plain class (no torch: the walk itself, on any
CPython); ``--kind tensor`` walks for torch tensors through ``tracked_tensors``. Prints one
line, ``OK <walks> walks, strategies: ...``, or raises with the sequence, step and difference.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import weakref


class Node:
    """What the torch-free walk looks for."""


class Holder:
    """A cycle member that is not one of the objects looked for."""


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=["node", "tensor"], required=True)
    p.add_argument("--sequences", type=int, default=100)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--resume",
        action="store_true",
        help="ask the walk to resume from the last one (the tracker's walk; 3.12/3.13 too)",
    )
    return p.parse_args()


def load_core():
    """``memlab_rs._core`` without the package's ``__init__``, which imports torch: the node
    walk then runs in a small interpreter (and proves the walk needs no torch)."""
    import importlib.machinery
    import importlib.util
    import os

    spec = importlib.util.find_spec("memlab_rs")
    folder = os.path.dirname(spec.origin)
    for name in os.listdir(folder):
        if name.startswith("_core.") and name.endswith((".so", ".pyd")):
            path = os.path.join(folder, name)
            loader = importlib.machinery.ExtensionFileLoader("memlab_rs._core", path)
            module_spec = importlib.util.spec_from_file_location(
                "memlab_rs._core", path, loader=loader
            )
            module = importlib.util.module_from_spec(module_spec)
            loader.exec_module(module)
            return module
    raise RuntimeError(f"no memlab_rs._core extension in {folder}")


def main():
    args = parse()
    if args.kind == "tensor":
        from memlab_rs import _core
    else:
        _core = load_core()
        assert "torch" not in sys.modules, "the node walk must run without torch"

    if args.kind == "tensor":
        import torch

        base = torch._C.TensorBase

        def make():
            return torch.empty(1)

        def walk(held):
            result = _core.tracked_tensors(held, args.resume)
            return result[0], result[1]

    else:
        base = Node
        make = Node

        def walk(held):
            result = _core._instances_of(Node, held, args.resume)
            return result[0], result[1]

    state = {"walks": 0, "strategies": set(), "registering": False}
    failures: list = []  # raising inside a finaliser or callback would only print a warning
    resurrected: list = []
    # Resurrected by a finaliser of the collection under way: back in the collector's lists
    # (and so findable) only once that collection ends.
    pending: list = []
    refs: list = []  # weak references to every object of the kind ever made

    def expected_ids():
        refs[:] = [r for r in refs if r() is not None]
        alive = {id(r()) for r in refs}
        return (alive | {id(o) for o in resurrected}) - {id(o) for o in pending}

    def check(where, held=()):
        if state["registering"]:
            return  # a nested check while `new()` has an object the model does not know yet
        found, strategy = walk(list(held))
        ours = sorted(id(o) for o in found)
        want = sorted(expected_ids())
        state["walks"] += 1
        state["strategies"].add(strategy)
        if ours != want:
            missing = len(set(want) - set(ours))
            extra = len(set(ours) - set(want))
            failures.append(
                f"{where}: walk ({strategy}) found {len(ours)}, model has {len(want)}: "
                f"{missing} missing, {extra} extra"
            )
        if state["walks"] % 4:
            return
        # gc.get_objects() leaves frozen objects out: it must be a subset of ours.
        listed = {id(o) for o in gc.get_objects() if issubclass(type(o), base)}
        if not listed <= set(ours):
            failures.append(f"{where}: gc.get_objects() lists objects the walk missed")
        del found

    def new():
        # Making the object or its weak reference may run a collection, whose callbacks and
        # finalisers walk: until the model knows the object, those walks are not checked.
        state["registering"] = True
        obj = make()
        refs.append(weakref.ref(obj))
        state["registering"] = False
        return obj

    class Finalised:
        """A cycle member whose finaliser walks (during a collection) and may resurrect."""

        def __init__(self, where, resurrect):
            self.where = where
            self.resurrect = resurrect
            self.me = self
            self.payload = new()

        def __del__(self):
            check(f"{self.where} (finaliser)")
            if self.resurrect:
                resurrected.append(self.payload)
                pending.append(self.payload)

    def on_collect(phase, info):
        if phase == "stop":
            pending.clear()
        if state.get("walk_in_callbacks"):
            check(f"gc callback {phase} gen {info['generation']}")

    gc.callbacks.append(on_collect)
    for sequence in range(args.sequences):
        rng = random.Random(args.seed * 100_003 + sequence)
        live: list = []
        frozen = False
        state["walk_in_callbacks"] = False
        for step in range(args.steps):
            where = f"sequence {sequence}, step {step}"
            op = rng.randrange(15)
            if op == 0:
                live.append([new() for _ in range(rng.randrange(1, 6))])
            elif op == 1 and live:
                live.pop(rng.randrange(len(live)))
            elif op == 2:
                cycle = {"obj": new()}
                cycle["self"] = cycle  # only the collector frees this
                if rng.random() < 0.5:
                    live.append(cycle)
            elif op == 3:
                gc.collect(rng.randrange(3))
            elif op == 4:
                churn = [[i] for i in range(rng.randrange(5000))]  # automatic collections
                live.append(new())
                del churn
            elif op == 5:
                Finalised(where, resurrect=rng.random() < 0.3)  # garbage at once: a cycle
            elif op == 6:
                (gc.unfreeze if frozen else gc.freeze)()
                frozen = not frozen
            elif op == 7:
                gc.freeze()
                live.append(new())
                gc.unfreeze()
                frozen = False
            elif op == 8 and live:
                live[rng.randrange(len(live))] = None
            elif op == 9:
                # A weakref callback that walks, run when the cycle is collected.
                target = {"obj": new()}
                target["self"] = target
                holder = Holder()
                holder.ref = weakref.ref(holder, lambda _r, w=where: check(f"{w} (weakref)"))
                holder.other = holder
                del holder, target
            elif op == 10:
                state["walk_in_callbacks"] = rng.random() < 0.5
            elif op == 11 and resurrected:
                resurrected.pop()
            elif op == 12:
                # The sentinel into generation 2, then new objects ahead of it through a
                # freeze and an unfreeze (with or without a collection between).
                live.append(new())
                gc.collect(1)
                live.append([new() for _ in range(rng.randrange(1, 4))])
                gc.collect(0) if rng.random() < 0.5 else None
                gc.freeze()
                live.append(new())
                if rng.random() < 0.5:
                    gc.collect(rng.randrange(3))
                gc.unfreeze()
                frozen = False
            elif op == 13:
                # Generation 0 collections only: the sentinel moves to generation 1.
                live.append(new())
                gc.collect(0)
                live.append(new())
            held = [o for o in live if isinstance(o, base)][: rng.randrange(4)]
            if rng.random() < 0.35:
                check(where, held)
            del held
        state["walk_in_callbacks"] = False
        if frozen:
            gc.unfreeze()
        live.clear()
        check(f"sequence {sequence}, end")
    gc.callbacks.remove(on_collect)
    if failures:
        raise AssertionError(f"{len(failures)} walks disagreed:\n" + "\n".join(failures[:20]))
    print(f"OK {state['walks']} walks, strategies: {sorted(state['strategies'])}")


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    main()
