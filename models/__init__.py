"""PyTorch training for intermittent power: datasets, architectures, NExUME and later methods."""
