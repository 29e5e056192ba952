"""A real tritonserver (PyPI nvidia-pytriton) serving the crisp-build Python-backend model on loopback."""
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _pytriton_server():
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None:
        pytest.skip("nvidia-pytriton not installed (pip install 'crisp-trt[triton-server]')")
    root = Path(spec.submodule_search_locations[0]) / "tritonserver"
    binary = root / "bin" / "tritonserver"
    stub = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub"
    if not binary.exists() or not stub.exists():
        pytest.skip(f"no tritonserver / python stub for this Python in {root}")
    libs = [str(root.parent.parent / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(libs + [os.environ.get("LD_LIBRARY_PATH", "")]))
    ldd = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, env=env).stdout
    missing = [line.split()[0] for line in ldd.splitlines() if "not found" in line]
    if missing:
        pytest.skip(f"the python backend stub needs {missing} (a shared libpython{sys.version_info.major}."
                    f"{sys.version_info.minor}: apt-get install libpython{sys.version_info.major}.{sys.version_info.minor})")
    return root, binary, stub


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("tritonclient.http")
    pytest.importorskip("transformers")
    from crisp_trt.builder import cli
    from crisp_trt.builder.triton_repo import write_python_model

    root, binary, stub = _pytriton_server()
    try:
        cli.default_model()
    except cli.BuildError as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("triton")
    art = tmp / "art"
    assert cli.main(["--output", str(art), "--backend", "torch", "--calibrate", "128", "--no-progress"]) == 0
    repo = tmp / "repo"
    write_python_model(art, repo)
    backends = tmp / "backends"
    shutil.copytree(root / "backends", backends)
    shutil.copy(stub, backends / "python" / "triton_python_backend_stub")
    env = dict(os.environ)
    repo_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], repo_root,
                                         env.get("PYTHONPATH", "")])
    libs = [str(root.parent.parent / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [env.get("LD_LIBRARY_PATH", "")])
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([str(binary), f"--model-repository={repo}", f"--backend-directory={backends}",
                             f"--http-port={http}", "--http-address=127.0.0.1", f"--grpc-port={grpc}",
                             "--grpc-address=127.0.0.1", f"--metrics-port={metrics}", "--allow-metrics=false",
                             "--allow-grpc=false", "--log-verbose=0"], stdout=log, stderr=subprocess.STDOUT, env=env)
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=300)
    deadline = time.time() + 240
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail("tritonserver exited:\n" + (tmp / "server.log").read_text()[-4000:])
            try:
                if client.is_model_ready("crisp"):
                    break
            except Exception:
                pass
            if time.time() > deadline:
                pytest.fail("tritonserver not ready in 240 s:\n" + (tmp / "server.log").read_text()[-4000:])
            time.sleep(1)
        yield client, art
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _infer(client, prompt, max_new=8):
    import tritonclient.http as httpclient

    p = httpclient.InferInput("PROMPT", [1], "BYTES")
    p.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    m = httpclient.InferInput("MAX_NEW_TOKENS", [1], "INT32")
    m.set_data_from_numpy(np.array([max_new], dtype=np.int32))
    res = client.infer("crisp", [p, m])
    return res.as_numpy("COMPLETION")[0].decode(), float(res.as_numpy("TTFT_MS")[0])


def test_completion_matches_in_process_and_survives_bad_request(server):
    from tritonclient.utils import InferenceServerException

    from crisp_trt import runtime

    client, art = server
    prompt = "The capital of France is"
    text, ttft = _infer(client, prompt)
    local = runtime.load(art).generate(prompt, max_new_tokens=8)
    assert text == local.text and ttft > 0
    import tritonclient.http as httpclient

    bad = httpclient.InferInput("MAX_NEW_TOKENS", [1], "INT32")  # PROMPT missing
    bad.set_data_from_numpy(np.array([0], dtype=np.int32))
    with pytest.raises(InferenceServerException):
        client.infer("crisp", [bad])
    with pytest.raises(InferenceServerException):
        _infer(client, prompt, max_new=0)  # out of range
    assert client.is_server_live() and client.is_model_ready("crisp")
    assert _infer(client, prompt)[0] == text  # still serving
