"""Run a crisp-build torch artifact: `load(DIR)` → a model that generates with CRISP prefill.

HF transformers underneath, with crisp_trt.hf's "crisp" attention: prefill (query length == key length,
no padding) goes through crisp_trt.crisp_prefill_attention with the artifact's per-layer calibrated
config (hf.set_crisp_config with one config per layer); decode steps use SDPA.
`crisp-run DIR --prompt ...` prints the completion and the TTFT; `--tp N` splits the heads (and the MLP)
across N processes it starts itself (crisp_trt.tp: TensorRT-LLM's sharding rule, NCCL on GPUs, gloo on the
CPU; generate_tp_modes loads once per rank for several attention modes). An artifact carries a format version
(FORMAT, written by builder/artifact.py); `read_crisp` refuses a missing or unknown one with the command that
rebuilds it.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import tp as tensor_parallel
from .config import CrispConfig

FORMAT = 1  # the artifact format this runtime reads; builder/artifact.py writes it into config.json["crisp"]
MODES = {"crisp": "crisp", "crisp_graphs": "crisp", "dense": "sdpa", "eager": "eager"}  # → attn_implementation


@dataclass
class Generation:
    """A greedy completion: text, token ids, TTFT and total seconds, prompt length, and the prefill's
    last-position logits (float32 [vocab], on the CPU) for comparing runs."""

    text: str
    token_ids: list
    ttft_s: float
    total_s: float
    prompt_tokens: int
    logits: torch.Tensor | None = None


class CrispModel:
    """An HF causal LM with CRISP prefill (attention="crisp", or "crisp_graphs": replayed from a CUDA graph per
    shape, crisp_trt.graphs), dense SDPA (attention="dense") or dense through HF's eager kernels
    (attention="eager": the same maths as SDPA with other rounding, the benches' control)."""

    def __init__(self, model, tokenizer, crisp: dict, attention: str = "crisp"):
        from .hf import set_crisp_config

        self.model, self.tokenizer, self.crisp = model, tokenizer, crisp
        self.layer_configs = layer_configs(crisp)
        set_crisp_config(model, self.layer_configs)
        self.set_attention(attention)

    def set_attention(self, attention: str) -> None:
        from .hf import set_cuda_graphs
        from .models import set_attn_implementation

        implementation = _implementation(attention, self.device)
        set_attn_implementation(self.model, implementation)
        set_cuda_graphs(self.model, attention == "crisp_graphs")
        self.attention = attention

    @property
    def device(self):
        return next(self.model.parameters()).device

    def encode(self, prompt: str, chat: bool = False) -> torch.Tensor:
        if chat and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                     return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        else:
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        return ids.to(self.device)

    def generate_ids(self, input_ids: torch.Tensor, max_new_tokens: int = 32,
                     keep_logits: bool = False) -> tuple[list, float, float] | tuple[list, float, float, torch.Tensor]:
        """Greedy decoding; returns (new token ids, TTFT seconds, total seconds), plus the prefill's
        last-position logits with keep_logits. Under tensor parallelism every rank calls it with the same ids;
        the ranks start together and take rank 0's token at each step."""
        sync = torch.cuda.synchronize if input_ids.is_cuda else (lambda: None)
        distributed = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        if distributed:
            torch.distributed.barrier()
        sync()
        t0 = time.perf_counter()
        steps = greedy_steps(self.model, input_ids, max_new_tokens, self.tokenizer.eos_token_id,
                             pick=_rank0_argmax if distributed else None)
        first, logits = next(steps)  # the prefill and its token
        new = [first]
        sync()
        ttft = time.perf_counter() - t0
        new += [token for token, _ in steps]
        sync()
        timing = (new, ttft, time.perf_counter() - t0)
        return (*timing, logits.cpu()) if keep_logits else timing

    def generate(self, prompt: str | torch.Tensor, max_new_tokens: int = 32, chat: bool = False) -> Generation:
        """Greedy completion of a prompt (text, or token ids [1, n])."""
        ids = prompt.to(self.device) if isinstance(prompt, torch.Tensor) else self.encode(prompt, chat)
        new, ttft, total, logits = self.generate_ids(ids, max_new_tokens, keep_logits=True)
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Generation(text, new, ttft, total, int(ids.shape[1]), logits)


def _implementation(attention: str, device=None) -> str:
    """transformers' attention implementation behind a CrispModel attention mode; ValueError naming `attention`
    (also for crisp_graphs on a `device` that is not CUDA)."""
    implementation = MODES.get(attention)
    if implementation is None:
        raise ValueError(f"attention={attention!r}: expected one of {', '.join(map(repr, MODES))}")
    if attention == "crisp_graphs" and device is not None and torch.device(device).type != "cuda":
        raise ValueError(f"attention='crisp_graphs': needs a CUDA model (device={str(device)!r}); use 'crisp'")
    return implementation


def _rank0_argmax(logits: torch.Tensor) -> int:
    """The greedy token as rank 0 picks it, on every rank (the ranks' logits agree; this makes sure that an
    exact tie can never send the ranks down different paths)."""
    token = logits.argmax().reshape(1)  # on the rank's device: the CPU under gloo, its GPU under NCCL
    torch.distributed.broadcast(token, src=0)
    return int(token)


@functools.cache
def _forward_arguments(model_class) -> frozenset:
    return frozenset(inspect.signature(model_class.forward).parameters)


@torch.no_grad()  # torch's decorator re-enters no_grad around each resume, so the caller keeps its mode
def greedy_steps(model, ids: torch.Tensor, max_new_tokens: int, eos: int | None = None, pick=None):
    """Greedy decoding of one sequence with an HF causal LM, one step at a time: yields (token, that step's
    logits as float [vocab]); stops after eos or max_new_tokens. The KV cache travels under the forward's
    own argument name (`cache` in transformers 5, `past_key_values` before); the prefill computes the last
    position's logits only (`logits_to_keep`: all of them would be n × vocab floats, 80 GB at 128k for
    Qwen2.5). pick(logits) → token replaces the argmax (tensor parallelism: rank 0's)."""
    arguments = _forward_arguments(type(model))
    cache = "cache" if "cache" in arguments else "past_key_values"
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in arguments else {}
    out = model(input_ids=ids, use_cache=True, **last_only)
    for step in range(max_new_tokens):
        logits = out.logits[0, -1].float()
        token = pick(logits) if pick else int(logits.argmax())
        yield token, logits
        if token == eos or step + 1 == max_new_tokens:
            return
        out = model(input_ids=torch.tensor([[token]], device=ids.device), use_cache=True,
                    **{cache: getattr(out, cache)})


def read_crisp(artifact_dir) -> dict:
    """The "crisp" section of an artifact's config.json (builder/artifact.py writes it), after checking that
    its format version is the one this runtime reads."""
    return _crisp_section(json.loads((Path(artifact_dir) / "config.json").read_text()), artifact_dir)


def _crisp_section(cfg: dict, artifact_dir) -> dict:
    """read_crisp on a config.json already read."""
    if "crisp" not in cfg:
        raise ValueError(f"{artifact_dir}/config.json has no 'crisp' section: not a crisp-build artifact")
    crisp = cfg["crisp"]
    version = crisp.get("format")
    if version != FORMAT:
        found = "has no format version" if version is None else f"has format {version!r}"
        raise ValueError(f"{artifact_dir}/config.json {found}; this crisp-run reads format {FORMAT}. Rebuild the "
                         f"artifact with this version: crisp-build --model CHECKPOINT --output {artifact_dir}")
    return crisp


def layer_configs(crisp: dict) -> list[CrispConfig]:
    """One CrispConfig per layer: the base config with that layer's calibrated kappa and tau."""
    base = CrispConfig.from_dict(crisp["config"])
    return [base.replace(kappa=float(l["kappa"]), tau=float(l["tau"])) for l in crisp["layers"]]


def _checked(artifact_dir, tp) -> tuple[Path, dict]:
    """(path, crisp section) of an artifact after the checks that need no weights, config.json read once: it
    exists, its format is this runtime's (read_crisp), its model splits tp ways (ValueError naming --tp)."""
    path = Path(artifact_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json: not a crisp-build artifact (run crisp-build --output {path})")
    cfg = json.loads((path / "config.json").read_text())
    crisp = _crisp_section(cfg, path)
    tensor_parallel.check(tp, *tensor_parallel.model_shape(cfg))
    return path, crisp


def load(artifact_dir, attention: str = "crisp", device: str | None = None, dtype=None, tp: int = 1,
         rank: int = 0) -> CrispModel:
    """Load a crisp-build torch artifact directory (a half-precision model keeps float32 logits:
    models.Float32Logits). tp > 1: rank `rank`'s shard (crisp_trt.tp.shard_model; torch.distributed must be
    initialised, as generate_tp does), sharded on the CPU so that only the shard reaches the device."""
    path, crisp = _checked(artifact_dir, tp)
    return _load_checked(path, crisp, attention, device, dtype, tp, rank)


def _load_checked(path: Path, crisp: dict, attention: str, device, dtype, tp: int, rank: int) -> CrispModel:
    """load after _checked: the ranks of generate_tp_modes start here (the artifact is checked once, before)."""
    from .models import load_model

    if not (isinstance(rank, int) and 0 <= rank < tp):
        raise ValueError(f"rank={rank!r}: expected an int in [0, tp={tp})")
    if tp > 1 and not (torch.distributed.is_initialized() and torch.distributed.get_world_size() == tp):
        raise ValueError(f"tp={tp}: expected a torch.distributed process group of {tp} ranks; generate_tp and "
                         "crisp-run --tp start one")
    model, tok = load_model(path, "sdpa", dtype=dtype, device=(device or None) if tp == 1 else None)
    if tp > 1:
        model = tensor_parallel.shard_model(model, tp, rank).to(device or "cpu")
    return CrispModel(model, tok, crisp, attention)


def _generate_rank(rank: int, tp: int, device, path: Path, crisp: dict, prompts,
                   options: dict) -> dict[str, list[Generation]]:
    """One rank of generate_tp_modes: load the shard once, then every attention mode × prompt; TTFT the median
    over the repeats."""
    attentions = options["attentions"]
    model = _load_checked(path, crisp, attentions[0], str(device), options["dtype"], tp, rank)
    results = {}
    for attention in attentions:
        model.set_attention(attention)
        results[attention] = []
        for prompt in prompts:
            runs = [model.generate(prompt, options["max_new_tokens"], options["chat"])
                    for _ in range(options["warmup"] + options["repeats"])][options["warmup"]:]
            best = runs[-1]
            best.ttft_s = statistics.median(r.ttft_s for r in runs)
            results[attention].append(best)
    return results


def generate_tp_modes(artifact_dir, prompts: list, attentions, tp: int = 1,
                      max_new_tokens: int = 32, device: str | None = None, dtype=None, chat: bool = False,
                      warmup: int = 0, repeats: int = 1) -> dict[str, list[Generation]]:
    """generate_tp for each attention mode in `attentions`, the model loaded once per rank: {mode: rank 0's
    generations}. The artifact is checked here, once; the ranks get what they need."""
    attentions = tuple(attentions)
    if not attentions:
        raise ValueError(f"attentions=(): expected at least one of {', '.join(map(repr, MODES))}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    for attention in attentions:
        _implementation(attention, device)  # a bad mode fails here, before any process starts
    path, crisp = _checked(artifact_dir, tp)
    options = dict(attentions=attentions, dtype=dtype, max_new_tokens=max_new_tokens, chat=chat, warmup=warmup,
                   repeats=repeats)
    if tp == 1:
        return _generate_rank(0, 1, device, path, crisp, prompts, options)
    return tensor_parallel.spawn(_generate_rank, tp, torch.device(device).type, path, crisp, prompts, options)


def generate_tp(artifact_dir, prompts: list, tp: int = 1, max_new_tokens: int = 32, attention: str = "crisp",
                device: str | None = None, dtype=None, chat: bool = False, warmup: int = 0,
                repeats: int = 1) -> list[Generation]:
    """Greedy completions of `prompts` (text, or token ids [1, n]) with the artifact split tp ways: tp
    processes started here (one GPU each on CUDA, gloo on the CPU), rank 0's results returned. tp=1 runs in
    this process. TTFT: the median over `repeats` runs after `warmup` runs of each prompt."""
    return generate_tp_modes(artifact_dir, prompts, (attention,), tp, max_new_tokens, device, dtype, chat, warmup,
                             repeats)[attention]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="crisp-run", description="Generate with a crisp-build artifact (CRISP prefill).")
    p.add_argument("artifact", metavar="DIR", help="directory written by crisp-build --backend torch")
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads stdin)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--attention", choices=("crisp", "crisp_graphs", "dense"), default="crisp",
                   help="prefill attention: crisp; crisp_graphs (the same, captured in a CUDA graph once per prompt "
                        "length and layer config and replayed: no per-layer host work; CUDA only; the first prompt "
                        "of a length pays the captures); dense (SDPA)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism: split the attention heads and the MLP across N processes that "
                        "crisp-run starts itself (one GPU each on CUDA, gloo on the CPU)")
    args = p.parse_args(argv)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        gen = generate_tp(args.artifact, [prompt], args.tp, args.max_new_tokens, args.attention, device,
                          chat=args.chat)[0]
    except (FileNotFoundError, ValueError) as exc:
        print(f"crisp-run: error: {exc}", file=sys.stderr)
        return 2
    print(gen.text)
    print(f"TTFT {gen.ttft_s * 1000:.1f} ms ({gen.prompt_tokens} prompt tokens, {args.attention} prefill"
          + (f", tp {args.tp}" if args.tp > 1 else "") + f"), {len(gen.token_ids)} tokens in {gen.total_s:.2f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
