"""Training-side telemetry: the versioned events API, and the state it accumulates into."""
