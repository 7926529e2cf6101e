"""The global profiler (@profile, profile_every, set_target_gpu) and the column catalogue,
each in a fresh interpreter (`script`): reports printed every nth call and each on its own,
early errors, objects without code, the documented examples, and CUDA left uninitialised by
an import. They behave alike on every CPython, so this file runs once (noxfile.py); what
depends on the interpreter (exit, KeyboardInterrupt, the hooks) is
test_line_profiler_processes.py's."""

from __future__ import annotations

# --- the global profiler: @profile, profile_every, set_target_gpu ------------------------


def test_profile_every_prints_every_nth_call(script):
    out = script(
        """
        import torch, memlab_rs

        DEV = "cuda" if torch.cuda.is_available() else "cpu"

        @memlab_rs.profile_every(2, columns=("allocated_bytes.all.allocated",))
        def step():
            x = torch.empty(256, 1024, device=DEV)
            return x

        for _ in range(5):
            step()
        """
    )
    assert out.count("## step") == 2
    assert "1.00M" in out


def test_import_does_not_initialise_cuda(script):
    out = script(
        """
        import torch, memlab_rs
        from memlab_rs import profile, LineProfiler
        print(torch.cuda.is_initialized())
        """
    )
    assert out.strip() == "False"


def test_set_target_gpu_and_profile_fail_early(script):
    out = script(
        """
        import torch
        from memlab_rs import profile, set_target_gpu

        try:
            set_target_gpu(99)
        except ValueError as e:
            print("set_target_gpu:", e)
        try:
            @profile(columns=["bogus.all.peak"])
            def bad():
                pass
        except ValueError as e:
            print("decoration:", str(e)[:40])

        # @profile reads CUDA where there is CUDA, else the CPU: allocate where it reads.
        device = "cuda" if torch.cuda.is_available() else "cpu"

        @profile(columns=("allocated_bytes.all.allocated",))
        def good():
            x = torch.empty(256, 1024, device=device)
            return x

        good()
        """
    )
    assert "set_target_gpu: target_gpu=99" in out
    assert "decoration: unknown column 'bogus.all.peak'" in out
    assert "## good" in out and "1.00M" in out


def test_each_profile_report_prints_on_its_own(script):
    proc_out = script(
        """
        import sys
        import torch
        from memlab_rs import profile

        # memlab_rs.profile is the function; the global profiler's module is this one
        prof = sys.modules["memlab_rs.line_profiler.global_profiler"]

        @profile
        def first():
            x = torch.empty(256, 1024)
            return x

        @profile(columns=("allocated_bytes.all.allocated",))
        def second():
            y = torch.empty(512, 1024)
            return y

        @profile
        def third():
            z = torch.empty(128, 1024)
            return z

        first(); second(); third()
        # A report that fails at exit (a column the catalogue has but this torch lacks would
        # do it on a GPU): the others must still print.
        code, _ = prof._print_at_exit[1]
        prof._print_at_exit[1] = (code, ("bogus.all.peak",))
        sys.stderr = sys.stdout  # show the failure's message in what the test reads
        """
    )
    assert "## first" in proc_out and "## third" in proc_out
    assert "could not print the @profile report of second" in proc_out
    assert "unknown column 'bogus.all.peak'" in proc_out
    assert proc_out.index("## first") < proc_out.index("second") < proc_out.index("## third")


def test_objects_without_code_warn_and_are_left_as_they_are(script):
    out = script(
        """
        import functools, warnings
        from memlab_rs import profile, profile_every

        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            class Model:
                @profile
                @property
                def size(self):
                    return 3

            half = profile_every(2)(functools.partial(int, base=2))

        print(Model().size, half("101"))
        for w in caught:
            print(w.category.__name__, str(w.message)[:46], w.filename.endswith("script.py"))
        """
    )
    assert out.splitlines() == [
        "3 5",
        "UserWarning Could not extract a code object for the object True",
        "UserWarning Could not extract a code object for the object True",
    ]




def test_the_global_profilers_examples_run(script):
    """Its docstring examples enable the global profiler, which stays on for the rest of a
    process (tests/contract/test_docstrings.py runs the other modules' in process)."""
    out = script(
        """
        import doctest
        from memlab_rs.line_profiler import global_profiler

        failures, tried = doctest.testmod(global_profiler, optionflags=doctest.ELLIPSIS)
        print(failures, tried)
        """
    )
    failures, tried = map(int, out.split())
    assert failures == 0 and tried >= 5

# --- the column catalogue --------------------------------------------------------------


def test_the_catalogue_does_not_initialise_cuda(script):
    out = script(
        """
        import torch
        from memlab_rs.line_profiler import columns
        columns.check_columns(["active_bytes.large_pool.peak", "num_ooms"], "cuda:0")
        print(len(columns.catalogue("cuda:0")), torch.cuda.is_initialized())
        """
    )
    assert out.split()[1] == "False" and int(out.split()[0]) > 100
