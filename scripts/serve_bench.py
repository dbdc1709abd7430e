"""A serving benchmark in the real vLLM on this CPU: TTFT per turn with no
cache, with vLLM's own prefix caching, with UCM through its connector, and
with UCM after an engine restart (warm start from disk).

Usage (the venv of scripts/vllm-venv.sh, the wheel installed in it; see
scripts/serve-bench.sh, which does both):

    python scripts/serve_bench.py all --work DIR [--sessions 4] [--turns 4]
        [--docs 3] [--questions 3] [--json OUT]

The model is a NemotronH-style hybrid (Mamba2 and attention layers, random
weights, fp32): prefilling 1.2-1.6K tokens takes 0.4-0.6 s on this 2-core
machine when it is quiet, 1.7-2.8 s under other load (2-3K tokens: over a
second). The workloads are plain: no prompt is cut to a block or checkpoint
grid.

- chat: `--sessions` conversations over one shared system prompt, each of
  `--turns` turns; a turn sends the whole history (system prompt, earlier
  messages and answers) and a new user message; the answer (greedy,
  `ANSWER` tokens) joins the history.
- docs: `--docs` documents, each asked `--questions` different questions
  (the document, then the question).

Configurations: `none` (no cache), `vllm` (vLLM's own prefix caching: for a
hybrid, its "align" mode, which ends prefill chunks on block boundaries
so that states exist there), `ucm` (UCM's connector and its scheduler,
`ucm.vllm_scheduler.UcmScheduler`, vLLM's cache off, as the README
configures it), `ucm-unaligned` (the connector with vLLM's own scheduler:
states only where vLLM ends a step), `ucm+vllm` (both caches: vLLM's
alignment gives UCM states at block boundaries), `ucm-restart` (below).

The `ucm` run also writes the spec its connector derived and its
requests as served (prompts and answers); `ucm replay --requests` (the
`ucm` binary: `UCM_BIN`, else target/release/ucm) replays them through the
engine harness, and the report sets the tokens vLLM was served from cache
against the replay's (goal: within 10%).

The `ucm` run ends with `--throughput-rounds` paired rounds of distinct
2,000-3,000-token prompts, prefilled with UCM's chunk stops and without
them in the same engine (the stops switched off in its scheduler), in two
arrangements: six prompts sent together (a loaded server: the engine's
throughput, where the goal of at least 0.95 of the median ratio is
judged) and three sent one at a time (a lone request's prefill: each stop
is one more engine step, which costs as much as vLLM's own chunking at the
same size; reported).

Each configuration runs in a fresh engine process, requests one at a time.
TTFT is vLLM's own per-request figure (arrival to first token,
`RequestOutput.metrics.first_token_latency`). Tokens from cache are UCM's
hit counter (its connector) or vLLM's `num_cached_tokens` (its prefix
cache). Every configuration's outputs are compared with the no-cache run's,
token for token. `ucm-restart` runs a second engine on the store the `ucm`
run left: the first turn of every known conversation must be served from
disk.

Exit status: non-zero when outputs differ from the no-cache run's or a run
of `none`, `ucm` or `ucm-restart` fails; goals (restart served from disk,
later turns' TTFT p50 40% below no cache and below vLLM's prefix caching)
are printed, and fail the run only with `--require-goals`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vllm_e2e import hit_tokens, seq, sharpen  # noqa: E402

# Prefill of 2-3K tokens takes over a second on this 2-core machine.
MODEL = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "hybrid_override_pattern": "M*M-M*M-",
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "mamba_num_heads": 16,
    "mamba_head_dim": 64,
    "ssm_state_size": 64,
    "n_groups": 1,
    "conv_kernel": 4,
    "expand": 1,
    "chunk_size": 128,
    "mamba_hidden_act": "silu",
    "use_conv_bias": True,
    "use_bias": False,
    "mlp_hidden_act": "relu2",
    "vocab_size": 2048,
    "max_position_embeddings": 8192,
    "layer_norm_epsilon": 1e-5,
    "rms_norm_eps": 1e-5,
    "residual_in_fp32": False,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

SYSTEM = 1024
MESSAGE = (150, 250)
ANSWER = 64
DOC = 1500
QUESTION = (40, 90)
CONFIGS = ["none", "vllm", "ucm", "ucm-unaligned", "ucm+vllm", "ucm-restart"]
# Prompt lengths of the throughput rounds: distinct prompts, no reuse.
THROUGHPUT = (2000, 2500, 3000)
# The runs whose failure fails the benchmark; the others are reported.
REQUIRED = {"none", "ucm", "ucm-restart"}


def workload(args) -> list[dict]:
    """The requests in the order they are sent: `{"kind", "conv", "turn",
    "prefix", "message"}`; a chat turn's prompt is its conversation's
    history (filled in as answers come) plus its message."""
    reqs = []
    system = seq(11, SYSTEM)
    for t in range(args.turns):
        for s in range(args.sessions):
            lo, hi = MESSAGE
            n = lo + (s * 37 + t * 53) % (hi - lo)
            reqs.append(
                {"kind": "chat", "conv": s, "turn": t, "prefix": system if t == 0 else None,
                 "message": seq(100 + 17 * s + t, n)}
            )
    for d in range(args.docs):
        doc = seq(500 + d, DOC)
        for q in range(args.questions):
            lo, hi = QUESTION
            n = lo + (d * 13 + q * 29) % (hi - lo)
            reqs.append({"kind": "docs", "conv": d, "turn": q, "prefix": doc,
                         "message": seq(900 + 7 * d + q, n)})
    return reqs


def run(args) -> None:
    """One engine process: every request of the workload under one
    configuration; writes per-request results to `--out`."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    model_dir = pathlib.Path(args.work) / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL))
    kw = {}
    cfg = args.config
    if cfg.startswith("ucm"):
        store = "store" if cfg in ("ucm", "ucm-restart") else f"store-{cfg}"
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="UcmConnector",
            kv_connector_module_path="ucm.vllm_connector",
            kv_role="kv_both",
            # `ucm-restart` starts on the store `ucm` left; the others
            # have their own.
            kv_connector_extra_config={"dir": str(pathlib.Path(args.work) / store),
                                       "model_id": "serve-bench"},
            kv_load_failure_policy="recompute",
        )
        if cfg != "ucm-unaligned":
            # As the README configures it: prefill chunks end at UCM's
            # planned checkpoints.
            kw["scheduler_cls"] = "ucm.vllm_scheduler.UcmScheduler"
    try:
        llm = LLM(
            model=str(model_dir),
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="float32",
            enable_prefix_caching=cfg in ("vllm", "ucm+vllm"),
            distributed_executor_backend="uni",
            max_model_len=8192,
            seed=0,
            disable_log_stats=False,
            **kw,
        )
    except Exception as e:  # the engine refuses the configuration
        pathlib.Path(args.out).write_text(json.dumps({"unsupported": f"{type(e).__name__}: {e}"[:400]}))
        return
    llm.apply_model(sharpen)
    sp = SamplingParams(max_tokens=ANSWER, temperature=0.0, ignore_eos=True)
    history: dict[tuple, list[int]] = {}
    out = []
    served_prompts = []
    reqs = workload(args)
    if cfg == "ucm-restart":
        # A restarted engine: the first turn of each known conversation,
        # as a user coming back would send it.
        reqs = [r for r in reqs if r["kind"] == "chat" and r["turn"] == 0] + [
            r for r in reqs if r["kind"] == "docs" and r["turn"] == 0
        ]
    for r in reqs:
        key = (r["kind"], r["conv"])
        prefix = r["prefix"] if r["prefix"] is not None else history[key]
        prompt = prefix + r["message"]
        before = 0
        if cfg.startswith("ucm"):
            import ucm.vllm_connector as vc

            before = hit_tokens(vc.metrics_text())
        t0 = time.time()
        res = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0]
        wall = time.time() - t0
        m = res.metrics
        ttft = getattr(m, "first_token_latency", 0.0) if m is not None else 0.0
        if not ttft:
            raise SystemExit("serve-bench: this vLLM reports no first-token latency")
        cached = int(res.num_cached_tokens or 0)
        if cfg.startswith("ucm"):
            cached = max(cached, hit_tokens(vc.metrics_text()) - before)
        answer = list(res.outputs[0].token_ids)
        if r["kind"] == "chat":
            history[key] = prompt + answer
        served_prompts.append(prompt)
        out.append({"kind": r["kind"], "conv": r["conv"], "turn": r["turn"], "prompt": len(prompt),
                    "ttft_s": ttft, "wall_s": wall, "cached": cached, "tokens": answer})
    result = {"requests": out}
    if cfg == "ucm":
        # What the replay needs to predict these hits: the spec the
        # connector derived, and the requests as served (prompt and answer).
        conn = llm.llm_engine.engine_core.engine_core.scheduler.connector
        (pathlib.Path(args.work) / "spec.toml").write_text(conn._plan.toml)
        with open(pathlib.Path(args.work) / "requests.jsonl", "w") as f:
            for r, p in zip(out, served_prompts):
                session = r["conv"] + (0 if r["kind"] == "chat" else 1000)
                f.write(json.dumps({"session": session, "turn": r["turn"], "prompt": p,
                                    "output": r["tokens"]}) + "\n")
    if cfg == "ucm" and args.throughput_rounds > 0:
        result["throughput"] = throughput(llm, args.throughput_rounds)
    pathlib.Path(args.out).write_text(json.dumps(result))


def fresh(name: str, n: int) -> list[int]:
    """`n` tokens no other prompt of the benchmark starts with: drawn by a
    generator seeded with `name` (`seq(seed)` depends only on `seed` mod
    1,900, so its seeds would meet the workload's)."""
    rng = random.Random(name)
    return [rng.randrange(50, 1950) for _ in range(n)]


def throughput_prompts(arr: str, k: int, on: bool, copies: int) -> list[list[int]]:
    """The prompts of round `k` of arrangement `arr`, with the stops `on` or
    not: `copies` of each `THROUGHPUT` length, none seen before."""
    return [
        fresh(f"throughput {arr} {k} {on} {c} {i}", n)
        for c in range(copies)
        for i, n in enumerate(THROUGHPUT)
    ]


def throughput(llm, rounds: int) -> dict:
    """Prefill throughput with UCM's chunk stops over without, in the same
    engine. Each round prefills distinct prompts (`THROUGHPUT` tokens,
    never seen before, one token generated) once with the stops and once
    without, in alternating order, in two arrangements: `concurrent`, two
    prompts of each length sent together (a loaded server), and
    `sequential`, one of each length sent one at a time (a lone request).
    The stops are switched off by clearing the scheduler's hook
    (`ucm.vllm_scheduler`), so the connector, its saves and the engine
    are the same. Returns, per arrangement, the per-round ratios (tokens/s
    with over without) and their median; the top-level `ratios` and
    `median` are the concurrent ones."""
    from vllm import SamplingParams

    sched = llm.llm_engine.engine_core.engine_core.scheduler
    stops = sched._ucm_stops
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ratios: dict[str, list[float]] = {"concurrent": [], "sequential": []}
    try:
        for k in range(rounds):
            for arr, copies in (("concurrent", 2), ("sequential", 1)):
                rate = {}
                for on in (True, False) if k % 2 == 0 else (False, True):
                    sched._ucm_stops = stops if on else None
                    prompts = throughput_prompts(arr, k, on, copies)
                    batches = [prompts] if arr == "concurrent" else [[p] for p in prompts]
                    t0 = time.perf_counter()
                    for b in batches:
                        llm.generate([{"prompt_token_ids": p} for p in b], sp, use_tqdm=False)
                    rate[on] = copies * sum(THROUGHPUT) / (time.perf_counter() - t0)
                ratios[arr].append(rate[True] / rate[False])
    finally:
        sched._ucm_stops = stops
    out = {
        arr: {"ratios": [round(r, 4) for r in v], "median": round(statistics.median(v), 4)}
        for arr, v in ratios.items()
    }
    return {**out["concurrent"], **out}


def predict(work: pathlib.Path) -> int | None:
    """Tokens `ucm replay --requests` serves the `ucm` run's requests (the
    connector's spec, the same prompts and answers, the engine harness
    with the content oracle), or None without a `ucm` binary (`UCM_BIN`,
    else the repository's target/release/ucm)."""
    exe = pathlib.Path(os.environ.get("UCM_BIN") or HERE.parent / "target" / "release" / "ucm")
    reqs, spec = work / "requests.jsonl", work / "spec.toml"
    if not exe.exists() or not reqs.exists():
        return None
    scratch = work / "replay"
    scratch.mkdir(exist_ok=True)
    out = subprocess.run(
        [str(exe), "replay", "--requests", str(reqs), "--spec", str(spec), "--modes", "ucm",
         "--runs", "1", "--json", "--dir", str(scratch)],
        capture_output=True, text=True, timeout=1800,
    )
    if out.returncode != 0:
        raise SystemExit(f"serve-bench: ucm replay --requests failed: {out.stderr[-2000:]}")
    return int(json.loads(out.stdout)["modes"]["ucm"]["cached_tokens"])


def pct(v: list[float], q: float) -> float:
    v = sorted(v)
    if not v:
        return 0.0
    k = q * (len(v) - 1)
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def all_configs(args) -> int:
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for cfg in CONFIGS:
        out = work / f"{cfg}.json"
        cmd = [sys.executable, __file__, "run", "--config", cfg, "--work", str(work), "--out", str(out),
               "--sessions", str(args.sessions), "--turns", str(args.turns),
               "--docs", str(args.docs), "--questions", str(args.questions),
               "--throughput-rounds", str(args.throughput_rounds)]
        t = time.time()
        with open(work / f"{cfg}.log", "w") as fh:
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=args.timeout)
        if rc != 0:
            tail = open(work / f"{cfg}.log").read()[-4000:]
            if cfg in REQUIRED:
                print(tail, file=sys.stderr)
                raise SystemExit(f"serve-bench: {cfg} failed (exit {rc})")
            results[cfg] = {"unsupported": f"exit {rc}: " + tail[-300:].replace(chr(10), " ")}
        else:
            results[cfg] = json.loads(out.read_text())
        print(f"serve-bench: {cfg:12} {time.time() - t:6.1f} s", file=sys.stderr)
    base = {(r["kind"], r["conv"], r["turn"]): r for r in results["none"]["requests"]}
    report = {"model": MODEL, "workload": vars(args) | {"system": SYSTEM, "answer": ANSWER, "doc": DOC},
              "configs": {}}
    failures = []
    lines = []
    for cfg in CONFIGS:
        res = results[cfg]
        if "unsupported" in res:
            report["configs"][cfg] = res
            lines.append(f"{cfg:12} unsupported: {res['unsupported'][:160]}")
            continue
        reqs = res["requests"]
        same = all(r["tokens"] == base[(r["kind"], r["conv"], r["turn"])]["tokens"] for r in reqs)
        if not same:
            failures.append(f"{cfg}: outputs differ from the no-cache run")
        rows = {}
        for kind in ("chat", "docs"):
            for turn in sorted({r["turn"] for r in reqs if r["kind"] == kind}):
                sel = [r for r in reqs if r["kind"] == kind and r["turn"] == turn]
                t = [r["ttft_s"] * 1000 for r in sel]
                rows[f"{kind} {turn}"] = {
                    "requests": len(sel),
                    "prompt_tokens": sum(r["prompt"] for r in sel),
                    "cached_tokens": sum(r["cached"] for r in sel),
                    "ttft_p50_ms": round(statistics.median(t), 1),
                    "ttft_p90_ms": round(pct(t, 0.9), 1),
                }
        later = [r["ttft_s"] * 1000 for r in reqs if r["turn"] > 0]
        report["configs"][cfg] = {"outputs_equal": same, "per_turn": rows,
                                  "later_turns_ttft_p50_ms": round(statistics.median(later), 1) if later else None}
        for name, row in rows.items():
            lines.append(
                f"{cfg:12} {name:7} {row['requests']:3} req  prompt {row['prompt_tokens']:6}  cached "
                f"{row['cached_tokens']:6}  ttft p50 {row['ttft_p50_ms']:7.1f} ms  p90 {row['ttft_p90_ms']:7.1f} ms"
            )
        lines.append(f"{cfg:12} outputs equal to no-cache: {same}")
    # The goals (issue 35): reported; they fail the run with --require-goals.
    goals = []
    rs = results["ucm-restart"]
    if "requests" in rs and not all(r["cached"] > 0 for r in rs["requests"]):
        goals.append("ucm-restart: a known conversation's first turn was not served from disk")
    p50 = {c: report["configs"][c].get("later_turns_ttft_p50_ms") for c in CONFIGS}
    if p50["ucm"] and p50["none"] and p50["ucm"] > 0.6 * p50["none"]:
        goals.append(f"ucm: later turns' TTFT p50 {p50['ucm']} ms is not 40% below no-cache's {p50['none']} ms")
    if p50["ucm"] and p50["vllm"] and p50["ucm"] >= p50["vllm"]:
        goals.append(f"ucm: later turns' TTFT p50 {p50['ucm']} ms is not below vLLM's prefix caching's {p50['vllm']} ms")
    predicted = predict(work)
    if predicted is not None and "requests" in results["ucm"]:
        real = sum(r["cached"] for r in results["ucm"]["requests"])
        report["replay_prediction"] = {"served_real": real, "served_replay": predicted}
        off = abs(real - predicted) / predicted if predicted else (0.0 if real == 0 else 1.0)
        lines.append(f"{'ucm':12} tokens from cache: {real} in vLLM, {predicted} predicted by "
                     f"`ucm replay --requests` on the same requests ({off:.1%} apart)")
        if off > 0.10:
            goals.append(f"ucm: tokens from cache {real} are {off:.1%} from the replay's {predicted} (goal 10%)")
    elif predicted is None:
        lines.append(f"{'ucm':12} replay prediction skipped: no `ucm` binary (cargo build --release, or UCM_BIN)")
    tp = results["ucm"].get("throughput")
    if tp:
        report["throughput_with_stops_over_without"] = tp
        for arr, what in (("concurrent", "six prompts together"), ("sequential", "one prompt at a time")):
            t = tp[arr]
            lines.append(
                f"{'ucm':12} prefill throughput with chunk stops / without, {what}: median "
                f"{t['median']:.3f} [{min(t['ratios']):.3f}-{max(t['ratios']):.3f}] over "
                f"{len(t['ratios'])} rounds"
            )
        if tp["median"] < 0.95:
            goals.append(
                f"ucm: prefill throughput with chunk stops is {tp['median']:.3f} of without, six "
                "prompts together (goal 0.95)"
            )
    report["goals_not_met"] = goals
    print("\n".join(lines))
    for g in goals:
        print(f"serve-bench: goal not met: {g}")
    if args.require_goals:
        failures += goals
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    for f in failures:
        print(f"serve-bench: FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["all", "run"])
    p.add_argument("--work", required=True)
    p.add_argument("--config", choices=CONFIGS)
    p.add_argument("--out")
    p.add_argument("--json")
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--docs", type=int, default=3)
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--throughput-rounds", type=int, default=5,
                   help="paired rounds of the chunk stops' throughput check (0: none)")
    p.add_argument("--require-goals", action="store_true",
                   help="fail when a goal is not met (by default they are reported)")
    args = p.parse_args()
    if args.what == "run":
        run(args)
        return 0
    return all_configs(args)


if __name__ == "__main__":
    sys.exit(main())
