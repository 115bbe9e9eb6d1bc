"""Writes bundles: ONNX, ExecuTorch, TFLite and C sources, with parity checks and signatures."""
