"""Model FLOPs of a training step, for `Telemetry(flops_per_token=...)` and model FLOPs utilization (MFU).

Model FLOPs are the floating-point operations the model needs, whatever the implementation does: a
forward recomputed under activation checkpointing, padding or a fused kernel's extra work is not counted
(that would be hardware FLOPs). MFU is model FLOPs per second over the hardware's peak.

Standard library only, nothing imported.
"""

from __future__ import annotations


def _positive(name: str, value: object, *, whole: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        kind = "an int" if whole else "a number"
        raise ValueError(f"{name}={value!r}: expected {kind} > 0")
    if not 0 < value < float("inf"):  # type: ignore[operator]  # an int or float, checked above; NaN fails too
        raise ValueError(f"{name}={value!r}: expected a finite number > 0")


def decoder_flops_per_token(n_params: float, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    """Training (forward and backward) model FLOPs per token of a dense decoder-only transformer,
    6·N + 12·L·H·Q·T, as PaLM computes its MFU (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling
    with Pathways", Appendix B).

    6·N, the matrix multiplications with the weights: each weight is multiplied once per token in the
    forward pass (2 FLOPs: a multiply and an add) and twice in the backward pass (the gradients of the
    activations and of the weight), 2 + 4 = 6 FLOPs per parameter per token. `n_params` is N, the
    parameters that take part in those multiplications: in PaLM's convention the embedding parameters
    are not counted as such, since an input embedding is a lookup, not a matrix multiplication; the output
    projection to the vocabulary is one, and counts, tied to the input embedding or not. PaLM ties them,
    and its own figure counts them once: 46.2% MFU for PaLM 540B at 238.3K tokens/s on 6144 TPU v4 chips
    (275 TFLOP/s bf16 each) follows from N = 540.35e9, its parameter count with the 4.7e9 shared
    embedding matrix in (45.8% without it). So pass the parameters less a separate (untied) input
    embedding.

    12·L·H·Q·T, the attention scores and their weighted sum (Q·Kᵀ and A·V): per layer, per head, per
    token, 2 matrix products of Q·T multiply-adds each forward (2·2·Q·T FLOPs), three times that for the
    forward and backward, 12·Q·T; L layers (`n_layers`), H heads (`n_heads`), Q the head dimension
    (`head_dim`), T the sequence length (`seq_len`). As in PaLM, the full T-by-T attention is counted, not the
    half that a causal mask leaves (a causal kernel that skips the masked half does less work than this
    says); with grouped- or multi-query attention H is the number of query heads.

    Megatron-LM (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
    Using Megatron-LM", eq. 3) counts 96·B·s·l·h²·(1 + s/6h + V/16lh) FLOPs per iteration of B sequences
    of s tokens, l layers, hidden size h, vocabulary V, with full activation recomputation: the layers'
    24·B·s·h² + 4·B·s²·h forward FLOPs each (weights, then attention) four times (forward, recomputed
    forward, backward twice as much), and the logits' 2·B·s·h·V three times. Per token (divided by B·s)
    and without the recomputation, 72·l·h² + 12·l·h·s + 6·V·h: the same as 6·N + 12·L·H·Q·T with
    N = 12·l·h² + V·h (a GPT layer's weights with a 4h MLP, and the output projection), H·Q = h and
    T = s. Megatron's figure counts the recomputed forward (hardware FLOPs); this does not (model FLOPs).

    ValueError when `n_params` is not a finite number > 0 or the others not ints > 0.
    """
    _positive("n_params", n_params, whole=False)
    for name, value in (("n_layers", n_layers), ("n_heads", n_heads), ("head_dim", head_dim),
                        ("seq_len", seq_len)):
        _positive(name, value, whole=True)
    return float(6 * n_params + 12 * n_layers * n_heads * head_dim * seq_len)
