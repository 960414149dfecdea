"""Print the per-step losses of several runs of rl_pipeline.py side by side.

    python examples/compare_losses.py local.json ray.json inprocess.json

Exits non-zero when the runs disagree by more than float tolerance.
"""

from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> int:
    runs = [json.load(open(p)) for p in paths]
    modes = [r["mode"] for r in runs]
    print("step  " + "  ".join(f"{m + ' loss':>16}" for m in modes) + f"  {'reward':>7}")
    worst = 0.0
    for i, row in enumerate(runs[0]["steps"]):
        losses = [r["steps"][i]["loss"] for r in runs]
        worst = max(worst, max(losses) - min(losses))
        cells = "  ".join(f"{v:>16.8f}" for v in losses)
        print(f"{row['step']:>4}  {cells}  {row['reward']:>7.3f}")
    same = worst <= 1e-5
    print(f"largest difference between modes: {worst:.2e} ({'same' if same else 'DIFFERENT'})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
