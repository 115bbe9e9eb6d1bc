"""The bundle manifest: the typed contract between training and every device.

    manifest = Manifest.from_json(raw)                   # BundleError naming the field on bad input
    for v in manifest.variants: v.bits, v.drop, v.formats["onnx-int8"], v.energy_j.get("cortex-m4")
    raw = manifest.to_json()                             # canonical bytes: what the signature covers

Export writes it, the edge runtime, the simulator, the server and ``trickle flash`` read it;
nothing else looks inside ``manifest.json``. ``edge/contract/schemas/manifest-v1.json`` is generated
from these models (``python -m edge.contract.manifest`` rewrites it; a test fails when they disagree),
for tools in other languages. Schema version 1 reads every bundle written since the format
began: fields added later (``measured``, ``test_vectors``, a layer's ``outputs``, ``early``) are
optional.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from edge.core.errors import BundleError

SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).parent / "schemas" / f"manifest-v{SCHEMA_VERSION}.json"

PositiveInt = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]
FileName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Fraction = Annotated[float, Field(ge=0, le=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Tensor(_Model):
    """A model input or output."""

    name: str
    shape: list[PositiveInt]
    dtype: Literal["float32", "int8", "uint8", "int32", "int64"]


class RawInput(_Model):
    """One raw example as the sensor gives it."""

    shape: list[PositiveInt]
    dtype: Literal["float32"] = "float32"


class Mfcc(_Model):
    """MFCCs of the first ``duration_s`` of a mono waveform (zero-padded), librosa's definition."""

    op: Literal["mfcc"]
    sample_rate_hz: PositiveInt
    n_mfcc: PositiveInt
    n_fft: PositiveInt
    hop_length: PositiveInt
    n_mels: PositiveInt
    duration_s: float = Field(gt=0)


class Scale(_Model):
    """x * factor."""

    op: Literal["scale"]
    factor: float


class Standardize(_Model):
    """(x - mean) / std; mean and std are numbers or nested lists that broadcast against one example."""

    op: Literal["standardize"]
    mean: float | list[Any]
    std: float | list[Any]

    @field_validator("mean", "std")
    @classmethod
    def _numbers(cls, value: float | list[Any]) -> float | list[Any]:
        def check(v: Any) -> None:
            if isinstance(v, list):
                for item in v:
                    check(item)
            elif isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"must hold numbers only, found {v!r}")

        check(value)
        return value


class Reshape(_Model):
    """The example reshaped (no batch axis)."""

    op: Literal["reshape"]
    shape: list[PositiveInt]


Step = Annotated[Mfcc | Scale | Standardize | Reshape, Field(discriminator="op")]


class Preprocessing(_Model):
    """Raw input → the model's input, applied by ``edge.classify.preprocess`` the same way on every backend."""

    description: str
    raw: RawInput | None = None
    """The raw example's shape; None: variable length (audio)."""
    steps: list[Step]


class Layer(_Model):
    """One layer's cost, from the training tier's cost model."""

    name: str
    macs: Count
    param_bytes: Count
    outputs: Count | None = None
    """Elements of the layer's output activation."""


class MeasuredLayer(_Model):
    """One layer's instructions and output bytes as ``trickle flash --record`` measured them on a
    board."""

    name: str
    instructions: Count
    output_bytes: Count


class Measured(_Model):
    """Instructions counted on a board by ``trickle flash --record`` (total: the median over the test
    vectors; layers: the first vector, each layer's first tile including what precedes it)."""

    cpu: str
    """The simulator's MCU profile these counts apply to (e.g. cortex-m4)."""
    instructions: Count
    layers: list[MeasuredLayer]


class Variant(_Model):
    """One deployable configuration of the model: a bit-width and a dropout level, in some formats."""

    name: str
    bits: Literal[2, 4, 8, 32]
    drop: float = Field(ge=0, lt=1)
    """Share of channels dropped (structured dropout)."""
    layers: list[Layer]
    energy_j: dict[str, Annotated[float, Field(ge=0)]]
    """One inference per MCU profile, from the shared cost model (empty for float variants)."""
    accuracy: dict[str, Fraction]
    """Measured test accuracy per format."""
    formats: dict[str, FileName]
    """Format name (onnx, onnx-int8, pte-xnnpack, pte-portable, tflite) → file in the bundle."""
    measured: dict[str, Measured] | None = None
    """Board → instructions counted there (``trickle flash --record``)."""

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)


class TestVectorsInfo(_Model):
    """Where the bundle keeps a few test examples with every variant's expected outputs, so a
    device can self-test and ``trickle flash`` can check firmware without the training data
    (the file's format: ``edge.contract.vectors``)."""

    file: FileName
    count: PositiveInt


class EarlyInteger(_Model):
    """An early rule in integers: an int8 frame model (``frame``: its fully connected layers, .npz)
    and the stopping rule in fixed point (``rule``: int32 (T − 1, pieces, K + 1) in
    Q``frac_bits``; ``exp``: uint32 exp(−j × ``logit_scale``) in Q16), as ``edge.classify.early`` and the
    firmware's ``tn_early_update`` compute them."""

    frame: FileName
    rule: FileName
    exp: FileName
    frac_bits: int = Field(ge=8, le=30)
    cost_q: int = Field(gt=0)
    """c in Q``frac_bits``."""
    loss_q: int = Field(gt=0)
    """L in Q``frac_bits``."""
    input_scale: float = Field(gt=0)
    """int8 sample = clip(rint(standardized / input_scale), −128, 127)."""
    logit_zero_point: int = Field(ge=-128, le=127)
    logit_scale: float = Field(gt=0)


class EarlyRule(_Model):
    """An early-decision rule (FIRMBOUND, ``edge.classify.early``); ``file`` holds the stopping rule's
    max-affine pieces per decision point. With ``estimator`` ``tandem`` the variant is a frame model,
    fed the last ``context`` samples, and the rule decides at every sample; with ``rocket`` the
    ``features`` file holds causal MiniRocket's convolutions and a linear head per decision point
    (``edge.classify.early_rocket``), and the rule reads the posterior sorted in decreasing order."""

    file: FileName
    horizon: int = Field(ge=2)
    """T: the decision is forced after this many samples."""
    estimator: Literal["tandem", "rocket"] = "tandem"
    features: FileName | None = None
    """``rocket``: the .npz of the convolutions, the decision points and their heads."""
    context: PositiveInt
    cost: float = Field(gt=0)
    """c: the sampling cost per sample, in units of the misclassification loss."""
    loss: float = Field(gt=0)
    """L: the misclassification loss."""
    method: Literal["cfl"]
    integer: EarlyInteger | None = None
    """The same rule in integers, bit-exact between ``edge.classify.early`` and the firmware."""


class Manifest(_Model):
    """``manifest.json`` of a bundle, schema version 1."""

    schema_version: Literal[1]
    model: str = Field(min_length=1)
    """Model name."""
    task: str = Field(min_length=1)
    """What it classifies, e.g. fsdd, basic_motions, digits."""
    labels: list[str] = Field(min_length=1)
    inputs: list[Tensor] = Field(min_length=1)
    outputs: list[Tensor] = Field(min_length=1)
    preprocessing: Preprocessing
    variants: list[Variant] = Field(min_length=1)
    files: dict[FileName, Sha256] = Field(min_length=1)
    """sha256 (hex) of every file of the bundle but manifest.json and its signature."""
    creator: str
    """The trickle version that wrote the bundle."""
    bundle_version: PositiveInt
    """Monotonic: a device refuses one not newer than what it runs."""
    test_vectors: TestVectorsInfo | None = None
    early: EarlyRule | None = None
    """A bundle for early decisions: its stopping rule (``edge.classify.early``)."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.inputs[0].shape)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def to_json(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces, UTF-8): the exact bytes the signature covers."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes, where: object = "manifest.json") -> Manifest:
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise BundleError(f"{where}: not JSON ({e})") from None
        return cls.from_dict(doc, where)

    @classmethod
    def from_dict(cls, doc: Any, where: object = "manifest.json") -> Manifest:
        if not isinstance(doc, dict):
            raise BundleError(f"{where}: must be a JSON object")
        try:
            return cls.model_validate(doc)
        except ValidationError as e:
            err = e.errors()[0]
            at = "/".join(str(p) for p in err["loc"]) or "(top level)"
            more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
            raise BundleError(f"{where} fails schema v{SCHEMA_VERSION} at {at}: {err['msg']}{more}") from None


class LmDraftManifest(_Model):
    """``manifest.json`` of a language-model draft bundle (``kind`` "lm-draft"): the device half of
    client–server speculative decoding (``edge.llm.draft``). Signed and hashed like a classifier
    bundle; ``files`` holds the ONNX graphs and ``tokenizer.json``."""

    schema_version: Literal[1]
    kind: Literal["lm-draft"]
    model: Literal["moa", "eagle"]
    """The draft's architecture: Mixture of Attentions (reads the target's projected states) or
    EAGLE-style (reads the target's last hidden states)."""
    files: dict[FileName, Sha256] = Field(min_length=1)
    creator: str
    bundle_version: PositiveInt
    hidden: PositiveInt
    """Width of the target states (MoA) or features (EAGLE) the server sends (int8 + a float16 scale per token)."""
    heads: PositiveInt
    vocab_size: PositiveInt
    """The draft vocabulary's size; ``vocab_rows`` are its token ids in the target's vocabulary."""
    vocab_rows: list[Count] = Field(min_length=1)
    context: PositiveInt
    target: str
    """The target the draft was trained for (its folder name at export), for people."""
    parity_max_abs_logit: float = Field(ge=0)
    """Largest logit difference between the float32 ONNX graphs and the torch draft, measured at export."""
    precision: Literal["fp32", "int8"] = "fp32"
    """int8: the graphs' weights quantized (onnxruntime dynamic quantization) after the float32
    parity check; verification keeps the output exact, a draft only has to agree often enough."""
    top1_agreement: float | None = Field(None, ge=0, le=1)
    """int8: the share of drafted tokens on which the int8 graphs' argmax is the float32 graphs',
    measured at export along a held-out sequence."""

    def to_json(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", exclude_none=True))

    @classmethod
    def from_json(cls, raw: bytes, where: object = "manifest.json") -> LmDraftManifest:
        try:
            return cls.model_validate_json(raw)
        except ValidationError as e:
            err = e.errors()[0]
            at = "/".join(str(p) for p in err["loc"]) or "(top level)"
            raise BundleError(f"{where}: not an lm-draft manifest: at {at}: {err['msg']}") from None


def canonical_json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def json_schema() -> str:
    """The JSON Schema of ``Manifest``, as committed in ``edge/contract/schemas/``."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"trickle/{SCHEMA_FILE.name}",
              **Manifest.model_json_schema()}
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    from edge.core.files import write_atomic

    write_atomic(SCHEMA_FILE, json_schema())
    print(f"wrote {SCHEMA_FILE}")


def label_indices(labels: list[str] | tuple[str, ...], y: Any, source: str = "labels") -> Any:
    """Class indices (numpy int64) of ``y`` against a bundle's ``labels``: text is mapped by name
    (an unknown name is a DataError naming it); numbers that are all label names (a table whose
    classes were 5 and 7) by name too; other integers in [0, len(labels)) are class indices."""
    import numpy as np

    from edge.core.errors import DataError

    values = np.asarray(y)
    index = {name: i for i, name in enumerate(labels)}

    def name(v: Any) -> str:
        return str(int(v)) if isinstance(v, float) and v.is_integer() and str(v) not in index else str(v)

    names = [name(v) for v in values.tolist()]
    if values.dtype.kind in "USO" or all(n in index for n in names):
        unknown = sorted({n for n in names if n not in index})
        if unknown:
            shown = ", ".join(repr(u) for u in unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
            raise DataError(f"{source}: {shown} not among the bundle's labels ({', '.join(labels[:8])}"
                            f"{', …' if len(labels) > 8 else ''})")
        return np.array([index[n] for n in names], dtype=np.int64)
    if values.dtype.kind not in "iuf" or not np.all(np.mod(values, 1) == 0) or values.min() < 0 \
            or values.max() >= len(labels):
        raise DataError(f"{source}: neither the bundle's label names ({', '.join(labels[:8])}) nor class indices "
                        f"0..{len(labels) - 1}")
    return values.astype(np.int64)
