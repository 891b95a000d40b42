"""Adapters turn what a user passes (names, classes, callables) into torch objects."""
