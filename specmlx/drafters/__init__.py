"""Drafting strategies. Each proposes tokens for the one verify loop in `specmlx.decode`."""

from specmlx.drafters.base import Draft, Drafter, Verdict

__all__ = ["Draft", "Drafter", "Verdict"]
