"""Ragged fields: rows whose leading dimension varies from row to row."""
