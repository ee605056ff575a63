"""The hit-rate curve as an image: the exact step curve over every capacity, with the recorded
capacity, the target and the recommended capacity marked (matplotlib, no display needed).
"""
from __future__ import annotations

import os

import numpy as np

from mmscope.cache_size.report import human_bytes
from mmscope.errors import UserError


def step_points(c) -> tuple[np.ndarray, np.ndarray]:
    """(capacities, hit rates) where the curve steps, from the largest item to past saturation."""
    finite = c.distances[: c.repeats]
    xs = np.unique(np.concatenate(([c.largest_item], finite[finite > c.largest_item])))
    ends = [c.saturation * 2] + ([c.recorded_capacity * 1.25] if c.recorded_capacity else [])
    xs = np.append(xs, max(ends))
    hits = np.searchsorted(c.distances, xs, "right")
    return xs, hits / c.queries


def write_plot(c, r: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs, rates = step_points(c)
    ax.step(xs, 100 * rates, where="post", color="tab:blue", label="model hit rate")
    ax.axhline(100 * r["target_hit_rate"], color="tab:gray", ls=":",
               label=f"target {100 * r['target_hit_rate']:g}%")
    _mark_capacities(ax, c, r)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(lambda x, _pos: f"{x:g}")
    ax.set_xlabel("encoder-cache capacity (embedding tokens)")
    ax.set_ylabel("hit rate (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    if r["bytes_per_token"]:
        _bytes_axis(ax, r)
    engines = len(r["engines"])
    ax.set_title(f"{os.path.basename(r['log'])}: {c.queries} accesses, {engines} "
                 f"engine{'s' if engines > 1 else ''}, release={c.release}", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:  # the folder was checked before the replay; a full disk remains
        raise UserError(f"--plot {path}: cannot write ({e.strerror or e})") from None
    finally:
        plt.close(fig)


def _mark_capacities(ax, c, r: dict) -> None:
    if c.recorded_capacity:
        ax.axvline(c.recorded_capacity, color="tab:orange", ls="--",
                   label=f"recorded {c.recorded_capacity} "
                         f"({100 * r['recorded_hit_rate']:.1f}% in the log)")
    if r["recommended_tokens"]:
        n = r["recommended_tokens"]
        ax.plot([n], [100 * c.hit_rate(n)], "o", color="tab:green",
                label=f"recommended {n} ({100 * c.hit_rate(n):.1f}%)")


def _bytes_axis(ax, r: dict) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    per = r["bytes_per_token"]

    top = ax.secondary_xaxis("top", functions=(lambda x: x * per, lambda b: b / per))
    lo, hi = ax.get_xlim()
    ticks = [t * per for t in ax.get_xticks() if lo <= t <= hi]
    top.xaxis.set_major_locator(FixedLocator(ticks))
    top.xaxis.set_minor_locator(NullLocator())
    top.xaxis.set_major_formatter(lambda b, _pos: human_bytes(round(b)))
    top.tick_params(labelsize=7)
    top.set_xlabel(f"bytes ({r['bytes_from']})", fontsize=8)
