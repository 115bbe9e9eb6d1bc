"""The device agent: sensor source, on-disk outbox, MQTT link and over-the-air updates."""
