"""Feature statistics as LeRobot v3.0 keeps them (meta/stats.json and per-episode `stats/...` columns).

Each feature gets min, max, mean, std, count and the quantiles q01, q10, q50, q90, q99. Vectors:
per dimension, over frames, shape (D,) (scalars (1,)); NaN entries (a `value` or `policy_action`
where nothing ran) are left out, and a feature with no finite value gets no stats. Images: per
channel in [0, 1], shape (3, 1, 1), over frames sampled as LeRobot samples them (evenly, 100 per
episode up to ~500 frames, then n**0.75); counted in 256-bin histograms, so the dataset's stats are
exact over every sampled frame rather than averaged from episodes.
"""

from __future__ import annotations

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILE_KEYS)
_DOWNSAMPLE_FROM = 300  # images this large are strided to about 150 px before counting (as LeRobot does)


def sample_indices(n: int) -> np.ndarray:
    """Frames of an n-frame episode that image stats look at (LeRobot's rule)."""
    lo = min(100, n)
    count = max(lo, min(int(n**0.75), 10_000))
    return np.round(np.linspace(0, n - 1, count)).astype(np.int64)


def vector_stats(values: np.ndarray) -> dict[str, np.ndarray] | None:
    """Stats of a per-frame feature, `values` (N,) or (N, D); None when no dimension has a finite value."""
    x = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    finite = np.isfinite(x)
    if not len(x) or not finite.any(axis=0).all():
        return None
    if finite.all():  # the common case; numpy's nan-functions are several times slower
        lo, hi, mean, std, qs = x.min(0), x.max(0), x.mean(0), x.std(0), np.quantile(x, QUANTILES, axis=0)
    else:
        x = np.where(finite, x, np.nan)
        lo, hi, mean, std = np.nanmin(x, 0), np.nanmax(x, 0), np.nanmean(x, 0), np.nanstd(x, 0)
        qs = np.nanquantile(x, QUANTILES, axis=0)
    stats = {"min": lo, "max": hi, "mean": mean, "std": std, "count": np.array([len(x)], dtype=np.int64)}
    stats.update(zip(QUANTILE_KEYS, qs))
    return stats


class ImageHistogram:
    """Per-channel 256-bin counts of uint8 frames; `stats()` gives LeRobot's (3, 1, 1) image stats."""

    def __init__(self) -> None:
        self.counts = np.zeros((3, 256), dtype=np.int64)
        self.frames = 0

    def add(self, frames: np.ndarray) -> None:
        """`frames`: (n, H, W, 3) uint8, already sampled."""
        if max(frames.shape[1:3]) >= _DOWNSAMPLE_FROM:
            step = max(frames.shape[1:3]) // 150
            frames = frames[:, ::step, ::step]
        for c in range(3):
            self.counts[c] += np.bincount(frames[..., c].ravel(), minlength=256)
        self.frames += len(frames)

    def merge(self, other: ImageHistogram) -> None:
        self.counts += other.counts
        self.frames += other.frames

    def stats(self) -> dict[str, np.ndarray] | None:
        if not self.frames:
            return None
        levels = np.arange(256) / 255.0
        total = self.counts.sum(axis=1)
        mean = self.counts @ levels / total
        var = (self.counts * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1) / total
        cdf = np.cumsum(self.counts, axis=1)
        present = self.counts > 0
        stats = {
            "min": levels[present.argmax(axis=1)],
            "max": levels[255 - present[:, ::-1].argmax(axis=1)],
            "mean": mean,
            "std": np.sqrt(var),
        }
        for key, q in zip(QUANTILE_KEYS, QUANTILES):
            stats[key] = levels[(cdf < q * total[:, None]).sum(axis=1)]
        stats = {k: v.reshape(3, 1, 1) for k, v in stats.items()}
        stats["count"] = np.array([self.frames], dtype=np.int64)
        return stats


def image_histogram(frames: np.ndarray) -> ImageHistogram:
    """The histogram of one episode's sampled frames, `frames` (T, H, W, 3) uint8."""
    hist = ImageHistogram()
    if len(frames):
        hist.add(np.asarray(frames)[sample_indices(len(frames))])
    return hist


def to_lists(stats: dict[str, np.ndarray]) -> dict[str, list]:
    """JSON-ready stats, keys in LeRobot's order."""
    return {key: np.asarray(stats[key]).tolist() for key in STAT_KEYS}
