"""Background samplers. Each module holds one source; `base` is the interface they share."""
