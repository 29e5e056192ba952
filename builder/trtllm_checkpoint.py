"""HF Llama-family safetensors → TensorRT-LLM (1.2.x) checkpoint: config.json + rank{N}.safetensors.

Tensor names and TP sharding follow tensorrt_llm/models/llama/convert.py (1.2):
  transformer.vocab_embedding.weight       embed_tokens (replicated; no parallel embedding)
  transformer.layers.{i}.input_layernorm.weight
  transformer.layers.{i}.attention.qkv.weight   cat(q_r, k_r, v_r), each split by heads (dim 0);
                                                kv heads duplicated when num_kv_heads < tp (dup_kv_weight)
  transformer.layers.{i}.attention.dense.weight o_proj split on dim 1 (row parallel)
  transformer.layers.{i}.post_layernorm.weight
  transformer.layers.{i}.mlp.fc.weight     gate_proj split on dim 0
  transformer.layers.{i}.mlp.gate.weight   up_proj   split on dim 0   (HF up → TRT "gate")
  transformer.layers.{i}.mlp.proj.weight   down_proj split on dim 1
  transformer.ln_f.weight
  lm_head.weight                           split on dim 0 (vocab padded to a multiple of tp)
The "crisp" section of the artifact's config.json is carried into the checkpoint config for the engine step.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
       "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_DT_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _load_hf(src: Path) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return {k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}


def _split(t: torch.Tensor, tp: int, rank: int, dim: int) -> torch.Tensor:
    if tp == 1:
        return t.contiguous()
    if t.shape[dim] % tp:
        raise ValueError(f"cannot split dim {dim} of size {t.shape[dim]} into {tp} parts")
    return torch.chunk(t, tp, dim=dim)[rank].contiguous()


def _dup_kv(w: torch.Tensor, kv_heads: int, tp: int) -> torch.Tensor:
    """TensorRT-LLM's dup_kv_weight: repeat each kv head tp // kv_heads times (num_kv_heads < tp)."""
    rep = tp // kv_heads
    head = w.shape[0] // kv_heads
    return w.reshape(kv_heads, head, -1).repeat_interleave(rep, dim=0).reshape(kv_heads * rep * head, -1)


def trtllm_config(hf: dict, tp: int, dtype: str) -> dict:
    heads = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or heads
    cfg = {
        "architecture": "LlamaForCausalLM",
        "dtype": dtype,
        "logits_dtype": "float32",
        "num_hidden_layers": hf["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_size": hf["hidden_size"],
        "intermediate_size": hf["intermediate_size"],
        "head_size": hf.get("head_dim") or hf["hidden_size"] // heads,
        "vocab_size": hf["vocab_size"],
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": hf["max_position_embeddings"],
        "hidden_act": hf.get("hidden_act", "silu"),
        "norm_epsilon": hf.get("rms_norm_eps", 1e-5),
        "rotary_base": float(hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        "rotary_scaling": hf.get("rope_scaling"),
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    }
    if "crisp" in hf:
        cfg["crisp"] = hf["crisp"]
    return cfg


def convert(src, dst, tp: int = 1, dtype: str | None = None) -> Path:
    """Write dst/config.json + dst/rank{N}.safetensors for N < tp from the HF checkpoint directory src."""
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    hf = json.loads((src / "config.json").read_text())
    arch = (hf.get("architectures") or ["?"])[0]
    if arch not in ("LlamaForCausalLM", "MistralForCausalLM"):
        raise ValueError(f"TensorRT-LLM conversion supports the Llama family only, not {arch}")
    heads, kv, layers = hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"], \
        hf["num_hidden_layers"]
    if tp < 1 or heads % tp:
        raise ValueError(f"tp={tp}: num_attention_heads={heads} must be divisible by tp")
    if kv % tp and tp % kv:
        raise ValueError(f"tp={tp}: num_key_value_heads={kv} must divide or be divisible by tp")
    state = _load_hf(src)
    tdtype = _DT[dtype] if dtype else next(iter(state.values())).dtype
    tdtype = tdtype if tdtype in _DT_NAME else torch.float32
    cfg = trtllm_config(hf, tp, _DT_NAME[tdtype])
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    embed = state["embed_tokens.weight"].to(tdtype)
    lm_head = state.get("lm_head.weight", embed).to(tdtype).clone()  # tied: its own storage
    vocab = lm_head.shape[0]
    padded = -(-vocab // tp) * tp
    if padded != vocab:
        lm_head = torch.cat([lm_head, lm_head.new_zeros(padded - vocab, lm_head.shape[1])])
    for rank in range(tp):
        w = {"transformer.vocab_embedding.weight": embed.contiguous(),
             "transformer.ln_f.weight": state["norm.weight"].to(tdtype).contiguous(),
             "lm_head.weight": _split(lm_head, tp, rank, 0)}
        for i in range(layers):
            p, t = f"layers.{i}.", f"transformer.layers.{i}."
            g = lambda name: state[p + name].to(tdtype)  # noqa: E731
            q, k, v = g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"), g("self_attn.v_proj.weight")
            if kv < tp:
                k, v = _dup_kv(k, kv, tp), _dup_kv(v, kv, tp)
            w[t + "attention.qkv.weight"] = torch.cat([_split(q, tp, rank, 0), _split(k, tp, rank, 0),
                                                       _split(v, tp, rank, 0)]).contiguous()
            w[t + "attention.dense.weight"] = _split(g("self_attn.o_proj.weight"), tp, rank, 1)
            w[t + "input_layernorm.weight"] = g("input_layernorm.weight").contiguous()
            w[t + "post_layernorm.weight"] = g("post_attention_layernorm.weight").contiguous()
            w[t + "mlp.fc.weight"] = _split(g("mlp.gate_proj.weight"), tp, rank, 0)
            w[t + "mlp.gate.weight"] = _split(g("mlp.up_proj.weight"), tp, rank, 0)
            w[t + "mlp.proj.weight"] = _split(g("mlp.down_proj.weight"), tp, rank, 1)
        save_file(w, str(dst / f"rank{rank}.safetensors"), metadata={"format": "pt"})
    return dst
