"""Triton model repositories for crisp-build artifacts.

torch artifact → a Python-backend model `crisp` (text in, text out, TTFT reported):
    inputs  PROMPT TYPE_STRING [1], MAX_NEW_TOKENS TYPE_INT32 [1] (optional, default 32)
    outputs COMPLETION TYPE_STRING [1], TTFT_MS TYPE_FP32 [1]
engines → the tensorrtllm-backend layout (ensemble / preprocessing / tensorrt_llm / postprocessing)
with filled config.pbtxt files (unverified: that backend exists only in NVIDIA's containers).
"""
from __future__ import annotations

import json
from pathlib import Path

MODEL_PY = r'''"""Triton Python backend: a crisp-build torch artifact (written by crisp_trt.builder.triton_repo)."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        from crisp_trt import runtime

        params = json.loads(args["model_config"]).get("parameters", {})
        self.artifact = params["artifact_dir"]["string_value"]
        self.attention = params.get("attention", {}).get("string_value", "crisp")
        self.model = runtime.load(self.artifact, attention=self.attention)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                prompt_t = pb_utils.get_input_tensor_by_name(request, "PROMPT")
                if prompt_t is None:
                    raise ValueError("missing input PROMPT")
                raw = prompt_t.as_numpy().reshape(-1)
                if raw.size != 1:
                    raise ValueError(f"PROMPT: expected one string, got {raw.size}")
                prompt = raw[0].decode("utf-8") if isinstance(raw[0], bytes) else str(raw[0])
                if not prompt:
                    raise ValueError("PROMPT is empty")
                max_new = 32
                mt = pb_utils.get_input_tensor_by_name(request, "MAX_NEW_TOKENS")
                if mt is not None:
                    max_new = int(mt.as_numpy().reshape(-1)[0])
                if not 1 <= max_new <= 4096:
                    raise ValueError(f"MAX_NEW_TOKENS={max_new}: expected 1..4096")
                gen = self.model.generate(prompt, max_new_tokens=max_new)
                out = [pb_utils.Tensor("COMPLETION", np.array([gen.text.encode("utf-8")], dtype=np.object_)),
                       pb_utils.Tensor("TTFT_MS", np.array([gen.ttft_s * 1000.0], dtype=np.float32))]
                responses.append(pb_utils.InferenceResponse(output_tensors=out))
            except Exception as exc:  # an error response, never a dead model
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))))
        return responses
'''

CONFIG_PBTXT = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "MAX_NEW_TOKENS" data_type: TYPE_INT32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "COMPLETION" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "TTFT_MS" data_type: TYPE_FP32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: {kind} }} ]
parameters: {{ key: "artifact_dir" value: {{ string_value: "{artifact}" }} }}
parameters: {{ key: "attention" value: {{ string_value: "{attention}" }} }}
'''


def write_python_model(artifact_dir, repo_dir, name: str = "crisp", attention: str = "crisp", gpu: bool = False) -> Path:
    model_dir = Path(repo_dir) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    (model_dir / "config.pbtxt").write_text(CONFIG_PBTXT.format(
        name=name, artifact=str(Path(artifact_dir).resolve()), attention=attention,
        kind="KIND_GPU" if gpu else "KIND_CPU"))
    return model_dir


def _trtllm_pbtxt(name, backend, inputs, outputs, params, extra=""):
    io = lambda kind, items: f"{kind} [\n" + ",\n".join(  # noqa: E731
        f'  {{ name: "{n}" data_type: {t} dims: [ {d} ]{" optional: true" if o else ""} }}' for n, t, d, o in items) + "\n]\n"
    ps = "".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items())
    return f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 8\n' + io("input", inputs) + io("output", outputs) + extra + ps


def write_tensorrtllm_repo(artifact_dir, repo_dir) -> Path:
    """tensorrtllm-backend layout for DIR/engines (ensemble → preprocessing → tensorrt_llm → postprocessing)."""
    art = Path(artifact_dir).resolve()
    repo = Path(repo_dir)
    crisp = json.loads((art / "config.json").read_text()).get("crisp", {})
    max_seq = crisp.get("max_seq", 8192)
    models = {
        "preprocessing": _trtllm_pbtxt("preprocessing", "python",
                                       [("QUERY", "TYPE_STRING", "1", False), ("REQUEST_OUTPUT_LEN", "TYPE_INT32", "1", False)],
                                       [("INPUT_ID", "TYPE_INT32", "-1", False), ("REQUEST_INPUT_LEN", "TYPE_INT32", "1", False),
                                        ("REQUEST_OUTPUT_LEN", "TYPE_INT32", "1", False)],
                                       {"tokenizer_dir": str(art)}),
        "tensorrt_llm": _trtllm_pbtxt("tensorrt_llm", "tensorrtllm",
                                      [("input_ids", "TYPE_INT32", "-1", False), ("input_lengths", "TYPE_INT32", "1", False),
                                       ("request_output_len", "TYPE_INT32", "1", False)],
                                      [("output_ids", "TYPE_INT32", "-1, -1", False), ("sequence_length", "TYPE_INT32", "-1", False)],
                                      {"gpt_model_type": "inflight_fused_batching", "gpt_model_path": str(art / "engines"),
                                       "max_tokens_in_paged_kv_cache": str(max_seq), "batch_scheduler_policy": "guaranteed_no_evict",
                                       "enable_chunked_context": "false"},
                                      'model_transaction_policy { decoupled: false }\n'),
        "postprocessing": _trtllm_pbtxt("postprocessing", "python",
                                        [("TOKENS_BATCH", "TYPE_INT32", "-1, -1", False), ("SEQUENCE_LENGTH", "TYPE_INT32", "-1", False)],
                                        [("OUTPUT", "TYPE_STRING", "-1", False)], {"tokenizer_dir": str(art)}),
    }
    for name, text in models.items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(text)
    ens = (_trtllm_pbtxt("ensemble", "", [("text_input", "TYPE_STRING", "1", False), ("max_tokens", "TYPE_INT32", "1", False)],
                         [("text_output", "TYPE_STRING", "-1", False)], {}).replace('backend: ""\n', 'platform: "ensemble"\n')
           + 'ensemble_scheduling {\n'
           '  step [\n'
           '    { model_name: "preprocessing" model_version: -1 input_map { key: "QUERY" value: "text_input" } '
           'input_map { key: "REQUEST_OUTPUT_LEN" value: "max_tokens" } output_map { key: "INPUT_ID" value: "_ids" } '
           'output_map { key: "REQUEST_INPUT_LEN" value: "_len" } output_map { key: "REQUEST_OUTPUT_LEN" value: "_out_len" } },\n'
           '    { model_name: "tensorrt_llm" model_version: -1 input_map { key: "input_ids" value: "_ids" } '
           'input_map { key: "input_lengths" value: "_len" } input_map { key: "request_output_len" value: "_out_len" } '
           'output_map { key: "output_ids" value: "_out_ids" } output_map { key: "sequence_length" value: "_seq_len" } },\n'
           '    { model_name: "postprocessing" model_version: -1 input_map { key: "TOKENS_BATCH" value: "_out_ids" } '
           'input_map { key: "SEQUENCE_LENGTH" value: "_seq_len" } output_map { key: "OUTPUT" value: "text_output" } }\n'
           '  ]\n}\n')
    (repo / "ensemble" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "ensemble" / "config.pbtxt").write_text(ens)
    return repo
