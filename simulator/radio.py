"""Radio propagation: the one path-loss model that RF harvesting and the gateway link share.

Log-distance path loss anchored by the Friis free-space equation at d0 = 1 m (Rappaport,
Wireless Communications, 2nd ed.: section 4.2 for Friis, eq. 4.68 for the log-distance model):

    P_rx = P_tx * G_t * G_r * (lambda / (4 pi d0))^2 * (d0 / d)^n,    lambda = c / f

With n = 2 this is Friis at every distance. ``received_power_w`` is the model; ``path_loss_db``
is the same model in decibels (isotropic antennas: PL = -10 log10(P_rx / P_tx)).

    received_power_w(3.0, 3.0, 915e6, 2.0, gain_dbi=6.1)  # W at a 3 m receiver
    path_loss_db(np.array([10.0, 100.0]), 868e6, 2.7)      # dB
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np

from edge.core.errors import ConfigError

SPEED_OF_LIGHT_M_S = 299_792_458.0
REFERENCE_DISTANCE_M = 1.0  # d0, where the Friis equation anchors the log-distance model

D = TypeVar("D", float, np.ndarray)


def received_power_w(tx_power_w: float, distance_m: D, frequency_hz: float, exponent: float, gain_dbi: float = 0.0) -> D:
    """Power (W) received at ``distance_m`` (>= d0) from ``tx_power_w`` radiated at ``frequency_hz``.

    ``exponent`` is the path-loss exponent n (2 in free space); ``gain_dbi`` is the sum of the
    transmit and receive antenna gains. ``distance_m`` may be a number or an array.
    """
    wavelength_m = SPEED_OF_LIGHT_M_S / frequency_hz
    gains = 10.0 ** (gain_dbi / 10.0)
    friis_d0 = (wavelength_m / (4.0 * math.pi * REFERENCE_DISTANCE_M)) ** 2
    return tx_power_w * gains * friis_d0 * (REFERENCE_DISTANCE_M / distance_m) ** exponent


def path_loss_db(distance_m: object, frequency_hz: float, exponent: float) -> np.ndarray:
    """Path loss (dB) between isotropic antennas, elementwise over ``distance_m`` (> 0)."""
    d_m = np.asarray(distance_m, dtype=np.float64)
    if np.any(~(d_m > 0)):
        raise ConfigError("distance_m", float(d_m.min()), "distances must be > 0")
    if not frequency_hz > 0:
        raise ConfigError("frequency_hz", frequency_hz, "must be > 0")
    return -10.0 * np.log10(received_power_w(1.0, d_m, frequency_hz, exponent))
