"""The op's host cost: CRISP called eagerly vs replayed from a CUDA graph (crisp_trt.graphs), against cuDNN in the
same run, on random bf16 inputs (the plan's work depends on the inputs; the host's does not).

    python3 scripts/probes/graphed_op.py [--shapes qwen,llama3_8b] [--lengths 4k,8k,16k,32k] [--repeats 20]

Per (shape, n): cuDNN ms, CRISP eager ms and graphed ms (a synchronised call timed with CUDA events: host launch
gaps count where the host is slower than the kernels), the eager call's host ms (perf_counter until it returns,
no sync) and the replay's, and the ratios to cuDNN. Outputs checked equal (eager vs graph). Writes
$OUT/graphed_op.json; prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from crisp_trt import CrispConfig, crisp_prefill_attention
from crisp_trt.bench.op import SHAPES, dense_fn, gpu_name, median_ms
from crisp_trt.graphs import GraphedPrefill
from crisp_trt.lengths import parse_length


def host_ms(fn, repeats: int) -> float:
    """Median time for fn() to return (the host's share: launches are asynchronous), synchronised between calls."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="qwen,llama3_8b")
    p.add_argument("--lengths", default="4k,8k,16k,32k")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--config", default=None, help="CrispConfig JSON (default: the default config)")
    args = p.parse_args()
    cfg = CrispConfig.from_dict(json.loads(args.config)) if args.config else CrispConfig()
    rows = []
    for shape in args.shapes.split(","):
        heads, kv, d = SHAPES[shape]
        for n in (parse_length(x) for x in args.lengths.split(",")):
            q, k, v = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for h in (heads, kv, kv))
            graphed = GraphedPrefill()
            eager = lambda: crisp_prefill_attention(q, k, v, config=cfg)  # noqa: E731
            replay = lambda: graphed(q, k, v, config=cfg)  # noqa: E731
            same = bool(torch.equal(eager(), replay()))
            cudnn = median_ms(dense_fn("dense_cudnn", q[0], k[0], v[0]), args.repeats, "cuda")
            row = dict(shape=shape, n=n, cudnn_ms=cudnn, eager_ms=median_ms(eager, args.repeats, "cuda"),
                       graph_ms=median_ms(replay, args.repeats, "cuda"), eager_host_ms=host_ms(eager, args.repeats),
                       graph_host_ms=host_ms(replay, args.repeats), equal=same)
            row.update(eager_x=cudnn / row["eager_ms"], graph_x=cudnn / row["graph_ms"])
            rows.append(row)
    out = Path(os.environ.get("OUT", "/tmp")) / "graphed_op.json"
    out.write_text(json.dumps({"gpu": gpu_name("cuda"), "config": cfg.to_dict(), "rows": rows}, indent=1))
    print(f"{'shape':<10} {'n':>7} {'cuDNN':>7} {'eager':>7} {'graph':>7} {'host e':>7} {'host g':>7} "
          f"{'eager x':>8} {'graph x':>8} equal")
    for r in rows:
        print(f"{r['shape']:<10} {r['n']:>7} {r['cudnn_ms']:>7.3f} {r['eager_ms']:>7.3f} {r['graph_ms']:>7.3f} "
              f"{r['eager_host_ms']:>7.3f} {r['graph_host_ms']:>7.3f} {r['eager_x']:>8.2f} {r['graph_x']:>8.2f} "
              f"{r['equal']}")
    if not all(r["equal"] for r in rows):
        raise SystemExit("graphed_op: a replay differs from the eager call")


if __name__ == "__main__":
    main()
