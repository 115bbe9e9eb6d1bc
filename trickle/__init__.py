"""trickle: deep learning on energy-harvesting, intermittently powered sensor nodes.

This package is only the ``trickle`` command; the work lives in the tier packages
(``edge``, ``simulator``, ``models``, ``export``, ``server``).
"""



def __getattr__(name: str) -> str:
    import edge

    if name != "__version__":
        raise AttributeError(f"module 'trickle' has no attribute {name!r}")
    return str(edge.__version__)
