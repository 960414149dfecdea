"""`python -m twinkle_core.testing --mode NAME ...`; run by path on each rank of a launcher."""

import os
import sys

if not __package__:
    # Run as a script by a launcher (`torchrun .../twinkle_core/testing/__main__.py`): Python put
    # this folder first on sys.path, where its modules would shadow top-level ones.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from twinkle_core.testing.cli import main

if __name__ == "__main__":
    sys.exit(main())
