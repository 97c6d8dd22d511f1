"""GPU backends: the real NVML library and the simulator, behind `api.GpuBackend`."""
