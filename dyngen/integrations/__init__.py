"""How each trainer's batch ends reach dyngen: one module per trainer.

`verl` follows a running verl job's metrics file and rollout dumps (`dyngen follow`);
`trl` is a `transformers.TrainerCallback` plus a dataset that follows the newest version.
`rollouts` writes the per-step rollouts files both hand to a round.
"""
