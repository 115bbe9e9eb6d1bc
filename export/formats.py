"""The formats ``trickle export`` writes (kept free of heavy imports: ``--help`` lists them)."""

FORMATS = ("onnx", "onnx-int8", "pte", "tflite")  # what --formats takes
# what each of them writes: the manifest's format names and their file suffixes
FILE_FORMATS = {"onnx": {"onnx": ".onnx"}, "onnx-int8": {"onnx-int8": ".onnx"},
                "pte": {"pte-xnnpack": ".xnnpack.pte", "pte-portable": ".portable.pte"}, "tflite": {"tflite": ".tflite"}}
FLOAT_FORMATS = ("onnx", "pte", "tflite")
BOARDS = ("host", "mps2-an386", "stm32f405", "nrf52840")  # what trickle flash builds for
TEST_VECTORS = 32  # test examples a bundle carries by default (edge.contract.vectors)
