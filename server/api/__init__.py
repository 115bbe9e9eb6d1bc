"""The HTTP API: FastAPI routes for devices, bundles, OTA, queries, jobs and the dashboard, and
the bounded-input middleware in front of them."""
