"""pytorch_memlab's Courtesy path: code written for pytorch_memlab, run with memlab_rs in its
place (``import memlab_rs as pytorch_memlab; sys.modules["pytorch_memlab"] = memlab_rs``),
reaches the one Courtesy of memlab_rs through ``pytorch_memlab.courtesy``, every way in.

The alias makes the import system load ``memlab_rs/courtesy/__init__.py`` a second time,
under the name ``pytorch_memlab.courtesy``: its imports must be absolute, or it would make a
second copy of every module of the package (a second Courtesy class, a second logger
name). A fresh interpreter runs it: the alias must not leak into this one's modules."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import sys
    import memlab_rs
    import memlab_rs as pytorch_memlab
    sys.modules["pytorch_memlab"] = memlab_rs

    from pytorch_memlab.courtesy import Courtesy
    import pytorch_memlab.courtesy
    from memlab_rs.courtesy.moves import Courtesy as ours

    assert Courtesy is ours is memlab_rs.Courtesy, (Courtesy, ours)
    assert pytorch_memlab.courtesy.Courtesy is ours
    assert sys.modules["pytorch_memlab.courtesy"].Courtesy is ours
    assert memlab_rs.courtesy.Courtesy is ours
    # No module of the package was loaded twice (under the alias's name).
    twice = sorted(m for m in sys.modules if m.startswith("pytorch_memlab.courtesy."))
    assert not twice, twice
    for name in ("CourtesyRestoreError", "RestoreReport", "YieldReport", "Preemption",
                 "on_signal"):
        assert getattr(pytorch_memlab.courtesy, name) is getattr(memlab_rs.courtesy, name)
    print(Courtesy().restore())
    """
)


def test_pytorch_memlab_courtesy_is_ours():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Courtesy: nothing to restore\n"
