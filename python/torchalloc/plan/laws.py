"""How a block's size follows the batch (or whatever knob two runs differ in): the laws `torchalloc plan` applies.

A block's law is given by one number, its *ratio* rho: its size at knob value
r (the second run, or a nominal r for one run) over its size at 1 (the run
the prediction is built on). Sizes are polynomials in the knob with
non-negative coefficients in practice (a parameter: constant; an activation:
linear in the batch; attention's scores: quadratic in the sequence length;
a fixed part plus a per-token part: affine), so the law through the two
points (1, 1) and (r, rho) is taken from that family, by the exponent
e = log(rho) / log(r):

- rho = 1: constant;
- 0 < e <= 1: affine, c0 + c1 x (pure linear when e = 1);
- 1 < e <= 2: c1 x + c2 x^2 (pure quadratic when e = 2);
- otherwise (shrinking, or steeper than quadratic): the power x^e.

Two runs measure a law only within that family's reach: a pair of sizes
that shrinks, or grows faster than the square of the knob, is no law of
the knob but a choice made anew between the runs (such as cuDNN picking
another algorithm and workspace at the larger batch; ResNet-50's logs at
batch 32 and 64 held pairs whose power laws put a block past any device at
4x). `off_law` names them; the model gives them their category's law.

One run gives no second point: a block of a category that grows with the
batch gets rho = r (linear), any other rho = 1 (SCALING, FIXED below); the
categories the analysis could not attribute (UNATTRIBUTED) are kept at
their size by the prediction and scaled by its upper bound.
"""
from __future__ import annotations

import numpy as np

from ..analysis import CATEGORIES, Category

# What grows with the batch: what the forward saves for backward, every temporary of a step (the inputs among
# them: the analysis names a batch's tensors by how they live, as activations or temporaries).
SCALING = (Category.ACTIVATIONS, Category.TEMPORARIES, Category.BACKWARD_TEMPORARIES)
# What the model's size decides: parameters, their gradients, the optimizer's state and its intermediates (one
# per parameter), the libraries' workspaces (cuBLAS: a fixed size per handle and stream).
FIXED = (Category.PARAMETERS, Category.GRADIENTS, Category.OPTIMIZER_STATE, Category.OPTIMIZER_INTERMEDIATES,
         Category.WORKSPACE)
# What the analysis could not say: persistent blocks that are none of the above (a batch kept on the GPU, a KV
# cache, an EMA copy, model buffers), blocks of no rule, blocks allocated before the log.
UNATTRIBUTED = (Category.OTHER_PERSISTENT, Category.OTHER, Category.BEFORE_LOG)
assert set(SCALING) | set(FIXED) | set(UNATTRIBUTED) == set(CATEGORIES), "every category has its law"

_CODE = {c: k for k, c in enumerate(CATEGORIES)}
SCALING_CODES = np.array([_CODE[c] for c in SCALING], dtype=np.int8)
FIXED_CODES = np.array([_CODE[c] for c in FIXED], dtype=np.int8)
UNATTRIBUTED_CODES = np.array([_CODE[c] for c in UNATTRIBUTED], dtype=np.int8)
BEFORE_LOG_CODE = _CODE[Category.BEFORE_LOG]

NOMINAL_RATIO = 2.0  # one run: the second point a linear law goes through (any r > 1 gives the same line)
_EDGE = 1e-9  # an exponent this close to 1 or 2 is that integer (sizes are integers; their ratios exact)


def exponent(rho: np.ndarray, r: float) -> np.ndarray:
    """e = log(rho) / log(r) per block (0 where rho is 1)."""
    return np.log(np.maximum(rho, 1e-300)) / np.log(r)


def off_law(rho: np.ndarray, r: float) -> np.ndarray:
    """Per ratio: it shrinks or grows faster than quadratic in the knob (module docstring); nan: False."""
    rho = np.asarray(rho, dtype=np.float64)
    e = exponent(np.where(np.isnan(rho), 1.0, rho), r)
    return ~np.isnan(rho) & ((e < -_EDGE) | (e > 2 + _EDGE))


def growth(rho: np.ndarray, r: float, x: float) -> np.ndarray:
    """Each block's size at knob x over its size at 1, by the law through (1, 1) and (r, rho) (module docstring).
    r must not be 1."""
    rho = np.asarray(rho, dtype=np.float64)
    e = exponent(rho, r)
    out = np.power(float(x), e)  # shrinking, or steeper than quadratic
    affine = (e > 0) & (e <= 1 + _EDGE)
    out[affine] = 1.0 + (rho[affine] - 1.0) * (x - 1.0) / (r - 1.0)
    quadratic = (e > 1 + _EDGE) & (e <= 2 + _EDGE)
    c2 = (rho[quadratic] - r) / (r * r - r)
    out[quadratic] = (1.0 - c2) * x + c2 * x * x
    out[rho == 1.0] = 1.0
    return out


def law_name(rho: float, r: float) -> str:
    """The law of one ratio, in words: 'constant', 'linear', 'affine', 'quadratic', 'linear + quadratic',
    'power 2.4'."""
    if rho == 1.0:
        return "constant"
    e = float(exponent(np.array([rho]), r)[0])
    if abs(e - 1) <= 1e-6:
        return "linear"
    if abs(e - 2) <= 1e-6:
        return "quadratic"
    if 0 < e < 1:
        return "affine"
    if 1 < e < 2:
        return "linear + quadratic"
    return f"power {e:.2f}"


def one_run_ratios(category: np.ndarray, r: float = NOMINAL_RATIO) -> np.ndarray:
    """One run's ratios: r (linear) for a category that grows with the batch, 1 for any other."""
    return np.where(np.isin(category, SCALING_CODES), r, 1.0)
