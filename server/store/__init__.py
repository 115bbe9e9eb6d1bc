"""The server's storage (SQLite or PostgreSQL) and a throwaway PostgreSQL for tests."""
