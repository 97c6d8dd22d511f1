"""goodput-instrument: goodput telemetry for an unmodified PyTorch job.

`goodput-instrument CMD...` (or a PYTHONPATH holding the daemon's published client) loads a `sitecustomize` in
every Python process, which installs one probe per library as each is imported (`probes.PROBES`: optimizer steps,
DataLoader waits, checkpoints, torch.compile, evaluation, collectives, Hugging Face Trainer, Lightning) and reports
what they measure through a `Telemetry` made when training starts (`recorder`). Standard library only; PyTorch is
never imported by it.
"""
