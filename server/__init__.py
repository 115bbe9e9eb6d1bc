"""HTTP + MQTT service: telemetry, OTA of bundles, and the heavy methods a node cannot carry."""
