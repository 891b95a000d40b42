"""Optional integrations (loggers, search); each imported only when used."""
