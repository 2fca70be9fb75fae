"""verl's `data.dyngen` section for VerlDyngenDataset: read, defaulted and checked; which
set verl is building; the inline round's config. Free of verl imports."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from omegaconf import ListConfig, OmegaConf

from dyngen.difficulty.frontier import sampler_of
from dyngen.errors import ConfigError
from dyngen.locations import store_root

# verl's data keys that mean the same in dyngen's `data:` section (see dyngen.config).
SHARED_DATA_KEYS = ("prompt_key", "max_prompt_length", "filter_overlong_prompts",
                    "apply_chat_template_kwargs", "datagen", "tokenizer")


def settings_of(config: Any) -> dict[str, Any]:
    """`data.dyngen` as plain values, with defaults, checked."""
    section = config.get("dyngen") if config is not None else None
    plain = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) \
        else dict(section or {})
    name = plain.get("dataset")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"data.dyngen.dataset: expected the name of a dyngen dataset, found "
                          f"{name!r}. Add +data.dyngen.dataset=NAME to verl's config.")
    root = store_root(plain.get("root"))
    return {"dataset": name, "root": str(root), "mode": plain.get("mode", "emit"),
            "every_n_batches": plain.get("every_n_batches", 1),
            "generate_on_start": plain.get("generate_on_start", False),
            "start_timeout": plain.get("start_timeout", 600.0),
            "run": training_run(config, plain.get("run")),
            "config": plain.get("config") or {},
            "sampler": sampler_of(plain.get("sampler", "fresh_first")),
            "seed": int(plain.get("seed", config.get("seed") or 0))}


def training_run(config: Any, run: Any) -> str | None:
    """`data.dyngen.run`, else verl's `trainer.experiment_name` (from the whole config the
    data section belongs to), else None ($DYNGEN_RUN, or dyngen's default)."""
    if run is not None:
        return str(run)
    try:
        found = OmegaConf.select(config._get_root(), "trainer.experiment_name")
    except Exception:  # a plain dict, or a section verl passed on its own
        return None
    return str(found) if found not in (None, "") else None


def is_train(data_files: Any, config: Any) -> bool:
    """Whether verl builds the training set (the store's) rather than the validation set:
    other files than `data.train_files`, or the same files where verl's `create_rl_dataset`
    was called with `is_train=False` (a flag it does not pass on to the class)."""
    train = config.get("train_files") if config is not None else None
    if train is None:
        return True
    if paths(data_files) != paths(train):
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "create_rl_dataset" \
                and str(frame.f_globals.get("__name__", "")).startswith("verl."):
            return bool(frame.f_locals.get("is_train", True))
        frame = frame.f_back
    return True


def paths(files: Any) -> list[str]:
    return [str(f) for f in files] if isinstance(files, list | tuple | ListConfig) else [str(files)]


def round_config(settings: Mapping[str, Any], data: Any, tokenizer: Any) -> dict[str, Any]:
    """The inline round's config: `data.dyngen.config`, then verl's shared `data` keys."""
    base = dict(settings["config"])
    shared = {k: data.get(k) for k in SHARED_DATA_KEYS if data.get(k) is not None}
    shared = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
              for k, v in shared.items()}
    local = getattr(tokenizer, "name_or_path", None)
    if "tokenizer" not in shared and isinstance(local, str) and os.path.isdir(local):
        shared["tokenizer"] = local  # verl copied the model to local disk: same tokenizer
    base["data"] = {**dict(base.get("data") or {}), **shared}
    return base
