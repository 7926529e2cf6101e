"""The module-level helpers (profile, profile_every, set_target_gpu) as pytorch_memlab's
users call them: wrong input fails when the function is decorated, and every report
prints on its own at exit. Each runs in a fresh interpreter: the global profiler stays
enabled for the rest of a process."""

from __future__ import annotations


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

        prof = sys.modules["memlab_rs.profile"]  # memlab_rs.profile is the function

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
