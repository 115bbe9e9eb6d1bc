"""A model as firmware for a microcontroller: importers into the integer model (``intmodel`` from a
bundle's QDQ ONNX, ``tflite_import`` from an int8 .tflite), the memory plan (``plan``: one arena,
offsets from tensor lifetimes, and which memory must survive a power cut), C generation
(``cgen``) and building, running and flashing (``flash``)."""
