"""Seconds and bytes: model and hardware specs, prefill / decode / transfer times, reload vs
recompute, calibration. Everything that needs a time takes it from here; nothing here knows the
cache."""
