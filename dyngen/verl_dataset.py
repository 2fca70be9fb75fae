"""The path verl's configs name (`data.custom_cls.path=pkg://dyngen.verl_dataset`): the
drop-in dataset itself lives in dyngen.trainers.verl_dataset."""

from dyngen.trainers.verl_dataset import VerlDyngenDataset

__all__ = ["VerlDyngenDataset"]
