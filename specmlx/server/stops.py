"""Stop strings over streamed text: nothing of a stop string ever reaches the client.

Text arrives in pieces (one per target call) and a stop string may span pieces, so the
tail of what has arrived that could still be the start of a stop string is held back until
the next piece decides it.
"""

from __future__ import annotations


class StopText:
    """Feed text pieces; get back what is safe to send, and whether a stop string came."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.held = ""  # arrived, not sent: it may be the start of a stop string
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that may be sent now. After a stop string, always ""."""
        if self.stopped:
            return ""
        text = self.held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[: min(hits)]
        keep = self._partial(text)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What is still held, once the generation has ended without a stop string."""
        text, self.held = self.held, ""
        return "" if self.stopped else text

    def _partial(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
