"""The trainer's side: how batch ends reach dyngen and how a trainer reads the newest rows.

`events` (emit_batch_end: the batch end is recorded in the store's inbox, and the event
only wakes a round) and `outbox` (without a store, the event waits there while the server
is away); `dataset` (DyngenDataset, emit or inline) and `verl_dataset` (verl's drop-in
`data.custom_cls`); `verl_follow` and `verl_files` follow a running verl job's metrics
file and rollout dumps (`dyngen follow`), `prime_rl_follow` a prime-rl run's; `trl` is a
`transformers.TrainerCallback` plus a dataset that follows the newest version through
`row_stream`, as `verifiers` (a verifiers v1 taskset for prime-rl and `vf eval`) does;
`rollouts` writes the per-step rollouts files a round reads; `verl_format` imports verl's
parquet files as version 0 and exports versions back.
"""
