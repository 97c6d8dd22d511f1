"""The live demo stack: a simulated training job beside the daemon, Prometheus and Alertmanager."""
