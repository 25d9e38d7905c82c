"""Statistics the distribution tests share: the two-sample Kolmogorov-Smirnov statistic and its bound."""
import math

import numpy as np


def ks_statistic(a, b):
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a) -
                         np.searchsorted(b, grid, side="right") / len(b)))


def ks_bound(n, m, c=1.36):
    """The statistic two samples of one distribution stay below with ~95% probability (c = 1.36)."""
    return c * math.sqrt((n + m) / (n * m))
