"""Augmentation with labels kept: new rows made from the dataset's own, each label proved.

Configure as `data.datagen: {path: pkg://dyngen.generators.augment, name: <one below>}`:
  RenumberAugmenter       renumber: new numbers, the label recomputed by the row's program;
  ReasoningGymAugmenter   reasoning_gym: the family and level of a reasoning-gym row, a new
                          seed, the label checked by the family's scorer;
  CodeInputsAugmenter     code_inputs: a code task on new inputs, the output recomputed by
                          running the program twice in the sandbox;
  RephraseAugmenter       rephrase: a served model rewrites the question with its numbers;
                          kept only if they match and a solver agrees with the label.
Or subclass `Augmenter` and write `augment(row, context) -> list[row]` (base.py): the base
selects the source rows (select.py), checks the labels, records the provenance.
"""

from dyngen.generators.augment.base import (
    AUGMENTED_FROM,
    DEFAULTS,
    AugmentContext,
    Augmenter,
    BadRow,
    NotApplicable,
    with_question,
)
from dyngen.generators.augment.code_inputs import CodeInputsAugmenter
from dyngen.generators.augment.reasoning_gym import ReasoningGymAugmenter
from dyngen.generators.augment.renumber import RenumberAugmenter
from dyngen.generators.augment.rephrase import RephraseAugmenter
from dyngen.generators.augment.select import SELECTIONS, Source, select_sources

__all__ = [
    "AUGMENTED_FROM",
    "DEFAULTS",
    "SELECTIONS",
    "AugmentContext",
    "Augmenter",
    "BadRow",
    "CodeInputsAugmenter",
    "NotApplicable",
    "ReasoningGymAugmenter",
    "RenumberAugmenter",
    "RephraseAugmenter",
    "Source",
    "select_sources",
    "with_question",
]
