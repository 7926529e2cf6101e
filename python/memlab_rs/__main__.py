"""``python -m memlab_rs``: the ``memlab-rs`` command line (``memlab_rs.cli``)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
