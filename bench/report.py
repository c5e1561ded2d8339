"""The benchmark table, as text for the terminal and Markdown for BENCHMARKS.md, and a chart."""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path

from bench.scenarios import Result


def verdict(result: Result) -> str:
    return "reported" if result.met is None else ("yes" if result.met else "NO")


def ratio(result: Result) -> str:
    return "-" if result.ratio is None else f"{result.ratio:.2f}x"


def text_table(results: list[Result]) -> str:
    lines = []
    for result in results:
        lines.append(f"* {result.scenario}")
        lines.append(f"    ours: {result.ours} | baselines: {result.baselines}")
        lines.append(f"    ratio: {ratio(result)} | target: {result.target} | met: {verdict(result)}")
        lines += [f"    round by round, {name}: {figures(values)}" for name, values in result.rounds.items()]
    return "\n".join(lines)


def figures(values: list[float]) -> str:
    return ", ".join(f"{value:,.0f}" for value in values)


def rounds(results: list[Result]) -> list[str]:
    """Each round's figures beside the medians the table gives, for the scenarios that keep them."""
    kept = [result for result in results if result.rounds]
    if not kept:
        return []
    lines = ["## Round by round", ""]
    for result in kept:
        lines += [f"**{result.scenario}**", ""]
        lines += [f"* {name}: {figures(values)}" for name, values in result.rounds.items()]
        lines.append("")
    return lines


def markdown(results: list[Result], seconds: float, notes: str) -> str:
    import celery
    import kombu

    rows = [f"| {r.scenario} | {r.ours} | {r.baselines} | {ratio(r)} | {r.target} | {verdict(r)} |" for r in results]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "# Benchmarks",
            "",
            f"`python -m bench` on {when}: {platform.python_implementation()} {platform.python_version()}, "
            f"Celery {celery.__version__}, kombu {kombu.__version__}, RabbitMQ 3.10 (a private node the "
            f"benchmark starts), 2 CPU cores shared with the broker; {seconds / 60:.1f} minutes. Every scenario "
            "runs its baselines in the same run; on this shared, noisy machine the ratios are what to compare, "
            "not the absolute numbers.",
            "",
            "| scenario | ours | baselines | ratio | target | met? |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            "![ratios](bench/chart.png)",
            "",
            *rounds(results),
            notes.strip(),
            "",
        ]
    )


def chart(results: list[Result], path: Path) -> None:
    """One bar group per scenario (needs the ``bench`` extra: matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [result for result in results if result.values]
    figure, axes = plt.subplots(len(shown), 1, figsize=(9, 2.2 * len(shown)))
    for axis, result in zip(axes, shown, strict=True):
        labels, values = list(result.values), list(result.values.values())
        bars = axis.barh(labels, values, color=["#2b6cb0"] + ["#a0aec0"] * (len(values) - 1))
        axis.bar_label(bars, labels=[f"{value:,.1f}" for value in values], padding=3, fontsize=8)
        axis.set_title(result.scenario, fontsize=9, loc="left")
        axis.tick_params(labelsize=8)
        axis.margins(x=0.2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
