"""One NExUME training run's configuration (``TrainConfig``), kept apart from the training code so that
reading it — and the data it names — needs no torch: a bad data set or option is one line in well
under a second, before the training stack is imported (models.nexume.train re-exports it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from edge.core.config import Config
from edge.core.errors import ConfigError
from models.data.base import Dataset
from simulator.devices import known_mcu

Method = Literal["nexume", "uniform", "qat8", "fp32"]


class TrainConfig(Config):
    """One training run."""

    dataset: str = Field("digits", min_length=1)
    """Which task: fsdd, basic_motions, digits, or your own data (a folder of audio per label, a .csv or
    .parquet table, an .npz with X and y, or ucr:NAME; see models.data.userdata)."""
    label_column: str = "label"
    """Your table's column of class labels."""
    id_column: str | None = None
    """Your table in long format (a row per time step): the column naming each example."""
    time_column: str | None = None
    """Long format: the column that orders an example's rows."""
    pad: bool = False
    """Zero-pad series of unequal length to the longest (otherwise they are an error)."""
    fill: Literal["linear", "previous", "zero"] | None = None
    """Your data's empty cells: an error naming row and column (default), or filled along time."""
    drop_missing_labels: bool = False
    """Your data's examples without a label: an error naming them (default), or left out."""
    ignore_columns: list[str] = Field(default_factory=list)
    """Your table's columns that are not part of the series (names, notes): left out."""
    split_column: str | None = None
    """Your table's column saying which rows (long format: which examples) are "train" and which "test":
    that split is kept instead of holding out ``test_fraction``."""
    delimiter: str | None = Field(None, min_length=1, max_length=1)
    """Your CSV's field separator (default: sniffed among , ; tab |)."""
    decimal: Literal[".", ","] | None = None
    """Your CSV's decimal mark (default: a comma where the separator is not one and number cells are so written)."""
    test_fraction: float = Field(0.2, gt=0, lt=1)
    """Your data without a test split: the share held out (stratified, seeded by ``seed``)."""
    min_per_class: int = Field(5, ge=2, le=100_000)
    """Your data: fewer examples of a class is an error."""
    model: str | None = None
    """Your network instead of the built-in CNN: ``pkg.module:function``, called with (input shape, number of
    classes), returning a torch.nn.Module (see models.nexume.custom)."""
    method: Method = "nexume"
    """nexume, uniform (energy-unaware ablation), qat8 (fixed 8-bit QAT) or fp32."""
    epochs: int = Field(30, ge=1, le=10_000)
    """Passes over the training split in the main phase."""
    finetune_epochs: int = Field(0, ge=0, le=1000)
    """nexume: passes fine-tuning the rarely updated weights, dropout and quantization off (the paper's
    regularization; off by default since issue 30: with in-place distillation it cost 4.4 points of
    accuracy within deadline over bench nexume's ablation cells)."""
    rare_fraction: float = Field(0.1, ge=0.0, le=1.0)
    """nexume: share of weights (the least often updated) that the fine-tuning touches."""
    batch_size: int = Field(64, ge=1, le=65536)
    """Mini-batch size."""
    lr: float = Field(3e-3, gt=0, le=1)
    """Adam learning rate."""
    seed: int = Field(0, ge=0)
    """Seeds initialisation, batching and the energy draws."""
    d_max: float = Field(0.5, ge=0.0, lt=1.0)
    """Largest structured dropout (at zero energy)."""
    q_min: int = Field(2, ge=2, le=8)
    """Bit-width at zero energy."""
    q_max: int = Field(8, ge=2, le=8)
    """Bit-width at full energy."""
    lambda_q: float = Field(0.01, ge=0)
    """λ1: weight of the precision cost term."""
    lambda_d: float = Field(0.01, ge=0)
    """λ2: weight of the dropout cost term."""
    search_temperature: float = Field(0.5, gt=0, le=10)
    """τ of the configuration search: lower picks the best (q, d) more greedily."""
    schedule: Literal["deployment", "search"] = "deployment"
    """nexume: ``deployment`` trains each (q, d) as often as DynInfer runs it on ``harvest_scenario``'s
    simulated nodes (models.nexume.deployment), plus ``full_share`` of the steps at full width;
    ``search``: the λ-weighted search per energy draw (ConfigSearch)."""
    full_share: float = Field(0.25, ge=0.0, le=1.0)
    """nexume with the deployment schedule: the share of steps that train the full network (q_max
    bits, no dropout) whatever the node runs, so it stays strong where energy is plenty."""
    spread: float = Field(0.5, ge=0.0, le=1.0)
    """nexume with the deployment schedule: of the other steps, the share spread evenly over every
    (q, d) the node runs at all (the rest follow how often it runs each): a variant that runs
    rarely, when energy is scarce, still gets trained."""
    distill: float = Field(1.0, ge=0.0, le=100.0)
    """nexume with the deployment schedule: weight of in-place distillation (slimmable networks'):
    a cheaper configuration's step also matches, by KL divergence, the full network's most recent
    outputs on the same examples (kept from its own steps, so it costs no extra forward); 0: off."""
    mcu: str = "msp430fr5994"
    """MCU whose cost model prices the variants (simulator.devices.MCUS)."""
    harvest_scenario: str = "nrel_24h"
    """Bundled scenario name or TOML file whose simulated node supplies the energy draws."""

    @field_validator("mcu")
    @classmethod
    def _known_mcu(cls, name: str) -> str:
        return known_mcu(name, "mcu")

    def load_data(self, data_root: str | os.PathLike[str] | None = None) -> Dataset:
        """The task's data: a built-in data set, or the user's read with this config's options."""
        from models.data.datasets import load
        from models.data.userdata import UserData

        opts = UserData(label_column=self.label_column, id_column=self.id_column, time_column=self.time_column,
                        pad=self.pad, test_fraction=self.test_fraction, seed=self.seed,
                        min_per_class=self.min_per_class, fill=self.fill, drop_missing_labels=self.drop_missing_labels,
                        ignore_columns=tuple(self.ignore_columns), split_column=self.split_column,
                        delimiter=self.delimiter, decimal=self.decimal)
        return load(self.dataset, data_root, options=opts)

    @field_validator("dataset")
    @classmethod
    def _absolute(cls, spec: str) -> str:
        """The user's data by its absolute path, so that a checkpoint finds it from anywhere."""
        from models.data.datasets import DATASETS

        path = Path(spec).expanduser()
        if spec in DATASETS or spec.startswith("ucr:") or not path.exists():
            return spec
        return str(path.resolve())

    @field_validator("harvest_scenario")
    @classmethod
    def _scenario_exists(cls, name: str) -> str:
        from simulator.config import scenario_path

        if not scenario_path(name).is_file():
            raise ConfigError("harvest_scenario", name, "must name a bundled scenario (trickle simulate --list) or a TOML file")
        return name

    @model_validator(mode="after")
    def _bits_ordered(self) -> TrainConfig:
        if self.q_min > self.q_max:
            raise ConfigError("q_min", self.q_min, f"must be <= q_max ({self.q_max})")
        return self
