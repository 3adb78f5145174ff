"""The usual estimate, measured: params + optimizer state + max(grads + optimizer intermediates, activations).

Holds `Estimate`: every term is the peak over time of the live bytes of
its categories (rules/categorize.py), then the estimate those terms add up to,
the measured peak, and the categories live at the peak. The second pass
follows each term's live bytes and keeps their peak (passes/second.py's
ESTIMATE_TERMS); Analysis.estimate (result.py) builds the row, its
sentence written by wording.estimate_sentence.
"""
from __future__ import annotations

import dataclasses
from typing import Any




@dataclasses.dataclass
class Estimate:
    """The usual estimate's terms, measured: each is the peak of that category's live bytes."""

    parameters: int
    gradients: int
    optimizer_state: int
    optimizer_intermediates: int
    activations: int
    gradients_plus_intermediates: int  # peak of their sum (not the sum of peaks)
    temporaries: int
    workspace: int
    other: int
    estimate: int  # parameters + optimizer_state + max(gradients + intermediates, activations)
    measured_peak: int
    at_peak: dict[str, int]
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def rows(self) -> list[tuple[str, int]]:
        """(term, bytes) in the order every report shows them."""
        return [
            ("parameters", self.parameters),
            ("optimizer state", self.optimizer_state),
            ("gradients", self.gradients),
            ("optimizer intermediates", self.optimizer_intermediates),
            ("gradients + intermediates (peak together)", self.gradients_plus_intermediates),
            ("activations (saved for backward)", self.activations),
            ("temporaries (not in the estimate)", self.temporaries),
            ("library workspaces (not in the estimate)", self.workspace),
            ("estimate", self.estimate),
            ("measured peak allocated", self.measured_peak),
        ]


