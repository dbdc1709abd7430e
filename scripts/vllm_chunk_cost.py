"""The engine's own cost of ending prefill steps every N tokens, with no
connector: what UCM's chunk stops cost a lone request, measured without UCM.

Runs the serve benchmark's model (`scripts/serve_bench.py`) in fresh vLLM
engines on this CPU, one process per engine: vLLM's default step budget,
and `max_num_batched_tokens=N` (default 512, the serve-bench model's
checkpoint spacing), in alternating order, `--pairs` times. Each engine
prefills the throughput prompts of the serve benchmark (2,000, 2,500 and
3,000 tokens, one token generated, one prompt at a time) for `--rounds`
timed rounds after one untimed. Prints each engine's median seconds and the
per-pair ratio of prefill rate, chunked over default.

    $VENV/bin/python scripts/vllm_chunk_cost.py [--tokens 512] [--pairs 2]

(VENV: `bash scripts/vllm-venv.sh` prints it.)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent


def engine(work: str, tokens: int, rounds: int) -> list[float]:
    """One engine: seconds per timed round (prompts from serve_bench)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sys.path.insert(0, str(HERE))
    import serve_bench as sb
    from vllm import LLM, SamplingParams

    model = pathlib.Path(work) / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(sb.MODEL))
    kw = {"max_num_batched_tokens": tokens} if tokens else {}
    llm = LLM(model=str(model), load_format="dummy", skip_tokenizer_init=True,
              enforce_eager=True, dtype="float32", enable_prefix_caching=False,
              distributed_executor_backend="uni", max_model_len=8192, seed=0, **kw)
    llm.apply_model(sb.sharpen)
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    out = []
    for k in range(rounds + 1):
        prompts = [sb.fresh(f"chunk cost {k} {i}", n) for i, n in enumerate(sb.THROUGHPUT)]
        t = time.perf_counter()
        for p in prompts:
            llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)
        if k > 0:
            out.append(time.perf_counter() - t)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=512, help="the chunked engine's step budget")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--engine", type=int, help=argparse.SUPPRESS)  # a child: 0 is vLLM's default
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.engine is not None:
        print(json.dumps(engine(args.work, args.engine, args.rounds)))
        return 0
    ratios = []
    with tempfile.TemporaryDirectory(prefix="ucm-chunk-cost-") as work:
        for k in range(args.pairs):
            med = {}
            for tokens in (0, args.tokens) if k % 2 == 0 else (args.tokens, 0):
                r = subprocess.run(
                    [sys.executable, __file__, "--engine", str(tokens), "--work", work,
                     "--rounds", str(args.rounds)],
                    capture_output=True, text=True, timeout=1800,
                )
                if r.returncode != 0:
                    print(r.stderr[-3000:], file=sys.stderr)
                    return 1
                times = json.loads(r.stdout.strip().splitlines()[-1])
                med[tokens] = statistics.median(times)
                name = f"max_num_batched_tokens={tokens}" if tokens else "vLLM's default"
                print(f"pair {k + 1}: {name}: median {med[tokens]:.3f} s "
                      f"[{min(times):.3f}-{max(times):.3f}]", flush=True)
            ratios.append(med[0] / med[args.tokens])
            print(f"pair {k + 1}: prefill rate with steps of {args.tokens} tokens / default: "
                  f"{ratios[-1]:.3f}", flush=True)
    print(f"median {statistics.median(ratios):.3f} over {len(ratios)} pairs "
          f"[{min(ratios):.3f}-{max(ratios):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
