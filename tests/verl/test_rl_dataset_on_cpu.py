# Adapted from verl's tests/utils/dataset/test_rl_dataset_on_cpu.py at the 0.9.x release
# (the version whose `maybe_filter_out_long_prompts` calls `filter(fn, num_proc, desc)`, as
# the installed verl 0.9.1 does). Copyright 2024 Bytedance Ltd. and/or its affiliates,
# Licensed under the Apache License, Version 2.0 (http://www.apache.org/licenses/LICENSE-2.0).
#
# What changed, and only that: every test runs twice, once with verl's own `RLHFDataset` and
# once with dyngen's `VerlDyngenDataset`, built the way a verl user builds it (verl's
# `create_rl_dataset` with `data.custom_cls`) over a dyngen store seeded from the same files;
# the `__new__`-built mocks are built from the class under test. Inputs verl's CI keeps under
# ~ are used where present; otherwise the gsm8k tests read a file in verl's gsm8k format
# written here, with the Qwen3 tokenizer the other tests use, and the vision tests (which need
# ~/models/Qwen/Qwen2-VL-2B-Instruct and, for images, ~/data/geo3k) are skipped for both
# classes: nothing is downloaded. The video fixture writes under tmp_path, not the cwd.
# verl's lines are kept as verl wrote them, longer than this repository's limit:
# ruff: noqa: E501
"""verl's own dataset tests, for verl's RLHFDataset and dyngen's VerlDyngenDataset alike."""

import json
import os
from copy import deepcopy
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torch.utils.data import DataLoader
from verl import DataProto
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import hf_processor, hf_tokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

from dyngen.trainers.verl_dataset import VerlDyngenDataset

DEEPSEEK = os.path.expanduser("~/models/deepseek-ai/deepseek-coder-1.3b-instruct")
QWEN2_VL = os.path.expanduser("~/models/Qwen/Qwen2-VL-2B-Instruct")
GEO3K = os.path.expanduser("~/data/geo3k/train.parquet")
needs_qwen2_vl = pytest.mark.skipif(
    not os.path.isdir(QWEN2_VL), reason=f"needs the vision model {QWEN2_VL} (a hub download)")
needs_geo3k = pytest.mark.skipif(
    not os.path.isfile(GEO3K), reason=f"needs verl's geo3k images {GEO3K} (a hub download)")


@pytest.fixture(params=[RLHFDataset, VerlDyngenDataset], ids=["verl", "dyngen"])
def dataset_cls(request):
    return request.param


@pytest.fixture
def build(dataset_cls, tmp_path):
    """The class under test over `data_files`: verl's directly, dyngen's through verl's
    `create_rl_dataset` with `data.custom_cls`, seeding a store from the same files."""

    def make(data_files, tokenizer, config, processor=None, max_samples=-1):
        if dataset_cls is RLHFDataset:
            return RLHFDataset(data_files=data_files, tokenizer=tokenizer, config=config,
                               processor=processor, max_samples=max_samples)
        data = OmegaConf.merge(config, {
            "custom_cls": {"path": "pkg://dyngen.verl_dataset", "name": "VerlDyngenDataset"},
            "dyngen": {"dataset": "verl-test", "root": str(tmp_path / "store")}})
        dataset = create_rl_dataset(data_files, data, tokenizer, processor, max_samples=max_samples)
        assert isinstance(dataset, VerlDyngenDataset) and dataset.version == 0
        return dataset

    return make


@pytest.fixture
def _mock_rlhf_dataset(dataset_cls):
    def mock():
        dataset = dataset_cls.__new__(dataset_cls)
        dataset.prompt_key = "prompt"
        dataset.image_key = "images"
        dataset.video_key = "videos"
        dataset.audio_key = "audios"
        dataset.processor = object()
        return dataset

    return mock


@pytest.fixture
def gsm8k(tmp_path, qwen_tokenizer_dir):
    """(tokenizer path, gsm8k train file): verl CI's if present, else the Qwen3 tokenizer and
    64 rows in the format of verl's examples/data_preprocess/gsm8k.py."""
    local_path = os.path.expanduser("~/data/gsm8k/train.parquet")
    tokenizer = DEEPSEEK if os.path.isdir(DEEPSEEK) else qwen_tokenizer_dir
    if os.path.isfile(local_path):
        return tokenizer, local_path
    instruction = "Let's think step by step and output the final answer after \"####\"."
    rows = []
    for i in range(64):
        question = f"Natalia sold clips to {i + 2} friends, {i} clips each. How many clips?"
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": question + " " + instruction}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i * (i + 2))},
            "extra_info": {"split": "train", "index": i, "answer": f"#### {i * (i + 2)}",
                           "question": question},
        })
    path = tmp_path / "gsm8k" / "train.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    return tokenizer, str(path)


def test_rl_dataset(build, gsm8k):
    tokenizer = hf_tokenizer(gsm8k[0])
    local_path = gsm8k[1]
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 256,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 2,
        }
    )
    dataset = build(data_files=local_path, tokenizer=tokenizer, config=config)

    dataloader = DataLoader(dataset=dataset, batch_size=16, shuffle=True, drop_last=True, collate_fn=collate_fn)

    a = next(iter(dataloader))

    tensors = {}
    non_tensors = {}

    for key, val in a.items():
        if isinstance(val, torch.Tensor):
            tensors[key] = val
        else:
            non_tensors[key] = val

    data_proto = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    assert len(data_proto) == 16
    assert "raw_prompt" in data_proto.non_tensor_batch


def test_rl_dataset_with_max_samples(build, gsm8k):
    tokenizer = hf_tokenizer(gsm8k[0])
    local_path = gsm8k[1]
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 256,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 2,
            "max_samples": 5,
        }
    )
    dataset = build(data_files=local_path, tokenizer=tokenizer, config=config, max_samples=5)
    assert len(dataset) == 5


def test_build_messages_accepts_image_path(_mock_rlhf_dataset):
    dataset = _mock_rlhf_dataset()
    image_path = "file:///tmp/image.jpg"
    example = {
        "prompt": [{"role": "user", "content": "Describe <image>"}],
        "images": [image_path],
    }

    messages = dataset._build_messages(example, key=dataset.prompt_key)

    assert messages[0]["content"] == [
        {"type": "text", "text": "Describe "},
        {"type": "image", "image": image_path},
    ]


@pytest.mark.parametrize(
    ("videos", "expected_video"),
    [
        (["file:///tmp/video.mp4"], "file:///tmp/video.mp4"),
        ([["file:///tmp/frame1.jpg", "file:///tmp/frame2.jpg"]], ["file:///tmp/frame1.jpg", "file:///tmp/frame2.jpg"]),
        ([[Path("/tmp/frame1.jpg"), Path("/tmp/frame2.jpg")]], ["/tmp/frame1.jpg", "/tmp/frame2.jpg"]),
    ],
)
def test_build_messages_accepts_video_path_or_frame_list(_mock_rlhf_dataset, videos, expected_video):
    dataset = _mock_rlhf_dataset()
    example = {
        "prompt": [{"role": "user", "content": "Describe <video>"}],
        "videos": videos,
    }

    messages = dataset._build_messages(example, key=dataset.prompt_key)

    assert messages[0]["content"] == [
        {"type": "text", "text": "Describe "},
        {"type": "video", "video": expected_video},
    ]


def test_maybe_filter_out_long_prompts_accepts_image_path(_mock_rlhf_dataset, monkeypatch):
    class FakeDataFrame(list):
        def filter(self, fn, num_proc=None, desc=None):
            return FakeDataFrame([doc for doc in self if fn(doc)])

    class FakeProcessor:
        def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
            return "formatted prompt"

        def __call__(self, **kwargs):
            assert kwargs["images"] == ["processed-image"]
            return {"input_ids": [[1, 2, 3]]}

    captured = {}

    def fake_process_multi_modal_info(cls, messages, image_patch_size, config):
        captured["messages"] = deepcopy(messages)
        return ["processed-image"], None, None

    monkeypatch.setattr(
        RLHFDataset,
        "_process_multi_modal_info",
        classmethod(fake_process_multi_modal_info),
    )

    dataset = _mock_rlhf_dataset()
    dataset.processor = FakeProcessor()
    dataset.tokenizer = None
    dataset.filter_overlong_prompts = True
    dataset.apply_chat_template_kwargs = {}
    dataset.tool_schemas = None
    dataset.image_patch_size = 14
    dataset.config = OmegaConf.create({})
    dataset.max_prompt_length = 10
    dataset.mm_processor_kwargs = {}
    dataset.num_workers = None

    image_path = "file:///tmp/image.jpg"
    dataframe = FakeDataFrame(
        [
            {
                "prompt": [{"role": "user", "content": "Describe <image>"}],
                "images": [image_path],
            }
        ]
    )

    filtered = dataset.maybe_filter_out_long_prompts(dataframe)

    assert len(filtered) == 1
    assert captured["messages"][0]["content"] == [
        {"type": "text", "text": "Describe "},
        {"type": "image", "image": image_path},
    ]


@needs_qwen2_vl
@needs_geo3k
def test_image_rl_data(build):
    tokenizer = hf_tokenizer(os.path.expanduser("~/models/Qwen/Qwen2-VL-2B-Instruct"))
    processor = hf_processor(os.path.expanduser("~/models/Qwen/Qwen2-VL-2B-Instruct"))
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 1024,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": None,  # num_workers=1 hang in ci
        }
    )
    dataset = build(
        data_files=os.path.expanduser("~/data/geo3k/train.parquet"),
        tokenizer=tokenizer,
        config=config,
        processor=processor,
    )

    dataloader = DataLoader(dataset=dataset, batch_size=16, shuffle=True, drop_last=True, collate_fn=collate_fn)

    a = next(iter(dataloader))

    tensors = {}
    non_tensors = {}

    for key, val in a.items():
        if isinstance(val, torch.Tensor):
            tensors[key] = val
        else:
            non_tensors[key] = val

    data_proto = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    assert len(data_proto) == 16
    assert "images" not in data_proto.non_tensor_batch

    for prompt in data_proto.non_tensor_batch["raw_prompt"]:
        assert len(prompt) == 1
        prompt = prompt[0]
        role, content = prompt["role"], prompt["content"]
        assert role == "user"
        assert len(content) == 2
        assert content[0]["type"] == "image" and isinstance(content[0]["image"], Image.Image)
        assert content[1]["type"] == "text" and isinstance(content[1]["text"], str)

    print("raw_prompt", data_proto.non_tensor_batch["raw_prompt"][0])


@pytest.fixture
def video_data_file(tmp_path):
    data = [
        {
            "problem_id": 17,
            "problem": "How does the crowd's excitement change as the match progresses?",
            "data_type": "video",
            "prompt": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video", "video": "LLaVA-Video-178K/academic_source/activitynet/v_2g9GrshWQrU.mp4"},
                        {
                            "type": "text",
                            "text": "How does the crowd's excitement change as the match progresses? "
                            "A. It fluctuates; B. It decreases; C. It builds up; D. It remains the same. "
                            "Put your answer in <answer></answer>",
                        },
                    ],
                }
            ],
            "problem_type": "multiple choice",
            "solution": "C",
            "data_source": "LLaVA-Video-178K/2_3_m_academic_v0_1",
        }
    ] * 30

    # Create test directory if it doesn't exist
    os.makedirs(tmp_path / "test_data", exist_ok=True)
    test_file = str(tmp_path / "test_data/test_video.json")
    with open(test_file, "w") as f:
        json.dump(data, f, indent=2)

    return test_file


@needs_qwen2_vl
def test_video_rl_data(build, video_data_file):
    tokenizer = hf_tokenizer(os.path.expanduser("~/models/Qwen/Qwen2-VL-2B-Instruct"))
    processor = hf_processor(os.path.expanduser("~/models/Qwen/Qwen2-VL-2B-Instruct"))
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 1024,
            "filter_overlong_prompts": False,
        }
    )
    dataset = build(
        data_files=video_data_file,
        tokenizer=tokenizer,
        config=config,
        processor=processor,
    )

    dataloader = DataLoader(dataset=dataset, batch_size=16, shuffle=True, drop_last=True, collate_fn=collate_fn)
    batch = next(iter(dataloader))
    tensors = {}
    non_tensors = {}
    for key, val in batch.items():
        if isinstance(val, torch.Tensor):
            tensors[key] = val
        else:
            non_tensors[key] = val

    data_proto = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    assert len(data_proto) == 16
    assert "images" not in data_proto.non_tensor_batch

    print("raw_prompt", data_proto.non_tensor_batch["raw_prompt"][0])
