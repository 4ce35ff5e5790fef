"""Shared test helpers: fixtures, stand-ins, data and the processes tests start."""
