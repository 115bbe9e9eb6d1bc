"""The HTTP API: FastAPI routes for devices, bundles, OTA, queries, jobs and the dashboard, and
the bounded-input middleware in front of them. The router modules do not postpone annotations
(no ``from __future__ import annotations``): FastAPI reads a route's dependencies from its
annotations at run time, and some name a dependency made inside the router's function."""
