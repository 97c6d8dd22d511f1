"""DCGM: the backend interface, the real bindings, the simulator, and a dcgm-exporter reader."""
