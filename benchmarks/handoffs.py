"""What the hand-off cases (14: Ray gloo, 15: torchrun gloo, 16: Ray nixl) share: a check that
every variant hands over the same weights, and the rows they report (one per size and
comparison, with each variant's GiB/s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import Row, median


def same_every_time() -> Callable[[float], None]:
    """A check that every value it is given equals the first one (each variant's consumer
    returns a sum over what it received: a wrong or partial hand-off changes it)."""
    expected: list[float] = []

    def check(value: float) -> None:
        if expected:
            assert value == expected[0], (value, expected[0])
        else:
            expected.append(value)

    return check


def hand_off_rows(
    number: str,
    what: Callable[[int, str], str],
    result: dict[str, dict[str, list[float]]],
    sizes_mib: tuple[int, ...],
    measured: str,
    against: list[tuple[str, str, bool]],
    extra: dict[str, Any] | None = None,
) -> list[Row]:
    """Rows `<number>a`, `b`, ... : per size (in `sizes_mib` order), variant `measured` against
    each `(variant, title, raw)` of `against`; `what(mib, title)` names the row. A raw
    comparison's note lists every variant's GiB/s; a twinkle-against-twinkle one says so."""
    rows = []
    for i, mib in enumerate(sizes_mib):
        samples = result[str(mib)]
        med = {k: median(v) for k, v in samples.items()}
        gbs = {k: mib / 1024 / v for k, v in med.items()}
        note = ", ".join(f"{k} {v:.2f} GiB/s" for k, v in gbs.items())
        details = {"median_s": med, "gib_per_s": gbs, "payload_mib": mib, **(extra or {})}
        for j, (other, title, raw) in enumerate(against):
            rows.append(
                Row(
                    f"{number}{chr(ord('a') + len(against) * i + j)}",
                    what(mib, title),
                    med[measured],
                    med[other],
                    unit="per hand-off",
                    note=note if raw else "both twinkle",
                    extra=details,
                    samples={"twinkle": samples[measured], "raw": samples[other]},
                )
            )
    return rows
