"""Shared fixtures: small scenarios that run in well under a second, and trained, exported models
that every test needing one shares (each distinct training runs once per session).

Markers follow from what a test needs, applied here by fixture, folder and import, so the fast tier
(``make test-fast``: ``-m "not (slow or needs_torch or needs_broker or needs_postgres or needs_qemu
or browser)"``) is the tests that need none of them; on an install without torch (``trickle[edge]``)
the ``needs_torch`` ones are skipped, not failed."""

from __future__ import annotations

import importlib.util
import os
import random
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.language import SENTENCES, Models, play, save_llama

if TYPE_CHECKING:
    from models.data.base import Dataset
    from models.nexume.train import TrainResult

os.environ.setdefault("MPLBACKEND", "Agg")  # plots render off-screen (matplotlib need not be installed)

TESTS = Path(__file__).parent
# a fixture (or anything it uses) that needs a marker's part
FIXTURE_MARKS = {
    "trained_bundle": "needs_torch", "models": "needs_torch", "corpus": "needs_torch", "target_dir": "needs_torch",
    "embedded_server": "needs_broker", "mosquitto": "needs_broker", "served": "needs_broker",
    "postgres_url": "needs_postgres", "browser": "browser",
}
# folders whose every test needs one: training and export need torch; firmware the C toolchains and QEMU
FOLDER_MARKS = {"models": "needs_torch", "export": "needs_torch", "bench": "needs_torch", "firmware": "needs_qemu"}
FILE_MARKS = {"test_demo.py": ("needs_torch", "needs_broker", "slow"), "test_mosquitto_acl.py": ("needs_broker",),
              "test_tls.py": ("needs_broker",), "test_ray.py": ("slow",), "test_api_fuzz.py": ("slow",),
              # the docs tier's tutorials train, serve, build firmware and run it under QEMU
              "test_tutorials.py": ("slow", "needs_torch", "needs_broker", "needs_qemu")}
HAVE_TORCH = importlib.util.find_spec("torch") is not None
# without torch (the edge tier's own install) the folders that train or export are not collected
collect_ignore_glob = [] if HAVE_TORCH else ["models/*", "export/*", "bench/*"]


def _imports_torch(module: types.ModuleType | None) -> bool:
    return module is not None and any(isinstance(v, types.ModuleType) and v.__name__.split(".")[0] == "torch"
                                      for v in vars(module).values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        parts = path.relative_to(TESTS).parts
        marks = {mark for fixture, mark in FIXTURE_MARKS.items() if fixture in getattr(item, "fixturenames", ())}
        if len(parts) > 1 and parts[0] in FOLDER_MARKS:
            marks.add(FOLDER_MARKS[parts[0]])
        marks.update(FILE_MARKS.get(path.name, ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgresql" in map(str, callspec.params.values()):
            marks.add("needs_postgres")  # the store's contract, run on both databases
        if _imports_torch(getattr(item, "module", None)):
            marks.add("needs_torch")
        for mark in sorted(marks):
            item.add_marker(mark)
        if item.get_closest_marker("needs_torch") and not HAVE_TORCH:
            item.add_marker(pytest.mark.skip(reason="needs torch (pip install trickle[models])"))


@pytest.fixture
def tiny_overrides() -> dict[str, dict[str, object]]:
    """A 20-minute, 3-node fleet on a constant harvester: fast, with real power cycles."""
    return {
        "run": {"duration_s": 1200.0, "workers": 1, "seed": 5},
        "harvester": {"kind": "constant", "power_w": 2e-3},
        "storage": {"capacitance_f": 2.2e-3},
        "workload": {"sense_period_s": 10.0},
        "nodes": {"count": 3, "record_traces": 2},
    }


@pytest.fixture
def shared_data() -> str:
    from edge.core.files import data_root

    root = data_root()
    if not (root / "harvest" / "nrel").is_dir():
        pytest.skip(f"shared data not found at {root} (set TRICKLE_DATA)")
    return os.fspath(root)


@dataclass(frozen=True)
class Trained:
    """One cached training run and, when formats were asked for, its exported bundle.

    Shared by every test of the session that asks for the same arguments: copy ``result.model``
    (``copy.deepcopy``) before configuring or changing it, and write new files elsewhere.
    """

    checkpoint: Path  # checkpoint.pt (summary.json and summary.md beside it)
    bundle: Path | None  # the bundle folder, or .tar with as_tar; None when no formats were asked for
    data: Dataset  # what it was trained and evaluated on
    result: TrainResult


TrainedBundle = Callable[..., Trained]


@pytest.fixture(scope="session")
def trained_bundle(tmp_path_factory: pytest.TempPathFactory) -> TrainedBundle:
    """``trained_bundle(dataset, method="nexume", epochs=2, formats=None, as_tar=False, harvest_scenario=None)``.

    Trains (once per dataset, method, epochs, harvest_scenario) and saves a checkpoint; with
    ``formats`` (a tuple of export formats, or "all" for every format) also exports an unsigned
    bundle (once per training, formats, as_tar). Everything lives under one session temp folder.
    """
    datasets: dict[str, Dataset] = {}
    trainings: dict[tuple[str, str, int, str | None], tuple[Path, TrainResult]] = {}
    bundles: dict[tuple[object, ...], Path] = {}

    def make(dataset: str, method: str = "nexume", epochs: int = 2, formats: tuple[str, ...] | str | None = None,
             as_tar: bool = False, harvest_scenario: str | None = None) -> Trained:
        from export.bundle import FORMATS, export_bundle
        from models.data.datasets import load
        from models.nexume.checkpoint import save_checkpoint
        from models.nexume.train import TrainConfig, train

        if dataset not in datasets:
            datasets[dataset] = load(dataset)
        data = datasets[dataset]
        key = (dataset, method, epochs, harvest_scenario)
        if key not in trainings:
            scenario = {} if harvest_scenario is None else {"harvest_scenario": harvest_scenario}
            result = train(TrainConfig(dataset=dataset, method=method, epochs=epochs, **scenario), data)
            folder = tmp_path_factory.mktemp(f"trained-{dataset}-{method}-{epochs}")
            save_checkpoint(result, data, folder)
            trainings[key] = (folder / "checkpoint.pt", result)
        checkpoint, result = trainings[key]
        bundle = None
        if formats is not None:
            chosen = tuple(FORMATS) if formats == "all" else tuple(formats)
            bkey = (*key, chosen, as_tar)
            if bkey not in bundles:
                out = tmp_path_factory.mktemp("bundle") / ("bundle.tar" if as_tar else "bundle")
                bundles[bkey] = export_bundle(checkpoint, out, formats=chosen, as_tar=as_tar)
            bundle = bundles[bkey]
        return Trained(checkpoint, bundle, data, result)

    return make


# ---- language models (built once a session, shared by tests/models and tests/server) ----


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    """A tiny random target and two drafts (one over a smaller vocabulary), built once a session."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    from models.lm.target import CHAT_TEMPLATE

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    root = tmp_path_factory.mktemp("llm")
    out = Models(root / "target", root / "draft", root / "draft-small-vocab")
    save_llama(out.target, tokenizer, len(tokenizer), seed=0, layers=2, hidden=32)
    save_llama(out.draft, tokenizer, len(tokenizer), seed=1, layers=1, hidden=16)
    save_llama(out.small_vocab_draft, tokenizer, len(tokenizer) - 10, seed=1, layers=1, hidden=16)
    return out


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Seven synthetic plays: play0..play2 to train on, play3..play6 held out."""
    folder = tmp_path_factory.mktemp("plays")
    rng = random.Random(12)
    for i in range(7):  # play0..play2 trained on, play3..play6 held out (the last four by name)
        (folder / f"play{i}.txt").write_text(play(rng, 300 if i < 3 else 60))
    return folder
