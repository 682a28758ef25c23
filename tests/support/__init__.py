"""Shared helpers of the tests: the real test clusters, golden scripts, Chromium, fuzzing, stand-in tools."""
