"""NExUME: energy-aware training (DynFit) of switchable-precision networks, the user's own
networks, checkpoints, multi-process training, and trained models as simulator tasks."""
