"""A bundle's own test vectors: a few examples with every variant's expected outputs.

Export writes them (``test_vectors.npz``, listed in the manifest's ``test_vectors``) from the
test split, with each variant's outputs on the runtime its parity was checked with. A device
self-tests a new bundle on them (``self_test``), and ``trickle flash`` builds its firmware
checks from them, so neither ever needs the training data.

Arrays in the file: ``features`` (N, *model input), float32, what the model sees; ``labels``
(N,), int64; ``raw`` (N, *raw shape) where the raw example has a fixed shape; and one
``expected/<variant>`` (N, classes) float32 per variant.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field

import numpy as np

from edge.core.errors import BundleError

FILE = "test_vectors.npz"
# what a self-test demands of a variant on its own vectors: on the backend the bundle was checked
# with the outputs are identical; another backend (LiteRT, ExecuTorch) may differ in the last bits,
# so the rule is top-1 agreement, and closeness for float variants
MIN_TOP1_AGREEMENT = 0.95
FLOAT_MAX_ABS_DIFF = 1e-3
PREPROCESS_MAX_ABS_DIFF = 1e-4  # float32 rounding of the same steps (edge.classify.preprocess) on another machine


@dataclass(frozen=True)
class TestVectors:
    """A bundle's own test vectors: inputs (and raw inputs where their shape is fixed), labels, and
    every variant's expected outputs."""

    __test__ = False  # not a pytest class

    features: np.ndarray
    labels: np.ndarray
    expected: dict[str, np.ndarray]  # variant name -> (N, classes) outputs
    raw: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {"features": self.features.astype(np.float32), "labels": self.labels.astype(np.int64)}
        arrays.update({f"expected/{name}": out.astype(np.float32) for name, out in sorted(self.expected.items())})
        if self.raw is not None:
            arrays["raw"] = self.raw.astype(np.float32)
        return npz_bytes(arrays)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = FILE) -> TestVectors:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                arrays = {name: z[name] for name in z.files}
            expected = {name.removeprefix("expected/"): a for name, a in arrays.items() if name.startswith("expected/")}
            vectors = cls(arrays["features"], arrays["labels"], expected, arrays.get("raw"))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise BundleError(f"{where}: not a test-vector file ({e})") from None
        n = len(vectors.labels)
        if len(vectors.features) != n or any(len(a) != n for a in expected.values()):
            raise BundleError(f"{where}: arrays of different lengths")
        return vectors


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz (``np.load`` reads it) that is byte-identical for identical arrays: sorted names,
    fixed timestamps (``np.savez`` stamps the current time into the zip)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, array in sorted(arrays.items()):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


@dataclass
class SelfTest:
    """How each variant did on the bundle's test vectors."""

    agreement: dict[str, float] = field(default_factory=dict)  # top-1 agreement with the expected outputs
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    preprocessing_max_abs_diff: float | None = None  # raw → input against the recorded inputs, where raw is kept
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def check_outputs(name: str, bits: int, got: np.ndarray, expected: np.ndarray, report: SelfTest) -> None:
    """Judge one variant's outputs against its expected ones (the rule above) into ``report``."""
    if not np.isfinite(got).all():
        report.failures.append(f"{name}: non-finite outputs")
        return
    agreement = float((got.argmax(1) == expected.argmax(1)).mean())
    diff = float(np.abs(got - expected).max())
    report.agreement[name], report.max_abs_diff[name] = agreement, diff
    if agreement < MIN_TOP1_AGREEMENT:
        report.failures.append(f"{name}: top-1 agrees with the bundle's expected outputs on {agreement:.0%} "
                               f"of its test vectors (need {MIN_TOP1_AGREEMENT:.0%})")
    elif bits == 32 and diff > FLOAT_MAX_ABS_DIFF:
        report.failures.append(f"{name}: outputs differ from the expected ones by {diff:.2e} > {FLOAT_MAX_ABS_DIFF:g}")
