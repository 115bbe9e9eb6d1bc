"""Classification on a device: a verified bundle's variants on an inference backend, its
pre-processing, DynInfer's choice of variant, and FIRMBOUND's early decisions."""
