"""The contract between training, devices and the server: the bundle manifest and its schema,
signed bundles, test vectors, and the edge ↔ server protocol."""
