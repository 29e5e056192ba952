"""HF Llama-family / Qwen2 safetensors → TensorRT-LLM (1.2.x) checkpoint: config.json + rank{N}.safetensors.

Tensor names follow tensorrt_llm/models/{llama,qwen}/convert.py (1.2); the TP sharding is crisp_trt.tp's
rule (the one crisp-run --tp uses too):
  transformer.vocab_embedding.weight       embed_tokens (replicated; no parallel embedding)
  transformer.layers.{i}.input_layernorm.weight
  transformer.layers.{i}.attention.qkv.{weight,bias}   cat(q_r, k_r, v_r), each split by heads (dim 0);
                                           kv heads duplicated when num_kv_heads < tp (dup_kv_weight/_bias)
  transformer.layers.{i}.attention.dense.weight   o_proj split on dim 1 (row parallel; a bias stays whole)
  transformer.layers.{i}.post_layernorm.weight
  transformer.layers.{i}.mlp.fc.weight     gate_proj split on dim 0
  transformer.layers.{i}.mlp.gate.weight   up_proj   split on dim 0   (HF up → TRT "gate")
  transformer.layers.{i}.mlp.proj.weight   down_proj split on dim 1
  transformer.ln_f.weight
  lm_head.weight                           split on dim 0 (vocab padded to a multiple of tp)
Biases travel with their weights (Qwen2: q/k/v; Llama attention_bias / mlp_bias: all of theirs), and the
config says so (attn_bias, mlp_bias). Qwen2 checkpoints get TensorRT-LLM's Qwen config (architecture
Qwen2ForCausalLM, qwen_type qwen2). The "crisp" section of the artifact's config.json is carried into the
checkpoint config for the engine step.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from crisp_trt import tp as tensor_parallel

from .checkpoint import SUPPORTED_ARCHITECTURES

QWEN2 = "Qwen2ForCausalLM"
# HF module (under layers.{i}.) → TensorRT-LLM module (under transformer.layers.{i}.), q/k/v aside
_LAYER_NAMES = {"self_attn.o_proj": "attention.dense", "input_layernorm": "input_layernorm",
                "post_attention_layernorm": "post_layernorm", "mlp.gate_proj": "mlp.fc", "mlp.up_proj": "mlp.gate",
                "mlp.down_proj": "mlp.proj"}
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
       "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_DT_NAME = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _load_hf(src: Path) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return {k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}


def trtllm_config(hf: dict, tp: int, dtype: str, attn_bias: bool = False, mlp_bias: bool = False) -> dict:
    """TensorRT-LLM's checkpoint config.json for the HF config `hf` split tp ways."""
    heads, kv, _ = tensor_parallel.model_shape(hf)
    qwen2 = (hf.get("architectures") or [""])[0] == QWEN2
    cfg = {
        "architecture": QWEN2 if qwen2 else "LlamaForCausalLM",
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
        "attn_bias": attn_bias,
        "mlp_bias": mlp_bias,
    }
    if qwen2:
        cfg.update(qwen_type="qwen2", seq_length=hf["max_position_embeddings"], use_logn_attn=False)
    if "crisp" in hf:
        cfg["crisp"] = hf["crisp"]
    return cfg


def convert(src, dst, tp: int = 1, dtype: str | None = None) -> Path:
    """Write dst/config.json + dst/rank{N}.safetensors for N < tp from the HF checkpoint directory src."""
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    hf = json.loads((src / "config.json").read_text())
    arch = (hf.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {arch}: expected one of {', '.join(sorted(SUPPORTED_ARCHITECTURES))} "
                         "(TensorRT-LLM conversion supports the Llama family and Qwen2)")
    _, kv, _ = shape = tensor_parallel.model_shape(hf)
    tensor_parallel.check(tp, *shape, arg="tp")
    state = _load_hf(src)
    tdtype = _DT[dtype] if dtype else next(iter(state.values())).dtype
    tdtype = tdtype if tdtype in _DT_NAME else torch.float32
    state = {name: t.to(tdtype) for name, t in state.items()}  # once, not once per rank
    for i in range(hf["num_hidden_layers"]):
        for kind in ("weight", "bias"):
            present = [f"layers.{i}.self_attn.{x}_proj.{kind}" in state for x in "qkv"]
            if any(present) and not all(present):
                raise ValueError(f"layer {i}: q/k/v {kind}es must all be present or all absent, found {present}")
    has = lambda module: any(k.endswith(f".{module}.bias") for k in state)  # noqa: E731
    cfg = trtllm_config(hf, tp, _DT_NAME[tdtype], attn_bias=has("self_attn.q_proj"), mlp_bias=has("mlp.gate_proj"))
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    embed = state["embed_tokens.weight"]
    lm_head = state.get("lm_head.weight", embed).clone()  # tied: its own storage
    vocab = lm_head.shape[0]
    padded = -(-vocab // tp) * tp
    if padded != vocab:
        lm_head = torch.cat([lm_head, lm_head.new_zeros(padded - vocab, lm_head.shape[1])])
    for rank in range(tp):
        part = lambda name: tensor_parallel.shard(name, state[name], tp, rank, kv).contiguous()  # noqa: E731
        w = {"transformer.vocab_embedding.weight": embed.contiguous(),
             "transformer.ln_f.weight": state["norm.weight"].contiguous(),
             "lm_head.weight": tensor_parallel.split(lm_head, tp, rank, 0)}
        for i in range(hf["num_hidden_layers"]):
            p, t = f"layers.{i}.", f"transformer.layers.{i}."
            for kind in ("weight", "bias"):
                qkv = [f"{p}self_attn.{x}_proj.{kind}" for x in "qkv"]
                if qkv[0] in state:
                    w[f"{t}attention.qkv.{kind}"] = torch.cat([part(name) for name in qkv])
                for hf_name, trt_name in _LAYER_NAMES.items():
                    if f"{p}{hf_name}.{kind}" in state:
                        w[f"{t}{trt_name}.{kind}"] = part(f"{p}{hf_name}.{kind}")
        save_file(w, str(dst / f"rank{rank}.safetensors"), metadata={"format": "pt"})
    return dst
