"""The proposer's text helpers: a prompt's question, and a question's comparison form.

Seeds, checking and the generator all compare questions; they read these from here, so
no two of those modules import each other.
"""

from __future__ import annotations

import re

from dyngen.text import question_of

__all__ = ["normalise", "question_of"]


def normalise(text: str) -> str:
    """A question for comparison: case-folded, punctuation and spacing collapsed."""
    return " ".join(re.sub(r"[^\w]+", " ", text.casefold()).split())
