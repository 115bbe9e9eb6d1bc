"""trickle: deep learning on energy-harvesting, intermittently powered sensor nodes.

This package is only the ``trickle`` command; the work lives in the tier packages
(``simulator``, ``edge``, ``models``, ``export``, ``server``).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trickle")
except PackageNotFoundError:  # running from a checkout without an install
    __version__ = "0+unknown"
