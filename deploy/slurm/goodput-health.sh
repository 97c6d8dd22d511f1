#!/bin/sh
# Slurm HealthCheckProgram (slurm.conf: HealthCheckProgram=/usr/local/sbin/goodput-health.sh, HealthCheckInterval=60,
# HealthCheckNodeState=ANY). slurmd runs it with no arguments and its own environment: the settings come from the
# YAML file, scontrol needs SLURM_CONF where the config is not at its default path.
export GOODPUT_HEALTH_CONFIG="${GOODPUT_HEALTH_CONFIG:-/etc/goodput-exporter/health.yaml}"
exec goodput-exporter health --mode slurm
