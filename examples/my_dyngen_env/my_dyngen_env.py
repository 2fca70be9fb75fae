"""my_dyngen_env: the dyngen dataset my-data as a verifiers environment (prime-rl, vf eval)."""

from dyngen.trainers.verifiers import DyngenHarness, DyngenTaskset, load_environment

__all__ = ["DyngenTaskset", "DyngenHarness", "load_environment"]
