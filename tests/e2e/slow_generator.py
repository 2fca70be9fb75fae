"""A generator slower than the trainer: the arithmetic curriculum, after a pause.

benchmarks/chaos.py --fast serves rounds of it (`data.datagen.path=pkg://tests.e2e.slow_generator`,
`data.datagen.name=SlowArithmetic`) so that batch ends (one each 0.5 s) arrive faster than
rounds end (about 3 s each): each round must cover every batch end pending, or the backlog
grows with the step count.
"""

from __future__ import annotations

import time
from typing import Any

import datasets

from dyngen.generators.arithmetic import ArithmeticCurriculum
from dyngen.round.context import RoundContext


class SlowArithmetic(ArithmeticCurriculum):
    """ArithmeticCurriculum that first sleeps `seconds` (data.datagen.seconds, 2.0)."""

    defaults = {**ArithmeticCurriculum.defaults, "seconds": 2.0}

    def generate(self, dataset: Any, context: RoundContext | None = None) -> datasets.Dataset:
        """The curriculum's tasks, `seconds` later (a model's generation time)."""
        time.sleep(float(self.settings()["seconds"]))
        return super().generate(dataset, context)
