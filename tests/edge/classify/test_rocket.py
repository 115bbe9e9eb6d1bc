"""Causal MiniRocket: the batch prefix features against a literal reading of the definition, the
streaming update against the batch, and causality."""

from __future__ import annotations

import numpy as np
import pytest

from edge.classify.rocket import KERNELS, CausalRocket
from edge.core.errors import DataError


def _series(n: int = 6, channels: int = 3, length: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, channels, length)).astype(np.float32)


def test_features_are_the_share_of_positive_outputs_by_the_definition() -> None:
    """The oracle: for one feature, loop over t and the nine taps as the docstring defines them."""
    x = _series()
    rocket = CausalRocket.fit(x, n_features=200, seed=1)
    feats = rocket.prefix_features(x, np.arange(1, 41))
    for f in (0, 57, rocket.n_features - 1):
        pair = rocket.pair_of[f]
        d, taps = int(rocket.dilations[pair]), set(KERNELS[rocket.kernels[pair]].tolist())
        z = x[:, rocket.channels[pair]].sum(axis=1)  # (n, T)
        positive = np.zeros(x.shape[0])
        for t in range(40):
            out = sum((2.0 if j in taps else -1.0) * (z[:, t - (8 - j) * d] if t - (8 - j) * d >= 0 else 0.0)
                      for j in range(9))
            positive += out > rocket.biases[f]
            np.testing.assert_allclose(feats[:, t, f], positive / (t + 1), atol=1e-6)


def test_the_stream_gives_the_batch_features_sample_by_sample() -> None:
    x = _series(n=3, channels=2, length=50, seed=2)
    rocket = CausalRocket.fit(x, n_features=300, seed=0)
    batch = rocket.prefix_features(x, np.arange(1, 51))
    stream = rocket.stream()
    for i in range(3):
        stream.reset()
        got = np.stack([stream.push(x[i, :, t]) for t in range(50)])
        assert np.mean(got == batch[i]) > 0.999  # float32 sums in another order may move a value across a bias


def test_a_prefix_does_not_see_the_future() -> None:
    x = _series()
    rocket = CausalRocket.fit(x, n_features=100)
    changed = x.copy()
    changed[:, :, 20:] = 5.0
    np.testing.assert_array_equal(rocket.prefix_features(x, [5, 20]), rocket.prefix_features(changed, [5, 20]))
    assert not np.array_equal(rocket.prefix_features(x, [30]), rocket.prefix_features(changed, [30]))


def test_dilations_reach_across_the_series_and_features_are_counted_as_asked() -> None:
    rocket = CausalRocket.fit(_series(length=300), n_features=1000)
    assert rocket.n_features == 84 * (1000 // 84)
    assert rocket.dilations.min() == 1 and 16 <= rocket.dilations.max() <= 299 // 8
    assert rocket.receptive_field <= 300


def test_bad_series_are_one_clear_error() -> None:
    rocket = CausalRocket.fit(_series(), n_features=100)
    with pytest.raises(DataError, match="2 channels; the features were fitted on 3"):
        rocket.prefix_features(_series(channels=2), [3])
    with pytest.raises(DataError, match="must lie in 1..40"):
        rocket.prefix_features(_series(), [0, 41])
    bad = _series()
    bad[0, 0, 3] = np.nan
    with pytest.raises(DataError, match="NaN"):
        rocket.prefix_features(bad, [3])
    with pytest.raises(DataError, match="a sample of 2 channels"):
        rocket.stream().push(np.zeros(2))


def test_a_damaged_feature_file_is_one_clear_bundle_error() -> None:
    import io

    from edge.classify.early_rocket import read_rocket
    from edge.core.errors import BundleError

    rocket = CausalRocket.fit(_series(), n_features=100)
    good = {"dilations": rocket.dilations, "kernels": rocket.kernels, "channels": rocket.channels.astype(np.uint8),
            "biases": rocket.biases, "pair_of": rocket.pair_of, "points": np.array([10, 20, 40]),
            "weights": np.zeros((3, 2, rocket.n_features), np.float32), "head_biases": np.zeros((3, 2), np.float32)}

    def npz(**change: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **(good | change))
        return buf.getvalue()

    assert read_rocket(npz(), "rocket.npz", 2, 3, 40)[0].n_features == rocket.n_features
    for change, message in ((dict(points=np.array([10, 5, 40])), "points: increasing"),
                            (dict(dilations=rocket.dilations * 100), "a kernel spanning at most the horizon 40"),
                            (dict(weights=np.zeros((3, 3, rocket.n_features), np.float32)), "weights: shape"),
                            (dict(kernels=rocket.kernels + 84), "kernels: ")):
        with pytest.raises(BundleError, match=message):
            read_rocket(npz(**change), "rocket.npz", 2, 3, 40)
    with pytest.raises(BundleError, match="not a rocket feature file"):
        read_rocket(b"not a zip", "rocket.npz", 2, 3, 40)
