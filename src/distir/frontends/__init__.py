"""Frontends: where models come from (the built-in zoo; importers later)."""
