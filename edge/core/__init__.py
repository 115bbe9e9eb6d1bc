"""What every tier shares: the ``TrickleError`` family, typed configuration, atomic files, tables."""
