"""reasoning-gym's task families as a curriculum: `pkg://dyngen.generators.reasoning_gym`.

`ReasoningGymCurriculum` writes each family's rows at the level the policy's rewards call
for; `reward.compute_score` (verl) and `reward.reasoning_gym_reward` (TRL) grade them with
the family's own scorer. Needs `pip install 'dyngen[reasoning-gym]'`.
"""

from dyngen.generators.reasoning_gym.generator import ReasoningGymCurriculum

__all__ = ["ReasoningGymCurriculum"]
