"""MemReporter in a fresh interpreter (the `script` fixture): the whole report of a process
that holds only known tensors, the same output as pytorch_memlab's where pytorch_memlab is
right, gc order that only a new process has, odd tensor kinds, and an import that leaves
CUDA alone (what runs in the test process: tests/unit/tensor_report)."""

from __future__ import annotations

import textwrap


def test_whole_report_in_a_fresh_process(script):
    out = script(
        """
        import torch, memlab_rs
        lin = torch.nn.Linear(256, 256)
        x = torch.ones(64, 256)
        view = x[1:3]
        memlab_rs.MemReporter(lin).report(verbose=True)
        """
    )
    assert out == (
        "Element type                                            Size  Used MEM\n" + "-" * 79 + "\n"
        "Storage on cpu\n"
        "weight                                            (256, 256)   256.00K\n"
        "bias                                                  (256,)     1.00K\n"
        "Tensor0                                            (64, 256)    64.00K\n"
        "Tensor1(->Tensor0)                                  (2, 256)     0.00B\n" + "-" * 79 + "\n"
        "Total Tensors: 82688 \tUsed Memory: 321.00K\n" + "-" * 79 + "\n"
    )


def test_same_output_as_pytorch_memlab_where_it_is_right(script):
    # With one-byte elements and sizes in whole 512-byte blocks, pytorch_memlab's
    # arithmetic is right, so both tools must print the same bytes.
    program = """
        import torch, {mod}
        a = torch.zeros(1024, dtype=torch.uint8)
        b = torch.ones(4096, dtype=torch.int8)
        v = b[10:20]
        {mod}.MemReporter().report(verbose=True)
        """
    ours = script(program.format(mod="memlab_rs"))
    theirs = script(
        "import warnings; warnings.simplefilter('ignore')\n"
        + textwrap.dedent(program.format(mod="pytorch_memlab"))
    )
    # pytorch_memlab prints a CUDA notice at import on machines without a GPU
    theirs = theirs[theirs.index("Element type") :]
    assert ours == theirs


def test_grad_created_before_its_parameter_is_still_named(script):
    out = script(
        """
        import torch, memlab_rs
        grad = torch.full((300,), 2.0)          # gc lists this tensor first
        param = torch.nn.Parameter(torch.zeros(300))
        param.grad = grad
        del grad
        for r in memlab_rs.MemReporter().collect().rows:
            print(r.name, r.bytes)
        """
    )
    assert out.splitlines() == ["Parameter0 1200", "Parameter0.grad 1200"]


def test_nested_subclass_meta_and_fake_tensors(script):
    out = script(
        """
        import warnings; warnings.simplefilter("ignore")
        import torch, memlab_rs
        from torch._subclasses.fake_tensor import FakeTensorMode

        class Tagged(torch.Tensor):
            pass

        strided = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)])
        jagged = torch.nested.nested_tensor([torch.ones(2, 5), torch.ones(4, 5)],
                                            layout=torch.jagged)
        tagged = torch.arange(8.0).as_subclass(Tagged)
        meta = torch.empty(1000, device="meta")
        with FakeTensorMode():
            fake = torch.empty(1000)
        report = memlab_rs.MemReporter().collect()
        for r in report.rows:
            print(r.name, r.device, r.shape, r.bytes, r.shared_with, sep="|")
        print("meta total", report.total_bytes("meta"))
        """
    )
    rows = [line.split("|") for line in out.splitlines()[:-1]]
    by_shape = {}
    for name, device, shape, nbytes, shared in rows:
        by_shape.setdefault(shape, []).append((name, device, int(nbytes), shared))
    assert [entry[1:] for entry in by_shape["nested(2)"]] == [("cpu", 72, "None")]
    tagged = [r for r in rows if r[0].startswith("Tagged")]
    assert tagged and tagged[0][2] == "(8,)"
    assert sum(int(r[3]) for r in rows if r[2] == "(8,)") == 32
    fake = [r for r in rows if r[0].startswith("FakeTensor")]
    assert fake and fake[0][3] == "0"
    # the jagged tensor owns nothing itself: its values (6 x 5 floats) are counted once
    values = [r for r in rows if r[0].endswith("._values") and r[1] == "cpu"]
    assert values and values[0][2] == "(6, 5)"
    assert sum(int(r[3]) for r in rows if r[2] == "(6, 5)") == 120
    assert out.splitlines()[-1] == "meta total 0"


def test_import_does_not_initialise_cuda(script):
    out = script("import memlab_rs, torch; print(torch.cuda.is_initialized())")
    assert out.strip() == "False"


def test_pytorch_memlab_three_steps_give_its_shapes(script):
    # collect_tensor() -> get_stats() -> device_tensor_stat / print_stats(), on data where
    # pytorch_memlab's arithmetic is right (one-byte elements, whole 512-byte blocks).
    program = """
        import torch, {mod}
        model = torch.nn.Module()
        model.register_parameter("w", torch.nn.Parameter(torch.zeros(1024, dtype=torch.uint8),
                                                         requires_grad=False))
        b = torch.ones(4096, dtype=torch.int8)
        v = b[10:20]
        s = torch.zeros((), dtype=torch.uint8).expand(512).contiguous()[0]
        reporter = {mod}.MemReporter(model)
        reporter.collect_tensor()
        reporter.get_stats()
        print(repr(reporter.device_tensor_stat))
        reporter.print_stats(verbose=True, target_device=torch.device("cpu"))
        reporter.print_stats(target_device=torch.device("cpu"))
        """
    ours = script(program.format(mod="memlab_rs"))
    theirs = script(
        "import warnings; warnings.simplefilter('ignore')\n"
        + textwrap.dedent(program.format(mod="pytorch_memlab"))
    )
    theirs = theirs[theirs.index("{device") :]  # after pytorch_memlab's CUDA notice
    assert ours == theirs
    assert "'w', (1024,), 1024, 1024" in ours and "(->Tensor0)" in ours
