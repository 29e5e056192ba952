"""The Triton model repository of a crisp-build artifact (crisp-build --triton-repo).

torch artifact → a Python-backend model `crisp` (text in, text out, TTFT reported):
    inputs  PROMPT TYPE_STRING [1], MAX_NEW_TOKENS TYPE_INT32 [1] (optional, default 32)
    outputs COMPLETION TYPE_STRING [1], TTFT_MS TYPE_FP32 [1]
"""
from __future__ import annotations

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
    """repo_dir/name: config.pbtxt and 1/model.py serving the artifact (by absolute path) with `attention`."""
    model_dir = Path(repo_dir) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    (model_dir / "config.pbtxt").write_text(CONFIG_PBTXT.format(
        name=name, artifact=str(Path(artifact_dir).resolve()), attention=attention,
        kind="KIND_GPU" if gpu else "KIND_CPU"))
    return model_dir

