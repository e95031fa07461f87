"""The fleet simulator: the real cache, engine and routing code on a ManualClock."""
