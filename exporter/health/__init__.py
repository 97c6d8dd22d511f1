"""Acting on GPU failure risk: the risk levels (`risk`), `goodput-exporter health` (`command`), the schedulers it
speaks to (`slurm`) and the state file its decisions are kept in (`state`), which the daemon's `health` source
publishes as goodput_health_actions_total.

The health command is a short-lived process (slurmd runs it every HealthCheckInterval, node-problem-detector every
invoke_interval), so what must outlive one run (a drain waiting for a checkpoint, when the node was last drained, the
count of every decision) lives in a small JSON state file beside the daemon's other state; the daemon reads it on
each collection and exposes the counts, so the decisions are scraped with the node's other series.
"""
