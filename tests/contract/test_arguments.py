"""A bad argument to the public API is a TypeError or ValueError that names the parameter,
raised before any work, never PyO3's OverflowError, an AttributeError from deep inside, or
a value taken silently (issue 20, item 10).

The first half pins each case found by hand; the second throws values of every kind at
every parameter (hypothesis) and checks the rule against an oracle of what each parameter
accepts, so that CI finds the next ones. MEMLAB_RS_FUZZ_SCALE=10 runs ten times as many.
"""

from __future__ import annotations

import contextlib
import io
import math
import operator
import os
import re
import tempfile
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlab_rs
import memlab_rs.trace as trace
from memlab_rs import courtesy

MiB = 1 << 20


def step(n: int = 256) -> torch.Tensor:
    x = torch.zeros(n, 1024)
    return x


class Made(dict):
    """The results the tests call, with a short repr for hypothesis's reports."""

    def __repr__(self) -> str:
        return "<one of each result>"


@pytest.fixture(scope="module")
def made() -> dict[str, Any]:
    """One of each result, made once for the module."""
    with memlab_rs.LineProfiler(step, device="cpu") as profiler:
        step()
    line = profiler.result()
    with trace.Tracer(device="cpu") as tracer:
        kept = torch.empty(256, 1024)
    report = memlab_rs.MemReporter(torch.nn.Linear(2, 2)).collect(device="cpu")
    del kept
    return Made(
        {
            "profiler": profiler,
            "line": line,
            "trace": tracer.result,
            "reporter": memlab_rs.MemReporter(torch.nn.Linear(2, 2)),
            "report": report,
            "diff": memlab_rs.diff_results(line, line),
            "merged_lines": memlab_rs.merge_results([line, line], ranks=[0, 1]),
            "merged_tensors": memlab_rs.merge_results([report, report], ranks=[0, 1]),
            "estimate": memlab_rs.estimate(torch.nn.Linear(4, 4), torch.zeros(2, 4), device="cpu"),
        }
    )


def linear() -> torch.nn.Module:
    return torch.nn.Linear(4, 4)


def inputs(batch: int) -> torch.Tensor:
    return torch.zeros(batch, 4)


# -- the cases of the issue, each once -----------------------------------------------------

CASES: list[tuple[str, Callable[[dict[str, Any]], Any], type[Exception], str]] = [
    ("timeline top=-1", lambda m: m["trace"].timeline(top=-1), ValueError, r"^top must be"),
    (
        "timeline max_points=0",
        lambda m: m["trace"].timeline(max_points=0),
        ValueError,
        r"^max_points must be an int >= 1, got 0",
    ),
    (
        "keywords expected_sum=-1",
        lambda m: m["trace"].keywords({"a": ["x"]}, expected_sum=-1),
        ValueError,
        r"^expected_sum .*: -1 is not a size: a size cannot be negative",
    ),
    (
        "keywords expected_sum=True",
        lambda m: m["trace"].keywords({"a": ["x"]}, expected_sum=True),
        TypeError,
        r"^expected_sum .*not bool",
    ),
    (
        "collect top=2**70",
        lambda m: m["reporter"].collect(device="cpu", top=2**70),
        ValueError,
        r"^top must be at most 2\*\*63 - 1 rows \(None for every row\), got 1180591620717411303424",
    ),
    (
        "Tracer max_entries=2**70",
        lambda m: trace.Tracer(device="cpu", max_entries=2**70),
        ValueError,
        r"^max_entries must be an int >= 1 and at most 2\*\*63 - 1",
    ),
    (
        "LineProfiler device=2**70",
        lambda m: memlab_rs.LineProfiler(device=2**70),
        ValueError,
        r"^device=1180591620717411303424: no device has that index",
    ),
    (
        "keywords(None)",
        lambda m: m["trace"].keywords(None),
        TypeError,
        r"^groups must be a dict of a group's name to its keywords",
    ),
    (
        "estimate(None, x)",
        lambda m: memlab_rs.estimate(None, torch.zeros(2, 4), device="cpu"),
        TypeError,
        r"^model must be a torch.nn.Module, got None",
    ),
    (
        "merge_results([1, 2])",
        lambda m: memlab_rs.merge_results([1, 2]),
        TypeError,
        r"^items\[0\] must be a memlab_rs result .*got 1 \(int\)",
    ),
    (
        "print_stats stream=str",
        lambda m: m["profiler"].print_stats(stream="out.txt"),
        TypeError,
        r"^stream must be a text stream with a write\(\) method .*; open the file and pass it",
    ),
    (
        "max_batch_size limit=-1",
        lambda m: memlab_rs.max_batch_size(linear(), inputs, budget=10**6, device="cpu", limit=-1),
        ValueError,
        r"^limit must be the largest batch size to try, an int >= 1, got -1",
    ),
    (
        "max_batch_size budget=nan",
        lambda m: memlab_rs.max_batch_size(linear(), inputs, budget=math.nan, device="cpu"),
        TypeError,
        r"^budget: a size must be a string or an int of bytes, not float \(nan\)",
    ),
    (
        "regressions over='abc'",
        lambda m: m["diff"].regressions(over="abc"),
        ValueError,
        r"^over: \"abc\" is not a size",
    ),
    (
        "to_dataframe by='nonsense'",
        lambda m: m["trace"].to_dataframe(by="nonsense"),
        ValueError,
        r"^by must be 'location' or 'module', got 'nonsense'",
    ),
    (
        "to_csv path=True",
        lambda m: m["line"].to_csv(path=True),
        TypeError,
        r"^path must be a file path \(a str or os.PathLike\), got True \(bool\)",
    ),
]


@pytest.mark.parametrize("call, error, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_bad_argument_of_the_issue_names_its_parameter(made, call, error, message):
    with pytest.raises(error) as raised:
        call(made)
    assert type(raised.value) is error  # not a subclass: OverflowError is an ArithmeticError
    assert re.search(message, str(raised.value)), str(raised.value)


def test_to_csv_of_a_bad_path_leaves_standard_output_open(made, capfd):
    """`open(True)` is standard output: to_csv(path=True) wrote the CSV there and closed it,
    so the next print failed. Now nothing is opened."""
    for result in (made["line"], made["diff"], made["merged_lines"], made["merged_tensors"]):
        for path in (True, 1, 0):
            with pytest.raises(TypeError, match="^path must be a file path"):
                result.to_csv(path=path)
    for write in (made["report"].to_json, made["trace"].to_json, made["trace"].to_csv):
        with pytest.raises(TypeError, match="^path must be a file path"):
            write(path=True)
    os.write(1, b"still open\n")
    assert capfd.readouterr().out == "still open\n"


def test_a_device_index_torch_would_wrap_is_refused():
    """torch keeps a device index in a small integer: torch.device("cuda", 200) is
    cuda:-56 and "cuda:256" is cuda:0, so LineProfiler(device=200) said there was no
    cuda:-56 and "cuda:256" profiled GPU 0."""
    assert torch.device("cuda:256").index == 0  # what torch does, the reason for the check
    for device, shown in ((200, "200"), ("cuda:256", "'cuda:256'"), ("cuda:128", "'cuda:128'")):
        with pytest.raises(ValueError, match=f"^device={shown}: no device has that index"):
            memlab_rs.LineProfiler(device=device)
        with pytest.raises(ValueError, match=f"^device={shown}: no device has that index"):
            trace.Tracer(device=device)
    with pytest.raises(ValueError, match="^target_gpu='cuda:256': no device has that index"):
        memlab_rs.LineProfiler(target_gpu="cuda:256")
    with pytest.raises(ValueError, match="^devices=200: no device has that index"):
        memlab_rs.Courtesy(200)


@pytest.mark.cuda
def test_every_spelling_of_an_existing_gpu_is_still_taken():
    """The check against torch's wrapping of device indexes leaves real devices alone."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    last = torch.cuda.device_count() - 1
    for device in (0, "cuda", "cuda:0", torch.device("cuda", last), f"cuda:{last}", last):
        assert memlab_rs.LineProfiler(device=device).device.startswith("cuda:")
        assert trace.Tracer(device=device).device.startswith("cuda:")
    assert memlab_rs.LineProfiler(target_gpu=f"cuda:{last}").target_gpu == last
    assert memlab_rs.Courtesy(f"cuda:{last}")._devices == {torch.device("cuda", last)}
    with pytest.raises(ValueError, match=f"there is no cuda:{last + 1}"):
        memlab_rs.LineProfiler(device=last + 1)


def test_a_size_parameter_takes_every_size_parse_size_takes(made):
    """regressions(over=), max_batch_size(budget=) and keywords(expected_sum=) read sizes
    as parse_size does: "20 MB" is 20,000,000 bytes wherever it is written."""
    rows = made["diff"].rows + [{"change": 2_000_001}, {"change": 2 << 20}]
    diff = memlab_rs.ResultDiff("line_profile", ["A", "B"], rows, [])
    assert len(diff.regressions(over="2MB")) == 2 and len(diff.regressions(over="2M")) == 0
    assert diff.regressions(over="2 MB") == diff.regressions(over=2_000_000)
    one = memlab_rs.max_batch_size(linear(), inputs, budget="2 KB", device="cpu", limit=64)
    assert one == memlab_rs.max_batch_size(linear(), inputs, budget=2000, device="cpu", limit=64)
    groups = {"all": ["test_arguments"]}
    # 64 MiB: above the made trace's peak (a few MiB) on every CPython, as expected_sum must be
    by_size = made["trace"].keywords(groups, expected_sum="64 MiB", by="location")
    assert by_size == made["trace"].keywords(groups, expected_sum=64 * MiB, by="location")
    assert by_size[-1] == ("Untrackable", 64 * MiB - sum(b for _, b in by_size[:-1]))


def test_keyword_groups_take_one_keyword_as_a_word_not_its_letters(made):
    """{"x": "attn"} matched every tag holding an a, a t or an n (list("attn"))."""
    result = made["trace"]
    word = result.keywords({"g": "no-such-word"}, expected_sum=None, by="location")
    assert word == result.keywords({"g": ["no-such-word"]}, expected_sum=None, by="location")
    assert word[0] == ("g", 0)


def test_exclude_is_a_list_of_path_parts_not_the_letters_of_one():
    """One string is one path part (the issue allows that or a clear error; a string is
    what people write for one part), never its letters; what is not text is refused."""
    snapshot = {"segments": [], "device_traces": [[]]}
    assert trace.TraceResult(snapshot, exclude="torch").exclude == ["torch"]
    assert trace.load(snapshot, exclude="torch").exclude == ["torch"]
    assert trace.Tracer(device="cpu", exclude="torch").exclude == ["torch"]
    for bad in (b"torch", 5, ["torch", 3]):
        with pytest.raises(TypeError, match="exclude"):
            trace.TraceResult(snapshot, exclude=bad)
    assert trace.TraceResult(snapshot, exclude=("torch",)).exclude == ["torch"]


def test_estimate_refuses_optimizer_kwargs_without_an_optimizer():
    with pytest.raises(ValueError, match="^optimizer_kwargs are given but no optimizer"):
        memlab_rs.estimate(linear(), torch.zeros(2, 4), device="cpu", optimizer_kwargs={})
    with pytest.raises(TypeError, match="^optimizer_kwargs must be a dict"):
        memlab_rs.estimate(
            linear(), torch.zeros(2, 4), optimizer=torch.optim.SGD, optimizer_kwargs=0.1
        )
    with pytest.raises(TypeError, match="^backward must be True or False, got 'no'"):
        memlab_rs.estimate(linear(), torch.zeros(2, 4), device="cpu", backward="no")


def test_a_wait_of_preemption_is_finite():
    """retry_seconds=inf was taken, and time.sleep(inf) raised OverflowError at the first
    retry, long after."""
    for name in ("retry_seconds", "max_retry_seconds", "deadline_seconds"):
        for value in (math.inf, 2**70, math.nan):
            with pytest.raises(ValueError, match=f"^{name} must be a number of seconds"):
                courtesy.Preemption(memlab_rs.Courtesy(_allow_cpu=True), **{name: value})


# -- every parameter, every kind of value (hypothesis) -------------------------------------

FUZZ = settings(
    max_examples=int(100 * float(os.environ.get("MEMLAB_RS_FUZZ_SCALE", "1"))),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class Odd:
    """An object of no expected type, with a repr that would be long."""

    def __repr__(self) -> str:
        return "<Odd " + "x" * 500 + ">"


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**80), 2**80),
    st.sampled_from([0, 1, 2, 7, 127, 128, 2**31, 2**63 - 1, 2**63, 2**64, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "cpu",
            "cuda",
            "cuda:0",
            "cuda:256",
            "meta",
            "location",
            "module",
            "2 MB",
            "16M",
            "-1 MB",
            "driver",
            "size",
            "name",
            "reserved",
            "a\x00b",
            "",
        ]
    ),
    st.binary(max_size=3),
    st.lists(st.sampled_from(["x", 1, None]), max_size=2),
    st.tuples(st.sampled_from(["x", "torch"])),
    st.dictionaries(st.sampled_from(["a", 1]), st.sampled_from([["x"], "x", 1]), max_size=2),
    st.builds(Odd),
    st.complex_numbers(max_magnitude=4, allow_nan=False),
)


def is_int(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    try:
        operator.index(v)
    except TypeError:
        return False
    return True


def count(lo: int, hi: int = 2**63 - 1) -> Callable[[Any], bool]:
    return lambda v: is_int(v) and lo <= v <= hi


def size(v: Any) -> bool:
    try:
        memlab_rs.parse_size(v)
    except (TypeError, ValueError):
        return False
    return True


def cpu_device(v: Any) -> bool:
    """A device the tools read: None, the CPU, or (on a GPU machine) a CUDA device that
    exists, written as an index, "cuda" or "cuda:N"."""
    if v is None or (isinstance(v, torch.device) and v.type == "cpu") or v == "cpu":
        return True
    if not torch.cuda.is_available():
        return False
    if is_int(v):
        return 0 <= v < torch.cuda.device_count()
    found = re.fullmatch(r"cuda(?::(\d+))?", v) if isinstance(v, str) else None
    return found is not None and int(found.group(1) or 0) < torch.cuda.device_count()


def device_but_cuda(v: Any) -> bool:
    """What the tensor report takes here: None or any device torch knows but CUDA (the
    report of a device without tensors is empty)."""
    if v is None:
        return True
    if not isinstance(v, str):
        return False
    try:
        return torch.device(v).type != "cuda" and re.fullmatch(r"[a-z_]+(:\d+)?", v) is not None
    except RuntimeError:
        return False


def file_path(v: Any) -> bool:
    return isinstance(v, (str, bytes, os.PathLike)) and bool(v) and "\0" not in os.fsdecode(v)


FOLDER = tempfile.TemporaryDirectory(prefix="memlab_rs-arguments-")


@contextlib.contextmanager
def quiet_in_a_folder(name: str):
    """Run where files may be written (a folder per target, so that a file one target
    wrote is not another's input), with nothing printed."""
    before = os.getcwd()
    folder = os.path.join(FOLDER.name, re.sub(r"\W+", "_", name))
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        os.chdir(before)


# (call with one value, the parameter's name, the oracle: values accepted; None: any
# value; "invalid only": the call is costly, so only values it must refuse are run.)
Target = tuple[Callable[[dict[str, Any], Any], Any], str, Any]


def targets() -> dict[str, Target]:
    return {
        "TraceResult.timeline(top)": (lambda m, v: m["trace"].timeline(top=v), "top", count(0)),
        "TraceResult.timeline(max_points)": (
            lambda m, v: m["trace"].timeline(max_points=v),
            "max_points",
            count(1),
        ),
        "TraceResult.keywords(groups)": (
            lambda m, v: m["trace"].keywords(v, expected_sum=None),
            "groups",
            lambda v: (
                isinstance(v, dict)
                and all(
                    isinstance(k, str) and (isinstance(w, str) or w == ["x"]) for k, w in v.items()
                )
            ),
        ),
        "TraceResult.keywords(expected_sum)": (
            lambda m, v: m["trace"].keywords({"a": ["x"]}, expected_sum=v),
            "expected_sum",
            # A size is taken when it is at least what the groups add up to (a smaller one
            # would make Untrackable negative: a ValueError that says so), so either is right.
            lambda v: True if v is None or v == "driver" else (None if size(v) else False),
        ),
        "TraceResult.keywords(by)": (
            lambda m, v: m["trace"].keywords({"a": ["x"]}, expected_sum=None, by=v),
            "by",
            lambda v: v in ("module", "location"),
        ),
        "TraceResult.to_dataframe(by)": (
            lambda m, v: m["trace"].to_dataframe(by=v),
            "by",
            lambda v: v in ("module", "location"),
        ),
        "TraceResult.rows(device)": (lambda m, v: m["trace"].rows(v), "device", cpu_device),
        "TraceResult.to_csv(path)": (
            lambda m, v: m["trace"].to_csv(path=v),
            "path",
            lambda v: v is None or file_path(v),
        ),  # fmt: skip
        "TraceResult.untagged_log(path)": (
            lambda m, v: m["trace"].untagged_log(path=v),
            "path",
            lambda v: v is None or file_path(v),
        ),  # fmt: skip
        "TraceResult(exclude)": (
            lambda m, v: trace.TraceResult({"segments": [], "device_traces": [[]]}, exclude=v),
            "exclude",
            lambda v: (
                v is None
                or (isinstance(v, str) and v != "")  # one string is one path part
                or (isinstance(v, (list, tuple)) and all(isinstance(p, str) and p for p in v))
            ),
        ),
        "Tracer(max_entries)": (
            lambda m, v: trace.Tracer(device="cpu", max_entries=v),
            "max_entries",
            count(1),
        ),
        "Tracer(device)": (lambda m, v: trace.Tracer(device=v), "device", cpu_device),
        "Tracer(model)": (
            lambda m, v: trace.Tracer(device="cpu", model=v),
            "model",
            lambda v: v is None,
        ),
        "LineProfiler(device)": (
            lambda m, v: memlab_rs.LineProfiler(device=v),
            "device",
            cpu_device,
        ),
        "LineProfiler.print_stats(stream)": (
            lambda m, v: m["profiler"].print_stats(stream=v),
            "stream",
            lambda v: v is None,
        ),
        "LineProfileResult.text(func)": (
            lambda m, v: m["line"].text(func=v),
            "func",
            lambda v: v is None or v == "step" or (isinstance(v, (list, tuple)) and not v),
        ),
        "LineProfileResult.to_csv(path)": (
            lambda m, v: m["line"].to_csv(path=v),
            "path",
            lambda v: v is None or file_path(v),
        ),  # fmt: skip
        "LineProfileResult.save(path)": (lambda m, v: m["line"].save(v), "path", file_path),
        "MergedLineProfile.text(func)": (
            lambda m, v: m["merged_lines"].text(func=v),
            "func",
            lambda v: v is None or v == "step" or (isinstance(v, (list, tuple)) and not v),
        ),
        "MergedTensorReport.to_csv(path)": (
            lambda m, v: m["merged_tensors"].to_csv(path=v),
            "path",
            lambda v: v is None or file_path(v),
        ),
        "MemReporter.collect(top)": (
            lambda m, v: m["reporter"].collect(device="cpu", top=v),
            "top",
            lambda v: v is None or count(0)(v),
        ),
        "MemReporter.collect(sort_by)": (
            lambda m, v: m["reporter"].collect(device="cpu", sort_by=v),
            "sort_by",
            lambda v: v in (None, "size", "name"),
        ),
        "MemReporter.collect(device)": (
            lambda m, v: m["reporter"].collect(device=v),
            "device",
            device_but_cuda,
        ),
        "MemoryReport.to_json(path)": (
            lambda m, v: m["report"].to_json(path=v),
            "path",
            lambda v: v is None or file_path(v),
        ),  # fmt: skip
        "ResultDiff.regressions(over)": (lambda m, v: m["diff"].regressions(over=v), "over", size),
        "ResultDiff.to_csv(path)": (
            lambda m, v: m["diff"].to_csv(path=v),
            "path",
            lambda v: v is None or file_path(v),
        ),  # fmt: skip
        "diff_results(b)": (
            lambda m, v: memlab_rs.diff_results(m["line"], v),
            "b",
            lambda v: False,  # a path here names a file that does not exist: an OSError
        ),
        "merge_results(items)": (
            lambda m, v: memlab_rs.merge_results(v),
            "items",
            lambda v: False,
        ),
        "MemoryEstimate.to_json(indent)": (
            lambda m, v: m["estimate"].to_json(indent=v),
            "indent",
            lambda v: v is None or count(0, 64)(v),
        ),
        "estimate(model)": (
            lambda m, v: memlab_rs.estimate(v, torch.zeros(2, 4), device="cpu"),
            "model",
            "invalid only",
        ),
        "estimate(loss_fn)": (
            lambda m, v: memlab_rs.estimate(linear(), torch.zeros(2, 4), loss_fn=v, device="cpu"),
            "loss_fn",
            "invalid only",
        ),
        "estimate(backward)": (
            lambda m, v: memlab_rs.estimate(linear(), torch.zeros(2, 4), device="cpu", backward=v),
            "backward",
            "invalid only",
        ),
        "max_batch_size(budget)": (
            lambda m, v: memlab_rs.max_batch_size(linear(), inputs, budget=v, device="cpu"),
            "budget",
            "invalid only",
        ),
        "max_batch_size(limit)": (
            lambda m, v: memlab_rs.max_batch_size(
                linear(), inputs, budget=0, device="cpu", limit=v
            ),
            "limit",
            count(1),
        ),
        "max_batch_size(make_inputs)": (
            lambda m, v: memlab_rs.max_batch_size(linear(), v, budget=0, device="cpu"),
            "make_inputs",
            "invalid only",
        ),
        "Preemption(retry_seconds)": (
            lambda m, v: courtesy.Preemption(
                memlab_rs.Courtesy(_allow_cpu=True), retry_seconds=v
            ).close(),
            "retry_seconds",
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 9.2e9,
        ),
        "parse_size(size)": (lambda m, v: memlab_rs.parse_size(v), "size", None),
    }


TARGETS = targets()
INVALID_ONLY = {name for name, (_, _, ok) in TARGETS.items() if ok == "invalid only"}


def expect_the_rule(made: dict[str, Any], name: str, value: Any) -> None:
    call, parameter, accepts = TARGETS[name]
    # accepts: the oracle; None where a test of its own checks what is accepted
    valid = None if accepts is None else callable(accepts) and accepts(value)
    if name in INVALID_ONLY:
        valid = False
    try:
        with quiet_in_a_folder(name):
            call(made, value)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert valid is not True, f"{name} refused a value it accepts, {value!r}: {message}"
        assert type(error) in (TypeError, ValueError), f"{type(error).__name__}: {message}"
        assert parameter in message or name == "parse_size(size)", message
        assert len(message) < 1200, "the value is shown short"
    except OSError:
        assert "path" in parameter or parameter in ("b", "items"), f"{name}: OSError"
    else:
        assert valid is not False, f"{name} took {value!r} without a word"


@pytest.mark.parametrize("name", [n for n in TARGETS if n not in INVALID_ONLY])
@FUZZ
@given(value=values)
def test_every_parameter_refuses_what_it_cannot_take_by_name(made, name, value):
    expect_the_rule(made, name, value)


# Costly calls (an estimate per value): the values they must refuse, refused before any work.
costly = values.filter(lambda v: not (callable(v) or isinstance(v, torch.nn.Module)))


@pytest.mark.parametrize("name", sorted(INVALID_ONLY))
@settings(FUZZ, max_examples=max(10, FUZZ.max_examples // 5))
@given(value=costly)
def test_a_costly_call_refuses_a_bad_value_before_any_work(made, name, value):
    if name == "max_batch_size(budget)" and (value is None or size(value)):
        return  # a budget: the search runs (None: no GPU, a ValueError that says so)
    if name == "estimate(backward)" and isinstance(value, bool):
        return
    if name == "estimate(loss_fn)" and value is None:
        return
    expect_the_rule(made, name, value)


def test_the_targets_cover_the_listed_cases():
    """Each parameter of the issue's list has a property test above."""
    listed = {
        "TraceResult.timeline(top)", "TraceResult.keywords(expected_sum)",
        "MemReporter.collect(top)", "Tracer(max_entries)", "LineProfiler(device)",
        "TraceResult.keywords(groups)", "estimate(model)", "merge_results(items)",
        "LineProfiler.print_stats(stream)", "max_batch_size(limit)", "max_batch_size(budget)",
        "ResultDiff.regressions(over)", "TraceResult.to_dataframe(by)",
        "LineProfileResult.to_csv(path)",
    }  # fmt: skip
    assert listed <= set(TARGETS)
