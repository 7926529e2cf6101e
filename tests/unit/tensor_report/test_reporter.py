"""MemReporter on CPU, in this process: exact bytes, names, dedup, odd tensors, exports, no
leaks (what needs a fresh interpreter: tests/integration/test_tensor_report_processes.py)."""

from __future__ import annotations

import gc
import importlib
import json
import signal
import time
import warnings
import weakref
from html.parser import HTMLParser

import pytest
import torch
from signal_alarms import alarms_into, spread

from memlab_rs import MemReporter
from memlab_rs.models import TinyGPT


def rows_by_name(report):
    return {r.name: r for r in report.rows}


def test_linear_weight_is_four_megabytes():
    linear = torch.nn.Linear(1024, 1024)
    rows = rows_by_name(MemReporter(linear).collect(device="cpu"))
    assert rows["weight"].bytes == 4 * 1024 * 1024
    assert rows["weight"].shape == (1024, 1024)
    assert rows["weight"].dtype == "torch.float32"
    assert rows["bias"].bytes == 4096
    del linear


def test_printed_table_matches_pytorch_memlab_layout(capsys):
    linear = torch.nn.Linear(1024, 1024)
    MemReporter(linear).report(device="cpu")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Element type                                            Size  Used MEM"
    assert lines[1] == "-" * 79
    assert lines[2] == "Storage on cpu"
    assert lines[3] == "weight" + " " * 34 + "(1024, 1024)".rjust(20) + "4.00M".rjust(10)
    assert lines[4] == "bias" + " " * 36 + "(1024,)".rjust(20) + "4.00K".rjust(10)
    assert lines[-3] == "-" * 79
    assert lines[-2].startswith("Total Tensors: ") and "\tUsed Memory: " in lines[-2]
    assert lines[-1] == "-" * 79


def test_shared_storage_counted_once_with_owner():
    base = torch.zeros(1000)
    view = base[10:20]
    report = MemReporter().collect(device="cpu", verbose=True)
    owner = next(r for r in report.rows if r.storage_bytes == 4000 and r.shared_with is None)
    sharer = next(r for r in report.rows if r.shared_with == owner.name and r.shape == (10,))
    assert sharer.bytes == 0
    assert f"{sharer.name}(->{owner.name})" in report.to_text()
    assert sum(r.bytes for r in report.rows if r.storage_bytes == 4000) == 4000
    del base, view


def test_tied_weights_get_every_name():
    model = TinyGPT(vocab=64, dim=16, layers=1, heads=2, context=8)
    rows = rows_by_name(MemReporter(model).collect(device="cpu"))
    tied = rows["wte.weight+lm_head.weight"]
    assert tied.bytes == 64 * 16 * 4
    assert "lm_head.weight" not in rows and "wte.weight" not in rows


def test_buffers_are_named_by_module_path():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    rows = rows_by_name(MemReporter(model).collect(device="cpu"))
    assert rows["1.running_mean"].bytes == 32
    assert rows["1.running_var"].bytes == 32
    assert rows["1.num_batches_tracked"].dtype == "torch.int64"
    assert rows["1.num_batches_tracked"].shape == ()


def test_grads_follow_their_parameter_and_count_once():
    linear = torch.nn.Linear(128, 64)
    linear(torch.ones(4, 128)).sum().backward()
    report = MemReporter(linear).collect(device="cpu")
    names = [r.name for r in report.rows]
    assert names[:4] == ["weight", "weight.grad", "bias", "bias.grad"]
    assert rows_by_name(report)["weight.grad"].bytes == 128 * 64 * 4


def test_parameters_without_grads_do_not_crash():
    linear = torch.nn.Linear(16, 16)
    linear(torch.ones(2, 16)).sum().backward()
    linear.zero_grad(set_to_none=True)
    rows = rows_by_name(MemReporter(linear).collect(device="cpu"))
    assert "weight.grad" not in rows and rows["weight"].bytes == 1024


def test_optimizer_state_is_named_after_parameters():
    linear = torch.nn.Linear(1024, 1024)
    optimizer = torch.optim.Adam(linear.parameters())
    linear(torch.ones(2, 1024)).sum().backward()
    optimizer.step()
    reporter = MemReporter(linear)
    reporter.add_optimizer(optimizer)
    rows = rows_by_name(reporter.collect(device="cpu"))
    assert rows["Adam.weight.exp_avg"].bytes == 4 * 1024 * 1024
    assert rows["Adam.weight.exp_avg_sq"].bytes == 4 * 1024 * 1024
    assert rows["Adam.bias.exp_avg"].bytes == 4096
    assert rows["Adam.weight.step"].bytes == 4


def test_optimizer_parameter_the_model_does_not_name_gets_a_number():
    named = torch.nn.Linear(4, 4)
    stray = torch.nn.Parameter(torch.zeros(10))
    optimizer = torch.optim.SGD([*named.parameters(), stray], lr=0.1, momentum=0.9)
    (named(torch.ones(1, 4)).sum() + stray.sum()).backward()
    optimizer.step()
    reporter = MemReporter(named)
    reporter.add_optimizer(optimizer)
    rows = rows_by_name(reporter.collect(device="cpu"))
    assert rows["SGD.param2"].bytes == 40
    assert rows["SGD.param2.grad"].bytes == 40
    assert rows["SGD.param2.momentum_buffer"].bytes == 40
    assert rows["SGD.weight.momentum_buffer"].bytes == 64


def test_sparse_tensors_report_their_parts():
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.ones(3), (4, 4))
    csr = torch.eye(8).to_sparse_csr()
    csc = torch.eye(8).to_sparse_csc()
    bsr = torch.eye(8).to_sparse_bsr((2, 2))
    reporter = MemReporter()
    reporter_names = {"coo": coo, "csr": csr, "csc": csc, "bsr": bsr}
    report = reporter.collect(device="cpu")
    rows = report.rows
    for label, tensor in reporter_names.items():
        parts = [
            r
            for r in rows
            if r.name.rsplit(".", 1)[-1]
            in ("indices", "values", "crow_indices", "col_indices", "ccol_indices", "row_indices")
            and r.numel in _part_sizes(tensor)
        ]
        assert parts, label
    coo_values = [r for r in rows if r.name.endswith(".values") and r.shape == (3,)]
    assert coo_values and coo_values[0].bytes == 12
    coo_indices = [r for r in rows if r.name.endswith(".indices") and r.shape == (2, 3)]
    assert coo_indices and coo_indices[0].bytes == 48


def _part_sizes(tensor):
    if tensor.layout == torch.sparse_coo:
        return {tensor._indices().numel(), tensor._values().numel()}
    if tensor.layout in (torch.sparse_csr, torch.sparse_bsr):
        return {tensor.crow_indices().numel(), tensor.col_indices().numel()}
    return {tensor.ccol_indices().numel(), tensor.row_indices().numel()}


def test_dead_weak_proxies_are_skipped_and_nothing_warns():
    class Holder:
        pass

    holder = Holder()
    holder.t = torch.zeros(3)
    proxy = weakref.proxy(holder.t)
    keep = [proxy]
    del holder
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # torch.distributed's deprecated names warn when their __class__ is read
        importlib.import_module("torch.distributed")

        report = MemReporter().collect()
    assert report.rows is not None
    del keep


def test_report_keeps_nothing_alive():
    tensor = torch.zeros(4096)
    model = torch.nn.Linear(8, 8)
    watch = [weakref.ref(tensor), weakref.ref(model.weight), weakref.ref(model)]
    reporter = MemReporter(model)
    report = reporter.collect()
    reporter.report()
    del tensor, model
    gc.collect()
    assert [w() for w in watch] == [None, None, None]
    assert report.rows  # the report itself is still readable


def test_sort_by_size_and_top():
    big = torch.zeros(1 << 20)
    small = torch.zeros(1 << 10)
    report = MemReporter().collect(device="cpu", sort_by="size", top=1)
    assert len(report.rows) == 1
    assert report.rows[0].bytes >= 4 << 20
    section = report.sections()[0]
    assert section["omitted_rows"] >= 1
    assert section["total_bytes"] == report.rows[0].bytes + section["omitted_bytes"]
    assert "more tensors" in report.to_text()
    del big, small


def test_json_and_dataframe_agree_with_rows():
    linear = torch.nn.Linear(32, 32)
    report = MemReporter(linear).collect(device="cpu")
    doc = json.loads(report.to_json())
    cpu = doc["devices"][0]
    assert cpu["device"] == "cpu"
    weight = next(r for r in cpu["rows"] if r["name"] == "weight")
    assert weight == {
        "name": "weight",
        "device": "cpu",
        "shape": [32, 32],
        "dtype": "torch.float32",
        "numel": 1024,
        "bytes": 4096,
        "storage_bytes": 4096,
        "shared_with": None,
    }
    assert cpu["total_bytes"] == sum(r["bytes"] for r in cpu["rows"])
    frame = report.to_dataframe()
    assert int(frame.loc[frame.name == "weight", "bytes"].iloc[0]) == 4096
    assert int(frame["bytes"].sum()) == cpu["total_bytes"]


class _TableParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack.pop() == tag, f"unbalanced </{tag}>"

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "td":
            self.cells.append(data)


def test_html_is_well_formed_and_escaped():
    model = torch.nn.Module()
    model.register_parameter("w<script>", torch.nn.Parameter(torch.zeros(4)))
    html = MemReporter(model)._repr_html_()
    assert "<script>" not in html and "w&lt;script&gt;" in html
    parser = _TableParser()
    parser.feed(html)
    assert parser.stack == []
    assert "w<script>" in parser.cells and "16.00B" in parser.cells


def test_bad_input_gets_clear_errors():
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
        MemReporter("model")
    with pytest.raises(TypeError, match="expects a torch.optim.Optimizer"):
        MemReporter().add_optimizer(object())
    with pytest.raises(ValueError, match='sort_by="biggest" is not a known order'):
        MemReporter().collect(sort_by="biggest")
    with pytest.raises(ValueError, match="top must be a non-negative int"):
        MemReporter().collect(top=-1)


def test_gc_walk_finds_exactly_the_tensors_gc_tracks():
    keep = [torch.zeros(i + 1) for i in range(50)]
    walk = MemReporter().collect().to_data()["walk"]
    # issubclass on the type, not isinstance: no __class__ lookups on odd objects
    expected = sum(issubclass(type(o), torch._C.TensorBase) for o in gc.get_objects())
    assert walk["tensors"] == expected
    assert walk["strategy"] in (
        "PyUnstable_GC_VisitObjects",
        "gc generation lists",
        "gc generation lists, since the last walk",
        "gc.get_objects()",
    )
    del keep

def test_a_container_nobody_keeps_still_names_its_parameters():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(3, 3)
    reporter = MemReporter(torch.nn.ModuleDict({"a": a, "b": b}))  # the dict dies here
    names = [r.name for r in reporter.collect(device="cpu").rows]
    assert names[:4] == ["a.weight", "a.bias", "b.weight", "b.bias"]
    # the names were taken weakly: the parameters die with their modules
    watch = weakref.ref(a.weight)
    del a
    gc.collect()
    assert watch() is None
    assert "a.weight" not in [r.name for r in reporter.collect(device="cpu").rows]


def test_a_live_model_names_parameters_added_after_the_reporter():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    reporter = MemReporter(model)
    model.append(torch.nn.Linear(5, 5))
    rows = rows_by_name(reporter.collect(device="cpu"))
    assert rows["1.weight"].bytes == 100 and rows["0.weight"].bytes == 16


def test_three_steps_keep_no_tensor_and_report_fills_the_stats(capsys):
    tensor = torch.zeros(1000)
    watch = weakref.ref(tensor)
    reporter = MemReporter()
    reporter.print_stats()  # nothing collected yet: the header only, as pytorch_memlab
    assert capsys.readouterr().out == (
        "Element type                                            Size  Used MEM\n"
    )
    reporter.collect_tensor()
    del tensor
    gc.collect()
    assert watch() is None  # collect_tensor() kept plain data, not the tensors
    reporter.get_stats()
    stats = reporter.device_tensor_stat[torch.device("cpu")]
    assert any(shape == (1000,) and memory == 4000 for _, shape, _, memory in stats)
    reporter.get_stats()  # nothing collected since: empty, as pytorch_memlab
    assert reporter.device_tensor_stat == {}
    kept = torch.ones(7)
    reporter.report(device="cpu")
    capsys.readouterr()
    assert any(s[1] == (7,) for s in reporter.device_tensor_stat[torch.device("cpu")])
    del kept


def test_truthy_verbose_and_integer_like_top(capsys):
    np = pytest.importorskip("numpy")
    base = torch.zeros(100)
    view = base[:10]
    big = torch.zeros(1 << 23)  # 32 MiB: larger than what earlier tests leave alive
    reporter = MemReporter()
    reporter.report(verbose=1, device="cpu")
    assert "(->" in capsys.readouterr().out
    report = reporter.collect(device="cpu", top=np.int64(2), sort_by="size")
    assert len(report.rows) == 2 and report.rows[0].shape == (1 << 23,)
    reporter.report(device="cpu", top=np.int32(1))
    assert "more tensors" in capsys.readouterr().out
    del base, view, big


def test_devices_and_types_that_make_no_sense_are_errors():
    reporter = MemReporter()
    with pytest.raises(ValueError, match="device=-1: a CUDA device index is 0 or more"):
        reporter.report(device=-1)
    with pytest.raises(TypeError, match="top must be a number of rows"):
        reporter.collect(top="2")
    with pytest.raises(TypeError, match="top must be a number of rows"):
        reporter.collect(top=2.0)
    with pytest.raises(TypeError, match="device must be a torch.device"):
        reporter.collect(device=1.5)
    with pytest.raises(ValueError, match="device='gpu' is not a device"):
        reporter.collect(device="gpu")
    with pytest.raises(TypeError, match="target_device must be"):
        reporter.print_stats(target_device=[0])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available on this machine"):
            reporter.report(device="cuda:0")
    else:
        count = torch.cuda.device_count()
        with pytest.raises(ValueError, match=f"this machine has {count} CUDA device"):
            reporter.report(device=count)


# --- a signal handler's exception during collect() reaches the caller --------------------


class PythonTensor(torch.Tensor):
    """Every attribute read goes through torch.Tensor.__torch_function__, Python code: a
    signal handler can run inside the read itself."""


def _collect_under_alarms(raises: type[BaseException] = Exception):
    """Timers spread over one collect(), each fired into one of 12 more."""
    reporter = MemReporter()
    start = time.perf_counter()
    reporter.collect(device="cpu")
    delays = spread(time.perf_counter() - start, 12)
    call = lambda: reporter.collect(device="cpu")  # noqa: E731
    if raises is Exception:
        return alarms_into(call, delays)
    return alarms_into(call, delays, raises=raises)


@pytest.mark.parametrize("kind", ["plain", "subclass"])
def test_a_timeout_raised_by_a_signal_handler_during_collect_reaches_the_caller(kind):
    made = (lambda: torch.empty(4)) if kind == "plain" else (
        lambda: torch.empty(4).as_subclass(PythonTensor)
    )
    keep = [made() for _ in range(5_000 if kind == "plain" else 1_000)]
    raised, seen = _collect_under_alarms()
    assert raised > 0
    assert seen == raised  # none swallowed
    del keep


def test_ctrl_c_during_collect_reaches_the_caller():
    keep = [torch.empty(4) for _ in range(5_000)]
    raised, seen = _collect_under_alarms(raises=KeyboardInterrupt)
    assert raised > 0 and seen == raised
    del keep


def test_a_tensor_that_cannot_answer_is_still_reported_with_handlers_installed():
    class Broken(torch.Tensor):
        @property
        def layout(self):
            raise RuntimeError("this tensor has no layout")

    def on_alarm(signum, frame):  # installed, never fired: errors are still the tensor's
        raise AssertionError("not fired")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        broken = torch.ones(256, 256).as_subclass(Broken)
        rows = MemReporter().collect(device="cpu").rows
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert any(r.shape == (256, 256) and r.bytes == 256 * 1024 for r in rows)
    del broken
