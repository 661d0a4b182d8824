"""Numbers as people read them: 69.0 B parameters, 68.9 s, 1.10 TiB, a100-[0-15].

Three significant figures throughout (``_three``), so that columns of figures stay short
whatever their size; memory in binary units (GiB, as GPU capacities are quoted), counts and
rates in decimal ones (k, M, B, T).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "bytes_text",
    "count_text",
    "counted",
    "duration_text",
    "long_duration_text",
    "node_ranges",
    "percent_text",
    "rate_text",
    "runs_text",
    "usd_text",
]

_DECIMAL = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))
_BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def _three(value: float) -> str:
    """Three significant figures (more for large integers): 1.23, 12.3, 123, 1,234."""
    magnitude = abs(value)
    if magnitude >= 100 or magnitude == 0:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01:
        return f"{value:.2f}"
    return f"{value:.2g}"


def count_text(number: float) -> str:
    """A count with a decimal suffix: 69.0 B, 350 M, 12.3 k, 512."""
    for size, suffix in _DECIMAL:
        if abs(number) >= size:
            scaled = number / size
            return f"{scaled:.1f} {suffix}" if abs(scaled) < 100 else f"{scaled:,.0f} {suffix}"
    return f"{number:,.0f}" if float(number).is_integer() else _three(number)


def rate_text(per_second: float, unit: str) -> str:
    """A rate: '1.2 M tokens/s', '512 samples/s', '3.72 samples/s'."""
    if abs(per_second) >= 1e3:
        return f"{count_text(per_second)} {unit}/s"
    return f"{_three(per_second)} {unit}/s"


def bytes_text(size: float) -> str:
    """Memory in binary units: 1.10 TiB, 62.3 GiB, 512 MiB, 0 B."""
    for scale, unit in _BINARY:
        if abs(size) >= scale:
            return f"{_three(size / scale)} {unit}"
    return f"{size:,.0f} B"


def duration_text(milliseconds: float) -> str:
    """A duration: 412 µs, 3.00 ms, 68.9 s, 12.5 min, 2.30 h (under 1 ns: 0 ms)."""
    magnitude = abs(milliseconds)
    # Under a nanosecond is rounding left over from a difference (an all-reduce hidden
    # entirely by backward), not a time anyone can measure.
    if magnitude < 1e-6:
        return "0 ms"
    if magnitude < 1:
        return f"{_three(milliseconds * 1000)} µs"
    if magnitude < 1000:
        return f"{_three(milliseconds)} ms"
    seconds = milliseconds / 1000
    if abs(seconds) < 120:
        return f"{_three(seconds)} s"
    if abs(seconds) < 7200:
        return f"{_three(seconds / 60)} min"
    return f"{_three(seconds / 3600)} h"


def long_duration_text(seconds: float) -> str:
    """A duration that may run to days or years (a whole training run): as ``duration_text``
    up to 48 h, then '12.5 days' up to two years, then '3.40 years'."""
    days = seconds / 86_400
    if abs(days) < 2:
        return duration_text(seconds * 1000)
    if abs(days) < 730:
        return f"{_three(days)} days"
    return f"{_three(days / 365.25)} years"


def usd_text(dollars: float) -> str:
    """US dollars with a decimal suffix past a thousand: '$412', '$12.3 k', '$1.2 M'."""
    if abs(dollars) >= 1e3:
        return f"${count_text(dollars)}"
    return f"${_three(dollars)}"


def percent_text(fraction: float) -> str:
    """0.456 → '45.6%'."""
    return f"{fraction:.1%}"


def runs_text(values: Iterable[object]) -> str:
    """Runs collapsed: [1]*16 → '1 × 16', [3, 3, 1] → '3 × 2, 1'."""
    runs: list[list] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return ", ".join(f"{value} × {count}" if count > 1 else str(value) for value, count in runs)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _ranges(numbers: list[int]) -> str:
    parts: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if number is not None:
            start = previous = number
    return ",".join(parts)


def node_ranges(names: Iterable[str]) -> str:
    """Node names with numeric suffixes folded into ranges, in order of first appearance:
    ['a100-0', ..., 'a100-15', 'v100-2'] → 'a100-[0-15], v100-2'."""
    prefixes: dict[str, list[int]] = {}
    plain: list[str] = []
    order: list[str] = []
    for name in names:
        match = _NUMBERED.match(name)
        if match is None:
            if name not in plain:
                plain.append(name)
                order.append(name)
            continue
        prefix, number = match.group(1), int(match.group(2))
        if prefix not in prefixes:
            prefixes[prefix] = []
            order.append(prefix)
        if number not in prefixes[prefix]:
            prefixes[prefix].append(number)
    parts = []
    for key in order:
        if key in prefixes:
            numbers = sorted(prefixes[key])
            folded = _ranges(numbers)
            parts.append(f"{key}{folded}" if len(numbers) == 1 else f"{key}[{folded}]")
        else:
            parts.append(key)
    return ", ".join(parts)


def counted(count: int, noun: str, plural: str = "") -> str:
    """'1 sample', '2 samples', '1 layer' (``plural``: where adding 's' is wrong)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
