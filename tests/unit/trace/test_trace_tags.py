"""Module and phase tags (memlab_rs.trace.tags): the exact tag sequence each thread gets.

The tags are observed through the tagger's own ``setters`` argument: every tag change the
recorders (torch's CUDA history, the CPU recording) get goes to that callable too.
"""

from __future__ import annotations

import collections
import doctest
import gc
import itertools
import threading
import weakref

import pytest
import torch
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks
from torch.utils.checkpoint import checkpoint

import memlab_rs.trace.tags
from memlab_rs import _core
from memlab_rs.trace.tags import ModuleTagger, set_tag


def nested():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 4),
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()),
        torch.nn.Linear(4, 1),
    )


NESTED_FORWARD = [
    "forward:",
    "forward:0",
    "forward:",
    "forward:1",
    "forward:1.0",
    "forward:1",
    "forward:1.1",
    "forward:1",
    "forward:",
    "forward:2",
    "forward:",
    "",
]
NESTED_BACKWARD = ["backward:2", "backward:1.1", "backward:1.0", "backward:0", ""]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.ReLU()

    def forward(self, x):
        return self.b(self.a(x))


class Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.inp = torch.nn.Linear(4, 4)
        self.blk = Block()
        self.out = torch.nn.Linear(4, 1)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.inp(x)
        h = checkpoint(self.blk, h, use_reentrant=self.reentrant)
        return self.out(h)


class Boom(torch.nn.Module):
    def forward(self, x):
        raise ValueError("boom")


class CatchesBoom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.boom = Boom()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        try:
            self.boom(x)
        except ValueError:
            pass
        return self.lin(x)


class Mul(torch.nn.Module):
    def forward(self, a, b):
        return a * b


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(2, 2)
        self.l2 = torch.nn.Linear(2, 2)
        self.mul = Mul()
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.head(self.mul(self.l1(x), self.l2(x)))


def global_hook_dicts():
    """Copies of every global hook table torch keeps for modules and optimizers."""
    names = [
        (module_hooks, "_global_forward_pre_hooks"),
        (module_hooks, "_global_forward_hooks"),
        (module_hooks, "_global_forward_hooks_always_called"),
        (module_hooks, "_global_forward_hooks_with_kwargs"),
        (module_hooks, "_global_backward_pre_hooks"),
        (module_hooks, "_global_backward_hooks"),
        (optimizer_hooks, "_global_optimizer_pre_hooks"),
        (optimizer_hooks, "_global_optimizer_post_hooks"),
    ]
    return {name: dict(getattr(mod, name)) for mod, name in names if hasattr(mod, name)}


def test_nested_forward_tags_in_call_order():
    model = nested()
    tags = []
    with ModuleTagger(model, setters=[tags.append]):
        model(torch.randn(2, 4))
        assert tags == NESTED_FORWARD
    assert tags == NESTED_FORWARD + [""]  # uninstall clears the tag


def test_backward_tags_name_the_modules_in_reverse_order():
    model = nested()
    tags = []
    with ModuleTagger(model, setters=[tags.append]):
        loss = model(torch.randn(2, 4)).sum()
        del tags[:]
        loss.backward()
        assert tags == NESTED_BACKWARD
        # Again with an input that needs a gradient: the first layer's backward now ends.
        loss = model(torch.randn(2, 4, requires_grad=True)).sum()
        del tags[:]
        loss.backward()
        assert tags == NESTED_BACKWARD


def test_a_call_with_two_input_nodes_ends_when_both_have_run():
    model = TwoInputs()
    tags = []
    with ModuleTagger(model, setters=[tags.append]):
        loss = model(torch.ones(1, 2)).sum()
        del tags[:]
        loss.backward()
    # The CPU engine runs the later node (l2's) first.
    assert tags == ["backward:head", "backward:mul", "backward:l2", "backward:l1", "", ""]


def test_without_a_model_the_path_is_class_names():
    model = TwoInputs()
    tags = []
    with ModuleTagger(setters=[tags.append]):
        loss = model(torch.ones(1, 2)).sum()
        assert tags == [
            "forward:TwoInputs",
            "forward:TwoInputs.Linear",
            "forward:TwoInputs",
            "forward:TwoInputs.Linear",
            "forward:TwoInputs",
            "forward:TwoInputs.Mul",
            "forward:TwoInputs",
            "forward:TwoInputs.Linear",
            "forward:TwoInputs",
            "",
        ]
        del tags[:]
        loss.backward()
        # l1 and l2 have the same class path, so their backward is one tag.
        assert tags == [
            "backward:TwoInputs.Linear",
            "backward:TwoInputs.Mul",
            "backward:TwoInputs.Linear",
            "",
        ]


def test_shared_module_takes_its_first_name_and_outside_modules_their_class():
    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    outside = torch.nn.Tanh()
    tags = []
    with ModuleTagger(model, setters=[tags.append]):
        loss = outside(model(torch.ones(1, 2))).sum()
        assert tags == [
            "forward:",
            "forward:0",
            "forward:",
            "forward:1",
            "forward:",
            "forward:0",
            "forward:",
            "",
            "forward:Tanh",
            "",
        ]
        del tags[:]
        loss.backward()
        assert tags == ["backward:Tanh", "backward:0", "backward:1", "backward:0", ""]


def test_backward_false_tags_forward_only_and_hooks_no_graph():
    model = nested()
    tags = []
    with ModuleTagger(model, setters=[tags.append], backward=False) as tagger:
        loss = model(torch.randn(2, 4, requires_grad=True)).sum()
        assert tags == NESTED_FORWARD
        assert tagger._grad_handles == []
        del tags[:]
        loss.backward()
        assert tags == []
    model = Checkpointed(reentrant=False)
    with ModuleTagger(model, setters=[tags.append], backward=False):
        loss = model(torch.randn(2, 4)).sum()
        del tags[:]
        loss.backward()
    # The recomputation still runs module forwards, in backward; the end of the backward
    # puts the tag back.
    assert tags == [
        "backward:blk",
        "backward:blk.a",
        "backward:blk",
        "backward:blk.b",
        "backward:blk",
        "backward:",
        "",
        "",
    ]


def test_optimizer_step_is_tagged_with_its_class():
    model = nested()
    tags = []
    adam = torch.optim.Adam(model.parameters())
    with ModuleTagger(model, setters=[tags.append]):
        model(torch.randn(2, 4)).sum().backward()
        del tags[:]
        adam.step()
        assert tags == ["optimizer:Adam", ""]
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        del tags[:]
        sgd.step()
        assert tags == ["optimizer:SGD", ""]


def test_forward_and_backward_inside_an_optimizer_step():
    model = torch.nn.Sequential(torch.nn.Linear(2, 1))
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=1)
    x = torch.ones(3, 2)
    tags = []

    def closure():
        lbfgs.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    with ModuleTagger(model, setters=[tags.append]):
        lbfgs.step(closure)
    assert tags == [
        "optimizer:LBFGS",
        "forward:",
        "forward:0",
        "forward:",
        "optimizer:LBFGS",  # back in the step, outside the model
        "backward:0",
        "optimizer:LBFGS",  # the backward ended
        "",
        "",
    ]


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputation_is_tagged_backward(reentrant):
    model = Checkpointed(reentrant)
    tags = []
    with ModuleTagger(model, setters=[tags.append]):
        loss = model(torch.randn(2, 4)).sum()
        assert tags == [
            "forward:",
            "forward:inp",
            "forward:",
            "forward:blk",
            "forward:blk.a",
            "forward:blk",
            "forward:blk.b",
            "forward:blk",
            "forward:",
            "forward:out",
            "forward:",
            "",
        ]
        del tags[:]
        loss.backward()
    recompute = ["backward:blk", "backward:blk.a", "backward:blk", "backward:blk.b", "backward:blk"]
    if reentrant:
        # The checkpointed forward ran without grad, so backward knows the block only from
        # its recomputation, which runs a nested backward of its own.
        expected = [
            "backward:out",
            "backward:",
            *recompute,
            "backward:",
            "backward:blk.b",
            "backward:blk.a",
            "backward:",
            "backward:inp",
            "",
        ]
    else:
        # Backward enters the block from the first forward's hooks; ReLU's saved output
        # is recomputed when its node runs.
        expected = [
            "backward:out",
            "backward:blk.b",
            *recompute,
            "backward:blk.b",
            "backward:blk.a",
            "backward:inp",
            "",
        ]
    assert tags == expected + [""]
    assert not any(tag.startswith("forward") for tag in expected)


def test_an_exception_in_forward_leaves_no_stale_call():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), CatchesBoom(), torch.nn.Sequential(Boom()))
    tags = []
    with ModuleTagger(model, setters=[tags.append]):
        with pytest.raises(ValueError, match="boom"):
            model(torch.ones(1, 2))
        assert tags == [
            "forward:",
            "forward:0",
            "forward:",
            "forward:1",
            "forward:1.boom",
            "forward:1",  # the exception was caught inside 1
            "forward:1.lin",
            "forward:1",
            "forward:",
            "forward:2",
            "forward:2.0",
            "forward:2",
            "forward:",
            "",
        ]
        del tags[:]
        model[1](torch.ones(1, 2))
        assert tags == [
            "forward:1",
            "forward:1.boom",
            "forward:1",
            "forward:1.lin",
            "forward:1",
            "",
        ]


def test_two_threads_each_keep_their_own_calls():
    torch.manual_seed(0)
    models = {
        name: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        for name in ("a", "b")
    }
    root = torch.nn.ModuleDict(models)
    tags = collections.defaultdict(list)
    barrier = threading.Barrier(2)
    steps = 40

    def record(tag):
        tags[threading.current_thread().name].append(tag)

    def train(model):
        barrier.wait()
        for _ in range(steps):
            model(torch.randn(2, 4)).sum().backward()

    with ModuleTagger(root, setters=[record]):
        threads = [threading.Thread(target=train, args=(models[n],), name=n) for n in models]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for name in models:
        one_step = [
            f"forward:{name}",
            f"forward:{name}.0",
            f"forward:{name}",
            f"forward:{name}.1",
            f"forward:{name}",
            f"forward:{name}.2",
            f"forward:{name}",
            "",
            f"backward:{name}.2",
            f"backward:{name}.1",
            f"backward:{name}.0",
            "",
        ]
        assert tags[name] == one_step * steps
    assert tags["MainThread"] == [""]  # uninstall clears the installing thread's tag


def test_uninstall_puts_torch_global_hooks_back_and_removes_graph_hooks():
    model = nested()
    before = global_hook_dicts()
    tags = []
    tagger = ModuleTagger(model, setters=[tags.append]).install()
    assert global_hook_dicts() != before
    loss = model(torch.randn(2, 4)).sum()
    graph_hooks = [h.hooks_dict_ref() for h in tagger._grad_handles]
    assert graph_hooks and all(graph_hooks)  # hooks on the nodes of `loss`'s graph
    tagger.uninstall()
    assert global_hook_dicts() == before
    assert all(len(d) == 0 for d in graph_hooks)
    del tags[:]
    loss.backward()  # the graph recorded while installed runs no hook of ours
    model(torch.randn(2, 4))
    assert tags == []
    tagger.uninstall()  # a second uninstall does nothing


def test_install_twice_is_refused():
    first = ModuleTagger()
    with first:
        with pytest.raises(RuntimeError, match="installed already; call uninstall"):
            first.install()
        with pytest.raises(RuntimeError, match="another ModuleTagger is installed"):
            ModuleTagger().install()
    with ModuleTagger():  # once uninstalled, another one may be installed
        pass


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        ModuleTagger(model="gpt2")
    with pytest.raises(TypeError, match="each setter must be callable"):
        ModuleTagger(setters=["not callable"])
    with pytest.raises(TypeError, match="backward must be True or False"):
        ModuleTagger(backward="no")
    with pytest.raises(TypeError, match="tag must be a str"):
        set_tag(3)


def test_set_tag_is_replaced_at_the_next_module_boundary():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    tags = []
    with ModuleTagger(model, setters=[tags.append]):
        model(torch.ones(1, 2))
        set_tag("data loading")
        # The tagger's next tag is "" again after this forward, and must reach the setters.
        model(torch.ones(1, 2))
    assert tags == [
        "forward:",
        "forward:0",
        "forward:",
        "",
        "forward:",
        "forward:0",
        "forward:",
        "",
        "",
    ]


def test_the_graph_is_freed_as_soon_as_it_is_dropped():
    """The hooks hold no autograd node: a graph that is never backwarded goes with its last
    reference, not at the next garbage collection (saved activations would stay alive)."""

    class Box:
        def __init__(self, tensor):
            self.tensor = tensor

    boxes = []

    def pack(tensor):
        box = Box(tensor)
        boxes.append(weakref.ref(box))
        return box

    # GELU and Linear save their inputs (an op saving its output would make a cycle here).
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 4), torch.nn.GELU()
    )
    enabled = gc.isenabled()
    gc.disable()
    try:
        with ModuleTagger(model):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda box: box.tensor):
                out = model(torch.randn(2, 4))
            saved = len(boxes)
            assert saved >= 4 and all(ref() is not None for ref in boxes)
            del out
            assert [ref() for ref in boxes] == [None] * saved
    finally:
        if enabled:
            gc.enable()


def test_graph_hook_handles_stay_bounded_over_many_steps():
    model = nested()
    x = torch.randn(2, 4, requires_grad=True)  # a leaf: never hooked
    with ModuleTagger(model) as tagger:
        for _ in range(2000):
            model(x).sum().backward()
        assert len(tagger._grad_handles) < 2048


def test_docstring_examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(memlab_rs.trace.tags)
    assert len([t for t in tests if t.examples]) >= 4
    for test in tests:
        runner.run(test)
    assert runner.failures == 0


@pytest.mark.skipif(
    not hasattr(_core, "_cpu_trace_set_tag"),
    reason="this build's core has no CPU recording (_core._cpu_trace_*, issue 11's CPU tracer)",
)
def test_the_cpu_recording_gets_each_allocations_tag():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64),
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()),
        torch.nn.Linear(64, 1),
    )
    adam = torch.optim.Adam(model.parameters())
    x = torch.randn(32, 64)
    _core._cpu_trace_start(100_000)
    try:
        with ModuleTagger(model):
            loss = (model(x) ** 2).sum()
            loss.backward()
            adam.step()
        after = torch.empty(1000)  # noqa: F841 (uninstalled: untagged)
    finally:
        trace = _core._cpu_trace_stop()
    tags = [e["user_metadata"] for e in trace["device_traces"][0] if e["action"] == "alloc"]
    assert [tag for tag, _ in itertools.groupby(tags)] == [
        "forward:0",
        "forward:1.0",
        "forward:1.1",
        "forward:2",
        "",  # the loss and its gradient, outside the model
        "backward:2",
        "backward:1.1",
        "backward:1.0",
        "backward:0",
        "optimizer:Adam",
        "",
    ]
