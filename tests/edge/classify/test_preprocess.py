"""Pre-processing as data: the device reproduces training's model inputs bit for bit from raw input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.classify.preprocess import PreprocessError, apply, read_input, read_wav


@pytest.mark.needs_torch  # the training tier's data sets are the oracle
@pytest.mark.parametrize("name", ["digits", "basic_motions"])
def test_raw_test_split_becomes_the_training_inputs_exactly(name: str) -> None:
    from models.data.datasets import load

    data = load(name)
    assert data.raw_test is not None
    got = np.stack([apply(data.preprocessing, raw) for raw in data.raw_test])
    assert got.dtype == np.float32 and np.array_equal(got, data.x_test)


@pytest.mark.needs_torch
def test_fsdd_wav_becomes_the_training_mfccs_exactly(shared_data: str) -> None:
    from models.data.datasets import load

    data = load("fsdd", shared_data)
    first_test = Path(shared_data) / "fsdd" / "recordings" / "0_george_0.wav"  # sorted, index 0 is a test recording
    x = apply(data.preprocessing, read_input(first_test, data.preprocessing))
    assert np.array_equal(x, data.x_test[0])


def test_clear_errors(tmp_path: Path) -> None:
    pre = {"description": "", "raw": {"shape": [2, 3], "dtype": "float32"},
           "steps": [{"op": "standardize", "mean": [[1.0], [2.0]], "std": [[1.0], [1.0]]}]}
    assert apply(pre, np.ones((2, 3))).tolist() == [[0, 0, 0], [-1, -1, -1]]
    with pytest.raises(PreprocessError, match=r"raw input shape \(3, 2\): this bundle takes \(2, 3\)"):
        apply(pre, np.ones((3, 2)))
    with pytest.raises(PreprocessError, match="step 'fft': not known to this runtime"):
        apply({"raw": None, "steps": [{"op": "fft"}]}, np.ones(3))
    (tmp_path / "x.wav").write_bytes(b"RIFF nonsense")
    with pytest.raises(PreprocessError, match="not a readable WAV file"):
        read_wav(tmp_path / "x.wav")
    (tmp_path / "x.csv").write_text("1,2,three\n")
    with pytest.raises(PreprocessError, match="cannot read numbers"):
        read_input(tmp_path / "x.csv", pre)
