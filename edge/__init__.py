"""The device runtime: bundle loading and verification, inference backends, the DynInfer policy,
the link to the server; and the plumbing every tier shares (``edge.core.errors``, ``edge.core.config``,
``edge.core.files``). Never imports torch (an import-linter contract keeps it so)."""



def __getattr__(name: str) -> str:
    # looked up on first use: importlib.metadata scans every installed distribution (~0.1 s)
    if name != "__version__":
        raise AttributeError(f"module 'edge' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trickle")
    except PackageNotFoundError:  # running from a checkout without an install
        return "0+unknown"
