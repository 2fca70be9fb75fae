"""One exception tree for dyngen.

Every error a user can cause derives from :class:`DyngenError`. Where Python or
verl raise a built-in for the same situation (``FileNotFoundError`` for a missing
generator file, ``TypeError`` for a generator of the wrong class), our class also
derives from that built-in, so code written against verl keeps catching it.
"""

from __future__ import annotations


class DyngenError(Exception):
    """Root of every error dyngen raises on purpose."""


class ConfigError(DyngenError, ValueError):
    """A configuration value is missing, mistyped or out of range."""


class DatasetNameError(DyngenError, ValueError):
    """A dataset name is not a safe single path component."""


class StoreError(DyngenError):
    """Base class for errors of the versioned dataset store."""


class DatasetNotFoundError(StoreError, LookupError):
    """The dataset has no committed version under the store root."""

    dataset: str | None = None  # the name asked for, to suggest a close one


class DatasetExistsError(StoreError):
    """A dataset with this name already has a version 0."""


class VersionNotFoundError(StoreError, LookupError):
    """The requested version number is not in the dataset's log."""


class VersionVacuumedError(VersionNotFoundError):
    """The version's record remains, but retention (`dyngen vacuum`) removed its data."""


class CompactionConflictError(StoreError):
    """The shards a compaction rewrote were changed by another commit meanwhile."""


class CommitConflictError(StoreError):
    """Another writer committed on the parent this commit expected."""

    def __init__(self, dataset: str, expected_parent: int | None, found: int | None) -> None:
        self.dataset = dataset
        self.expected_parent = expected_parent
        self.found = found
        super().__init__(
            f"commit conflict on dataset {dataset!r}: expected parent {expected_parent}, "
            f"found {found}. Rebase the commit on the new head (Store.rebase) and commit again."
        )


class SchemaMismatchError(StoreError, ValueError):
    """Rows do not fit the dataset's schema."""


class StoreFullError(StoreError, OSError):
    """A local store's disk (or quota, or file size limit) had no room for a write; the write
    committed nothing."""

    def __init__(self, message: str, errno: int, strerror: str | None,
                 filename: str | None = None) -> None:
        super().__init__(message)
        # The OSError's own fields, as the kernel gave them (errno.ENOSPC, its text, the file).
        self.errno, self.strerror, self.filename = errno, strerror, filename

    def __str__(self) -> str:
        return str(self.args[0])


class CorruptionError(StoreError):
    """A version record or shard on disk is damaged, missing or out of bounds."""


class BatchEndError(StoreError, ValueError):
    """A batch end (or a key naming one) is malformed: its run id, step, metrics or rollouts."""


class CoverageError(StoreError):
    """A version cannot cover the batch ends it names; nothing was committed."""


class AlreadyCoveredError(CoverageError):
    """Some batch ends a commit covers are covered by a version committed meanwhile."""

    def __init__(self, dataset: str, version: int | None, entries: tuple[tuple[str, int], ...],
                 head: int) -> None:
        self.dataset, self.version, self.entries, self.head = dataset, version, entries, head
        shown = ", ".join(describe_batch_end(k) for k in entries[:5])
        shown += " …" if len(entries) > 5 else ""
        by = f"version {version}" if version is not None else f"a version up to {head}"
        super().__init__(
            f"dataset {dataset!r}: {len(entries)} of the batch ends this commit covers "
            f"({shown}) are already covered, by {by} (head {head}); expected none covered. "
            "Nothing was committed and this commit's shards were removed: a round that "
            "finds its batch ends covered is done; to run for what is still pending, read "
            "Store.pending again and start a new round.")


class CoverageOrderError(CoverageError, ValueError):
    """A version would cover a run's step while an earlier step of the run stays pending."""


class NotInInboxError(CoverageError, LookupError):
    """A version would cover a batch end the dataset's inbox does not hold."""


def describe_batch_end(key: tuple[str, int]) -> str:
    """A batch end's key for messages: `run 'a' step 3`."""
    return f"run {key[0][:80]!r} step {key[1]}"


class MirrorError(DyngenError):
    """A mirror of a dataset in another format (Delta Lake) cannot be written or continued."""


class ImportFormatError(DyngenError, ValueError):
    """An input file is not in verl's RL parquet/jsonl format."""


class GeneratorError(DyngenError):
    """Base class for errors loading or running a data generator."""


class GeneratorNotFoundError(GeneratorError, FileNotFoundError):
    """The generator's file or module does not exist."""


class GeneratorImportError(GeneratorError, ImportError):
    """The generator's module exists but raised while being imported."""


class DyngenImportError(DyngenError, ImportError):
    """A module a round needs failed to import (a broken install, or a module shadowing it)."""


class MissingDependencyError(GeneratorError, ImportError):
    """An optional dependency (a generator's, or Ray's) is not installed."""


class GeneratorClassNotFoundError(GeneratorError, AttributeError):
    """The generator's module has no attribute with the configured class name."""


class GeneratorTypeError(GeneratorError, TypeError):
    """The configured generator is not a subclass of AbstractDataGenerator."""


class GeneratorOutputError(GeneratorError, TypeError):
    """A generator returned something that is not a set of rows."""


class TriggerError(DyngenError, ValueError):
    """A round's trigger (event payload) is malformed, mistyped or too large."""


class PrefectServerError(DyngenError, RuntimeError):
    """The Prefect server a command needs could not be started or reached."""


class RolloutsError(TriggerError):
    """A trigger's rollouts file is out of bounds (place, kind, size) or not rollouts JSONL."""


class ModelError(DyngenError):
    """A chat model refused the round's requests for good (bad key, unknown model, bad requests)."""


class ModelUnavailableError(ModelError):
    """A served chat model was unreachable, or down, timing out or overloaded: a retry may pass."""


class FilterError(DyngenError, TypeError):
    """A row filter broke its contract: not one verdict per row, or a verdict of the wrong kind."""


class SandboxError(DyngenError):
    """Base class for errors of the sandbox that runs model-written code."""


class SandboxUnavailableError(SandboxError, RuntimeError):
    """The isolated sandbox (bubblewrap) cannot run on this machine."""


class SandboxInputError(SandboxError, ValueError):
    """What was handed to the sandbox cannot cross its boundary as data."""
