"""Training data: the built-in tasks and the user's own recordings, tables and archives."""
