"""A session's context per turn as inline SVG: the raw history, what was sent, B and its 50% /
80% gates, a mark at each compaction and each trim. Log scale, as the demo's chart; drawn
here (no chart library, nothing fetched), its text escaped."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any, Final

WIDTH: Final = 900
HEIGHT: Final = 320
LEFT, RIGHT, TOP, BOTTOM = 70, 150, 20, 40
FLOOR_CHARS: Final = 100  # the log scale's bottom
LINES: Final = (  # (share of B, label, colour, dashes)
    (1.0, "budget B", "#d62728", ""),
    (0.8, "compact 80%", "#ff7f0e", "6 4"),
    (0.5, "trim 50%", "#2ca02c", "6 4"),
)


class Scale:
    """Turn number and chars to SVG coordinates."""

    def __init__(self, turns: int, top_chars: float) -> None:
        self.turns = max(turns, 2)
        self.low = math.log10(FLOOR_CHARS)
        self.high = math.log10(max(top_chars, FLOOR_CHARS * 10))

    def x(self, index: int) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * index / (self.turns - 1)

    def y(self, chars: float) -> float:
        share = (math.log10(max(chars, FLOOR_CHARS)) - self.low) / (self.high - self.low)
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - share)


def _polyline(points: Sequence[tuple[float, float]], colour: str, width: float) -> str:
    drawn = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return (
        f'<polyline points="{drawn}" fill="none" stroke="{colour}" stroke-width="{width}"'
        ' stroke-linejoin="round"/>'
    )


def _axes(scale: Scale, turns: Sequence[Mapping[str, Any]]) -> list[str]:
    parts = []
    for power in range(math.ceil(scale.low), math.floor(scale.high) + 1):
        y = scale.y(10**power)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
            f"{10**power:,}</text>"
        )
    step = max(1, len(turns) // 8)
    for index in range(0, len(turns), step):
        x = scale.x(index)
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" font-size="11">'
            f"{turns[index]['turn']}</text>"
        )
    parts.append(
        f'<text x="{(WIDTH - RIGHT + LEFT) / 2}" y="{HEIGHT - 6}" text-anchor="middle"'
        ' font-size="11">turn</text>'
    )
    return parts


def _marks(scale: Scale, turns: Sequence[Mapping[str, Any]]) -> list[str]:
    """A triangle at each turn that applied a compaction, a tick where more results were
    trimmed than the turn before."""
    parts, trimmed = [], 0
    for index, turn in enumerate(turns):
        x, y = scale.x(index), scale.y(turn["chars_out"])
        if turn["compacted"]:
            parts.append(
                f'<path class="compaction" d="M{x - 5:.1f},{y - 12:.1f} h10 l-5,8 z"'
                f' fill="#9467bd"><title>turn {turn["turn"]}: generation'
                f" {turn['generation']} applied</title></path>"
            )
        if turn["trimmed"] > trimmed:
            parts.append(
                f'<line class="trim" x1="{x:.1f}" x2="{x:.1f}" y1="{y + 3:.1f}" y2="{y + 10:.1f}"'
                f' stroke="#2ca02c" stroke-width="2"><title>turn {turn["turn"]}:'
                f" {turn['trimmed']} results trimmed</title></line>"
            )
        trimmed = turn["trimmed"]
    return parts


def _legend(entries: Sequence[tuple[str, str, str]]) -> list[str]:
    parts = []
    for row, (label, colour, dashes) in enumerate(entries):
        y = TOP + 10 + row * 18
        x = WIDTH - RIGHT + 12
        dash = f' stroke-dasharray="{dashes}"' if dashes else ""
        parts.append(
            f'<line x1="{x}" x2="{x + 22}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="2"'
            f'{dash}/><text x="{x + 28}" y="{y + 4}" font-size="11">{escape(label)}</text>'
        )
    return parts


def context_chart(turns: Sequence[Mapping[str, Any]]) -> str:
    """The SVG of ``turns`` (the store's rows, oldest first); "" for none."""
    if not turns:
        return ""
    budget = turns[-1]["budget_chars"]
    top = max(max(t["chars_raw"] for t in turns), budget) * 1.3
    scale = Scale(len(turns), top)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img"'
        f' class="chart" aria-label="context per turn, B = {budget:,} chars">',
        *_axes(scale, turns),
    ]
    for share, _, colour, dashes in LINES:
        y = scale.y(share * budget)
        dash = f' stroke-dasharray="{dashes}"' if dashes else ""
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"'
            f' stroke="{colour}"{dash}/>'
        )
    points = [(scale.x(i), scale.y(t["chars_raw"])) for i, t in enumerate(turns)]
    parts.append(_polyline(points, "#9e9e9e", 1.2))
    points = [(scale.x(i), scale.y(t["chars_out"])) for i, t in enumerate(turns)]
    parts.append(_polyline(points, "#1f77b4", 1.8))
    parts += _marks(scale, turns)
    entries = [("raw history", "#9e9e9e", ""), ("context sent", "#1f77b4", "")]
    entries += [(label, colour, dashes) for _, label, colour, dashes in LINES]
    entries += [("▼ compaction", "#9467bd", ""), ("| trim", "#2ca02c", "")]
    parts += _legend(entries)
    parts.append("</svg>")
    return "".join(parts)
