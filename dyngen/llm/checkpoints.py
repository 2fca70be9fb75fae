"""Which training step a policy's weights are from, and a trainer's newest checkpoint.

A transformers `Trainer` (TRL's trainers with it) saves `<output_dir>/checkpoint-N` every
`save_steps` steps and writes its `trainer_state.json` last, so a checkpoint is complete
once that file reads as JSON. An in-process policy configured with an `output_dir` loads
the newest complete one; a served policy's step is read from the model name its server
answers with (vLLM names a model served from a path by that path:
`.../checkpoint-40`, verl's `.../global_step_40/...`). Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
MODEL_CONFIG = "config.json"
_STEP_IN_NAME = re.compile(r"(?:^|[/\\_-])(?:checkpoint-|global_step_)(\d+)(?=$|[/\\])")


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest complete `checkpoint-N` in `folder` (a trainer's output_dir), or None."""
    try:
        found = [(int(m.group(1)), p) for p in folder.iterdir()
                 if (m := CHECKPOINT.match(p.name)) and p.is_dir()]
    except OSError:
        return None
    for _, path in sorted(found, reverse=True):
        if (path / MODEL_CONFIG).is_file() and _trainer_step(path) is not None:
            return path
    return None


def policy_step(folder: Path) -> int | None:
    """The training step of the weights in `folder`: its trainer_state.json's
    `global_step`, else N of a `checkpoint-N` name, else None."""
    step = _trainer_step(folder)
    if step is not None:
        return step
    return step_in_name(folder.name)


def step_in_name(name: str | None) -> int | None:
    """N of the last `checkpoint-N` or `global_step_N` in a model's name or path, or None."""
    found = _STEP_IN_NAME.findall(name or "")
    return int(found[-1]) if found else None


def _trainer_step(folder: Path) -> int | None:
    """trainer_state.json's global_step, or None (absent, or still being written)."""
    try:
        step = json.loads((folder / TRAINER_STATE).read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
