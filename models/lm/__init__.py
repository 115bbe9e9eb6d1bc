"""Language models for speculative decoding: the target, its drafts (MoA, EAGLE-style,
independent) and the decoding loop."""
