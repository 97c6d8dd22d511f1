"""Report training steps and phases, or an inference server's requests, to the node's goodput-exporter.

    from goodput_client import Telemetry

    telemetry = Telemetry()                      # workload and rank from the launcher's environment
    for batch in telemetry.data_wait(loader):    # time spent waiting on the loader -> data_wait
        with telemetry.step(tokens=batch_tokens, samples=len(batch)):
            with telemetry.phase("compute"):
                loss = model(batch).sum(); loss.backward(); optimizer.step()

    per_token = decoder_flops_per_token(n_params, n_layers, n_heads, head_dim, seq_len)   # for MFU
    telemetry = Telemetry(resumed_from_step=loaded_step, flops_per_token=per_token, dtype="bf16")
    with telemetry.phase("checkpoint_save"):     # after a restart, steps count on from loaded_step + 1
        save(model)

    telemetry = Telemetry("chat", ttft_objective_seconds=0.5, tpot_objective_seconds=0.05)
    with telemetry.request(model="llama-3-8b", prompt_tokens=len(prompt)) as r:   # in a request handler
        for chunk in generate(prompt):
            r.token()                            # TTFT, the inter-token gaps and TPOT, from these
            yield chunk

Standard library only, and cheap to import: the HTTP client, JSON and logging load when a Telemetry
is created or first needs them. The wire format is `goodput_client.contract`.
"""

from __future__ import annotations

from .contract import (
    DEFAULT_FLOPS_DTYPE,
    DEFAULT_SOCKET,
    DEFAULT_TPOT_OBJECTIVE,
    DEFAULT_TTFT_OBJECTIVE,
    FINISH_REASONS,
    FLOPS_DTYPES,
    PHASES,
    workload_folder,
)
from .flops import decoder_flops_per_token
from .telemetry import Telemetry

__version__ = "0.1.0"
__all__ = ["DEFAULT_FLOPS_DTYPE", "DEFAULT_SOCKET", "DEFAULT_TPOT_OBJECTIVE", "DEFAULT_TTFT_OBJECTIVE",
           "FINISH_REASONS", "FLOPS_DTYPES", "PHASES", "Telemetry", "__version__", "decoder_flops_per_token",
           "workload_folder"]
