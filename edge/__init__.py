"""The device runtime: bundle loading and verification, inference backends, the DynInfer policy,
and the link to the server. Never imports torch (an import-linter contract keeps it so)."""
