"""How far to draft: the loop asks a policy before every step and tells it what happened.

`FixedK` drafts a fixed k (`-k N`); `AdaptiveK` chooses k each step from calibrated costs and
what it measures (`-k auto`, docs/adaptive-k.md).
"""

from specmlx.engine.policy.adaptive import AdaptiveK, Experience
from specmlx.engine.policy.base import Policy
from specmlx.engine.policy.fixed import FixedK
from specmlx.engine.policy.pricing import LearnedCosts
from specmlx.engine.step import Plan

__all__ = ["AdaptiveK", "Experience", "FixedK", "LearnedCosts", "Plan", "Policy"]
