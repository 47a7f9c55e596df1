"""The measuring wing: plan, speed, compute bound, profile and memory, above the training core (which imports none of it)."""
