"""Tensor parallelism over attention heads: the one sharding rule, and the torch.distributed plumbing.

The rule is TensorRT-LLM's (tensorrt_llm/models/{llama,qwen}/convert.py, 1.2), written once here for
builder/trtllm_checkpoint.py (which writes rank{N}.safetensors with it) and crisp_trt.runtime (which shards a
loaded HF model with it), so rank r of `crisp-run --tp N` runs exactly the heads of TensorRT-LLM's rank r:

  q_proj            weight and bias split by heads (dim 0)
  k_proj, v_proj    the same, after duplicating each kv head tp // kv times when kv heads < tp
  o_proj            split on dim 1 (row parallel: partial sums all-reduced, the bias added once)
  gate/up_proj      split on dim 0 (column parallel)
  down_proj         split on dim 1 (row parallel)
  anything else     replicated (embedding, norms; the converter alone splits lm_head, on vocab)

CRISP is per head, so a rank runs the unchanged op on its heads. The MLP is split too (not replicated): it
halves each rank's MLP weights and FLOPs, which at long prefill are as large as attention's projections,
for one all-reduce of [n, hidden] per layer, and it keeps the runtime on the converter's rule.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

COLUMN, KV, ROW = "column", "kv", "row"
RULES = {"self_attn.q_proj": COLUMN, "self_attn.k_proj": KV, "self_attn.v_proj": KV, "self_attn.o_proj": ROW,
         "mlp.gate_proj": COLUMN, "mlp.up_proj": COLUMN, "mlp.down_proj": ROW}


def valid_sizes(heads: int, kv_heads: int, intermediate: int | None = None) -> list[int]:
    """Every tp the rule accepts: divides the heads (and the MLP width), and divides or is a multiple of the
    kv heads."""
    return [t for t in range(1, heads + 1) if heads % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)
            and (intermediate is None or intermediate % t == 0)]


def check(tp, heads: int, kv_heads: int, intermediate: int | None = None, arg: str = "--tp") -> None:
    """Raise ValueError naming `arg` unless the model can be split tp ways by the rule."""
    valid = valid_sizes(heads, kv_heads, intermediate)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp not in valid:
        shape = f"num_attention_heads={heads}, num_key_value_heads={kv_heads}" + (
            f", intermediate_size={intermediate}" if intermediate is not None else "")
        raise ValueError(f"{arg} {tp!r}: expected one of {', '.join(map(str, valid))} for this model ({shape}): "
                         "tensor parallelism splits the attention heads and the MLP evenly across ranks, and the "
                         "kv heads evenly or by duplicating each (kv heads < tp)")


def model_shape(cfg: dict) -> tuple[int, int, int | None]:
    """(heads, kv heads, intermediate size) from an HF config dict (a multimodal wrapper's text_config)."""
    cfg = cfg.get("text_config") or cfg
    heads = cfg["num_attention_heads"]
    return heads, cfg.get("num_key_value_heads") or heads, cfg.get("intermediate_size")


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    return max(kv_heads // tp, 1)


def split(t: torch.Tensor, tp: int, rank: int, dim: int) -> torch.Tensor:
    """Rank `rank`'s equal part of t along dim, in its own storage (a view would keep the whole tensor alive)."""
    if t.shape[dim] % tp:
        raise ValueError(f"cannot split dim {dim} of size {t.shape[dim]} into tp={tp} equal parts")
    return torch.chunk(t, tp, dim=dim)[rank].clone(memory_format=torch.contiguous_format)


def dup_kv(t: torch.Tensor, kv_heads: int, tp: int) -> torch.Tensor:
    """TensorRT-LLM's dup_kv_weight / dup_kv_bias: each kv head's rows repeated tp // kv_heads times, in place
    (a weight [kv·d, hidden] or a bias [kv·d])."""
    rep = tp // kv_heads
    head = t.shape[0] // kv_heads
    rest = t.shape[1:]
    return t.reshape(kv_heads, head, *rest).repeat_interleave(rep, dim=0).reshape(kv_heads * rep * head, *rest)


def kind_of(name: str) -> str | None:
    """The rule's kind (COLUMN / KV / ROW) of an HF parameter name ("...layers.3.self_attn.q_proj.weight"),
    None for a replicated one."""
    module = name.rsplit(".", 1)[0]
    return next((kind for suffix, kind in RULES.items() if module.endswith(suffix)), None)


def shard(name: str, t: torch.Tensor, tp: int, rank: int, kv_heads: int) -> torch.Tensor:
    """Rank `rank`'s part of the HF parameter `name` under the rule (the tensor itself where replicated; a
    row-parallel bias stays whole: it is added once, after the all-reduce)."""
    kind = kind_of(name)
    if kind is None or tp == 1 or (kind == ROW and t.dim() == 1):
        return t
    if kind == ROW:
        return split(t, tp, rank, 1)
    if kind == KV and kv_heads < tp:
        t = dup_kv(t, kv_heads, tp)
    return split(t, tp, rank, 0)


class RowParallelLinear(torch.nn.Module):
    """y = all_reduce(x · W_rᵀ) + b over the process group: W_r is this rank's slice of the input features."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group=None):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, self.weight)
        torch.distributed.all_reduce(y, group=self.group)
        return y if self.bias is None else y + self.bias


@torch.no_grad()
def shard_model(model, tp: int, rank: int, group=None):
    """Shard an HF Llama-family model in place for rank `rank` of `tp` (torch.distributed initialised when
    tp > 1): the rule's projections become this rank's slices (row-parallel ones RowParallelLinear), each
    attention module's GQA group size follows its local heads. Returns the model."""
    heads, kv, inter = model_shape(model.config.to_dict())
    check(tp, heads, kv, inter, arg="tp")
    if tp == 1:
        return model
    for name, module in list(model.named_modules()):
        kind = kind_of(name + ".weight")
        if kind is None or not isinstance(module, torch.nn.Linear):
            continue
        weight = shard(name + ".weight", module.weight.detach(), tp, rank, kv)
        bias = None if module.bias is None else shard(name + ".bias", module.bias.detach(), tp, rank, kv)
        if kind == ROW:
            new = RowParallelLinear(weight, bias, group)
        else:  # built on "meta" (no allocation, no init), then given the shard
            new = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
            new.weight = torch.nn.Parameter(weight, requires_grad=False)
            if bias is not None:
                new.bias = torch.nn.Parameter(bias, requires_grad=False)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
    for module in model.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "q_proj"):
            module.num_key_value_groups = (heads // tp) // kv_heads_per_rank(kv, tp)
    return model


# ---- processes --------------------------------------------------------------------------------------------

def init(rank: int, tp: int, device_type: str, port: int) -> torch.device:
    """Join the local process group on `port` (NCCL on CUDA, one GPU per rank; gloo on the CPU, the cores
    shared out) and return this rank's device."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl", rank=rank, world_size=tp, device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=tp)
    return device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, tp: int, port: int, device_type: str, fn, args: tuple, out: str) -> None:
    device = init(rank, tp, device_type, port)
    try:
        result = fn(rank, tp, device, *args)
        if rank == 0:
            torch.save(result, out)
    finally:
        torch.distributed.destroy_process_group()


def spawn(fn, tp: int, device_type: str, *args):
    """Run fn(rank, tp, device, *args) in tp fresh processes joined in one process group and return rank 0's
    result (fn: a module-level function; its result travels through torch.save). A rank's exception is
    re-raised here with its traceback, and the other ranks are stopped."""
    import tempfile

    import torch.multiprocessing as mp

    if device_type == "cuda" and tp > torch.cuda.device_count():
        raise ValueError(f"--tp {tp}: expected at most the {torch.cuda.device_count()} visible GPU(s) "
                         "(one GPU per rank)")
    with tempfile.TemporaryDirectory(prefix="crisp_tp_") as tmp:
        out = str(Path(tmp) / "rank0.pt")
        mp.spawn(_entry, args=(tp, _free_port(), device_type, fn, args, out), nprocs=tp, join=True)
        return torch.load(out, weights_only=False)
