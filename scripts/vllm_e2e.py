"""UCM inside a real vLLM (CPU): the engine's output is unchanged when its
prefix comes from UCM.

    python scripts/vllm_e2e.py all --work DIR       # every check (CI)
    python scripts/vllm_e2e.py run --model M --mode MODE --dir D --out F.json

Each engine runs in its own process (`run`); `all` compares them:

* per model (a dense Llama, a NemotronH-style Mamba2 + attention hybrid):
  1. `baseline`: no connector;
  2. `ucm` on a fresh store (with `ucm.vllm_scheduler.UcmScheduler`, as the
     README configures it): the same prompts one after the other, so later
     prompts hit what earlier ones stored; greedy tokens **and** logprobs
     equal the baseline's bit for bit, and the connector reports hits; two
     plain prompts that share 1,500 tokens and then diverge: the second is
     served up to the last planned checkpoint before the divergence, with
     the baseline's output (for the hybrid, also with vLLM's own scheduler,
     which must serve it nothing: the hit comes from the chunk stops);
  3. `ucm` again, a second engine process on the same store (warm
     restart): every shared prefix hits from the first request on;
     then cache identity: a checkpoint with other config bytes under the
     same name (one more key in config.json) is served nothing, and the
     unchanged deployment started again hits as the first restart did;
  4. negative control 1, corrupted bytes: every stored block file on disk
     has a byte flipped, then a fresh engine runs: the loads fail their
     checksums, are reported, vLLM recomputes, outputs still equal;
  5. negative control 2, checksums bypassed (`scripts/ucm_sabotage.py`, a
     test-only subclass of the connector, `garble_loads`: the
     loaded bytes are altered in the engine's memory after the load):
     outputs differ, proving the loaded bytes are used.

vLLM's own prefix caching is off, fp32, enforce_eager, the uni executor
and no engine multiprocessing (engine start under 15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

MODELS = {
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 2048,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "nemotron_h": {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "hybrid_override_pattern": "M*M-",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "mamba_num_heads": 8,
        "mamba_head_dim": 32,
        "ssm_state_size": 32,
        "n_groups": 1,
        "conv_kernel": 4,
        "expand": 1,
        "chunk_size": 128,
        "mamba_hidden_act": "silu",
        "use_conv_bias": True,
        "use_bias": False,
        "mlp_hidden_act": "relu2",
        "vocab_size": 2048,
        "max_position_embeddings": 4096,
        "layer_norm_epsilon": 1e-5,
        "rms_norm_eps": 1e-5,
        "residual_in_fp32": False,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def seq(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 1900 + 50 for i in range(n)]


def prompts(block: int) -> list[list[int]]:
    """Prompts with shared prefixes, in the order they are sent: each later
    one shares whole blocks with an earlier one."""
    system = seq(1, 2 * block)
    # vLLM prefills a prompt in one chunk, so a recurrent state exists only
    # where a prompt ends: the first prompt of a family ends on the grid.
    return [
        system,  # stores 2 blocks (and the state at their end)
        system + seq(3, 40),  # hits 2 blocks
        system + seq(2, block),  # hits 2 blocks; stores a 3rd (and its state)
        system + seq(2, block) + seq(5, 17),  # hits 3 blocks
    ]


def sharpen(model) -> bool:
    """Re-initialises the parameters vLLM's CPU backend keeps unpacked, so
    that outputs vary and a recurrent state matters: vLLM's dummy weights
    (uniform in +-1e-3) leave a Mamba layer's state below fp32 resolution.
    Deterministic per parameter name, so every engine process agrees. Mamba
    layers get no skip connection (D = 0) and a slow decay: their output
    comes from the state alone."""
    import zlib

    import torch

    for name, p in model.named_parameters():
        if p.numel() == 0:
            continue  # packed by the CPU backend
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        with torch.no_grad():
            if name.endswith("mixer.A"):
                p.copy_(-(0.1 + 0.9 * torch.rand(p.shape, generator=g)))
            elif name.endswith("mixer.D") or name.endswith("dt_bias"):
                p.zero_()
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.fill_(1.0)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    return True


def run(args) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    model_dir = pathlib.Path(args.dir) / "models" / args.model
    model_dir.mkdir(parents=True, exist_ok=True)
    config = dict(MODELS[args.model])
    if args.config_marker:
        # Another checkpoint under the same name: one more key in its
        # config.json, nothing else (the weights are the same dummy ones).
        config["ucm_e2e_marker"] = args.config_marker
    (model_dir / "config.json").write_text(json.dumps(config))
    kw = {}
    if args.mode != "baseline":
        # The run with vLLM's own scheduler has a store of its own.
        store = "store-vllm-scheduler" if args.vllm_scheduler else "store"
        extra = {"dir": str(pathlib.Path(args.dir) / store / args.model), "model_id": args.model}
        if not args.vllm_scheduler:
            # As the README configures it.
            kw["scheduler_cls"] = "ucm.vllm_scheduler.UcmScheduler"
        connector, module = "UcmConnector", "ucm.vllm_connector"
        if args.mode in ("garble_loads", "garble_states"):
            # The negative controls: a test-only subclass beside this
            # script (not in the wheel), importable by the engine process.
            extra["sabotage"] = args.mode
            connector, module = "SabotagedUcmConnector", "ucm_sabotage"
            here = str(pathlib.Path(__file__).resolve().parent)
            sys.path.insert(0, here)
            os.environ["PYTHONPATH"] = os.pathsep.join(
                p for p in (here, os.environ.get("PYTHONPATH")) if p
            )
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path=module,
            kv_role="kv_both",
            kv_connector_extra_config=extra,
            kv_load_failure_policy="recompute",
        )
    t0 = time.time()
    llm = LLM(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        enable_prefix_caching=False,
        distributed_executor_backend="uni",
        max_model_len=2048,
        max_num_batched_tokens=2048,
        max_num_seqs=4,
        seed=0,
        **kw,
    )
    started = time.time() - t0
    llm.apply_model(sharpen)
    block = llm.llm_engine.vllm_config.cache_config.block_size
    sp = SamplingParams(max_tokens=8, temperature=0.0, logprobs=3)
    ps = prompts(block)
    # A restarted engine starts with a prompt that hits what the first
    # process stored: its first prompt's own prefix is not on the grid.
    order = [1, 0, 2, 3] if args.restarted else [0, 1, 2, 3]
    results = [None] * len(ps)
    first_served = None
    for i in order:
        out = llm.generate([{"prompt_token_ids": ps[i]}], sp, use_tqdm=False)[0].outputs[0]
        if first_served is None and args.mode != "baseline":
            import ucm.vllm_connector as vc

            # What the first prompt was served: only what earlier
            # processes stored can serve it.
            first_served = hit_tokens(vc.metrics_text())
        results[i] = {
            "tokens": list(out.token_ids),
            "logprobs": [{str(t): lp.logprob for t, lp in step.items()} for step in out.logprobs],
        }
    metrics = ""
    decode_hit = None
    if args.mode != "baseline":
        import ucm.vllm_connector as vc

        if not args.restarted:
            # A chat's next turn re-sends the answer: blocks completed by
            # decoding must hit too.
            long = llm.generate(
                [{"prompt_token_ids": ps[1]}],
                SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True),
                use_tqdm=False,
            )[0].outputs[0]
            before = hit_tokens(vc.metrics_text())
            follow = ps[1] + list(long.token_ids) + seq(7, 30)
            llm.generate([{"prompt_token_ids": follow}], sp, use_tqdm=False)
            decode_hit = hit_tokens(vc.metrics_text()) - before
        metrics = vc.metrics_text()
    plain = None
    if not args.restarted:
        plain = plain_shared_served(
            llm, sp, None if args.mode == "baseline" else vc.metrics_text, wait=False
        )
        if args.mode != "baseline":
            metrics = vc.metrics_text()
    pathlib.Path(args.out).write_text(
        json.dumps(
            {
                "block": block,
                "start_s": started,
                "results": results,
                "metrics": metrics,
                "decode_hit": decode_hit,
                "first_served": first_served,
                "plain": plain,
            }
        )
    )


def metric(text: str, name: str) -> float:
    """The sum of a metric over its labels (or one series, `name{...}`)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or ("{" not in name and line.startswith(name + "{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def hit_tokens(text: str) -> int:
    """Tokens served so far (every group serves the same prefix)."""
    for line in text.splitlines():
        if line.startswith("ucm_hit_tokens_total{"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def flip_store_bytes(store: pathlib.Path) -> int:
    """Flips one payload byte of every block file under `store`."""
    n = 0
    for f in store.rglob("*"):
        if f.is_file() and f.parent.name != "tmp" and f.stat().st_size > 8192:
            with open(f, "r+b") as fh:
                fh.seek(f.stat().st_size - 100)
                b = fh.read(1)
                fh.seek(f.stat().st_size - 100)
                fh.write(bytes([b[0] ^ 0xFF]))
            n += 1
    return n


def all_checks(args) -> int:
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    failures = []

    def engine(model: str, mode: str, tag: str, marker: str = "") -> dict:
        out = work / f"{model}-{tag}.json"
        t = time.time()
        cmd = [sys.executable, __file__, "run", "--model", model, "--mode", mode]
        if tag in ("warm", "changed", "again", "corrupt", "garble", "garble_st"):
            cmd.append("--restarted")
        if tag == "vllm_sched":
            cmd.append("--vllm-scheduler")
        if marker:
            cmd += ["--config-marker", marker]
        cmd += ["--dir", str(work), "--out", str(out)]
        log = work / f"{model}-{tag}.log"
        with open(log, "w") as fh:
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=600)
        if rc != 0:
            print(open(log).read()[-6000:], file=sys.stderr)
            raise SystemExit(f"vllm-e2e: {model} {tag} failed (exit {rc}); log {log}")
        r = json.loads(out.read_text())
        print(
            f"vllm-e2e: {model:10} {tag:9} engine start {r['start_s']:.1f} s, "
            f"run {time.time() - t:.1f} s",
            flush=True,
        )
        return r

    def same(a: dict, b: dict) -> bool:
        return a["results"] == b["results"]

    def check(cond: bool, what: str) -> None:
        print(f"vllm-e2e:   {'ok  ' if cond else 'FAIL'} {what}", flush=True)
        if not cond:
            failures.append(what)

    for model in args.models.split(","):
        out = work / f"{model}-readme.json"
        log = work / f"{model}-readme.log"
        t = time.time()
        cmd = [sys.executable, __file__, "readme", "--model", model, "--dir", str(work),
               "--out", str(out)]
        with open(log, "w") as fh:
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=600)
        text = log.read_text()
        if rc != 0:
            print(text[-6000:], file=sys.stderr)
            raise SystemExit(f"vllm-e2e: {model} README snippet failed (exit {rc}); log {log}")
        r = json.loads(out.read_text())
        print(f"vllm-e2e: {model:10} readme    run {time.time() - t:.1f} s", flush=True)
        served = metric(r["metrics"], "ucm_lookup_hits_total")
        check(served >= 1,
              f"{model}: README snippet, engine in its own process: metrics_text(dir) counts "
              f"the second turn's hit ({served:.0f} hits)")
        info = [l for l in text.splitlines() if "ucm: request" in l and "from cache" in l]
        check(len(info) >= 1 and "INFO" in info[0],
              f"{model}: README snippet: an INFO line names the request served from cache "
              f"({info[0].strip() if info else 'none'})")
        hybrid = "hybrid_override_pattern" in MODELS[model]
        # Two plain prompts that share SHARED tokens: the second resumes at
        # the last planned point before the divergence. A dense model has no
        # states: every whole block is served. The hybrid's states are kept
        # at speculative points spaced by D71's byte rule (here 2 blocks).
        grid = r["block"] * (2 if hybrid else 1)
        want = SHARED // grid * grid
        check(r["shared"] >= want,
              f"{model}: README snippet, default scheduler settings: a plain prompt sharing "
              f"{SHARED} tokens with an earlier one is served {r['shared']} tokens (at least {want})")
        base = engine(model, "baseline", "baseline")
        toks = {tuple(r["tokens"]) for r in base["results"]}
        check(len(toks) > 1 or len(set(base["results"][0]["tokens"])) > 1,
              f"{model}: the baseline's outputs vary")
        cold = engine(model, "ucm", "cold")
        check(same(base, cold), f"{model}: outputs through UCM equal the baseline, bit for bit")
        check(cold["plain"]["served"] >= want and cold["plain"]["second"] == base["plain"]["second"],
              f"{model}: the plain prompt sharing {SHARED} tokens is served {cold['plain']['served']} "
              f"tokens, and its output equals the baseline's")
        if hybrid:
            own = engine(model, "ucm", "vllm_sched")
            check(same(base, own), f"{model}: UCM with vLLM's own scheduler: outputs equal the baseline")
            check(own["plain"]["served"] == 0,
                  f"{model}: with vLLM's own scheduler the same plain prompt is served nothing "
                  f"({own['plain']['served']} tokens): the hit comes from UCM's chunk stops")
        hits = metric(cold["metrics"], "ucm_lookup_hits_total")
        check(hits >= 3, f"{model}: later prompts hit what earlier ones stored ({hits:.0f} hits)")
        check(metric(cold["metrics"], "ucm_failed_loads_total") == 0, f"{model}: no failed loads")
        want = 3 * cold["block"]
        check(cold["decode_hit"] >= want,
              f"{model}: a next turn re-sending the answer hits blocks (and states) decoding "
              f"completed ({cold['decode_hit']} tokens served, {want} wanted)")
        warm = engine(model, "ucm", "warm")
        check(same(base, warm), f"{model}: a second engine process's outputs equal the baseline")
        whits = metric(warm["metrics"], "ucm_lookup_hits_total")
        check(whits >= 3, f"{model}: the second process hits what the first stored ({whits:.0f} hits)")
        check(metric(warm["metrics"], "ucm_disk_read_bytes_total") > 0,
              f"{model}: the second process reads the first one's blocks from disk")
        # Cache identity: the same name with other config bytes shares no
        # hit with what the first processes stored; the unchanged
        # deployment, started again, still hits all of it.
        # (Later prompts of one process hit what its own earlier prompts
        # stored, so the check is on the first prompt of each process.)
        changed = engine(model, "ucm", "changed", marker="other-checkpoint")
        check(warm["first_served"] > 0 and changed["first_served"] == 0,
              f"{model}: a checkpoint with other config bytes under the same name is served "
              f"nothing of what the others stored ({changed['first_served']} tokens; the "
              f"restart before it: {warm['first_served']})")
        check(same(base, changed), f"{model}: the changed deployment's outputs equal the baseline")
        note = [l for l in (work / f"{model}-changed.log").read_text().splitlines()
                if "served nothing; the store holds" in l]
        check(len(note) == 1 and "INFO" in note[0] and "weights:" in note[0],
              f"{model}: the changed deployment says once, at INFO, that the store holds another "
              f"identity of the model and what differs ({note[0].strip()[:160] if note else 'none'})")
        again = engine(model, "ucm", "again")
        check(again["first_served"] == warm["first_served"],
              f"{model}: the unchanged deployment started again is served as the first restart "
              f"was ({again['first_served']} tokens, {warm['first_served']} before)")
        flipped = flip_store_bytes(work / "store" / model)
        corrupt = engine(model, "ucm", "corrupt")
        failed = metric(corrupt["metrics"], "ucm_failed_loads_total")
        check(flipped > 0 and failed > 0,
              f"{model}: corrupted blocks ({flipped} files) are reported as failed loads ({failed:.0f})")
        check(same(base, corrupt), f"{model}: with corrupted blocks, vLLM recomputes: outputs equal")
        garbled = engine(model, "garble_loads", "garble")
        check(metric(garbled["metrics"], "ucm_lookup_hits_total") > 0, f"{model}: the garbled run hits")
        check(not same(base, garbled),
              f"{model}: with the loaded K/V altered, outputs differ (the loads are used)")
        if "hybrid_override_pattern" in MODELS[model]:
            state_reads = metric(warm["metrics"], 'ucm_disk_read_bytes_total{group="g0_state"}')
            check(state_reads > 0,
                  f"{model}: the restarted engine's recurrent states come from the SnapshotStore "
                  f"({state_reads:.0f} bytes read)")
            g = engine(model, "garble_states", "garble_st")
            check(not same(base, g),
                  f"{model}: with the loaded states altered, outputs differ (the states are used)")
    if failures:
        print(f"vllm-e2e: {len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("vllm-e2e: all checks passed")
    return 0


README_MARK = "<!-- snippet: vllm -->"


def snippet_in(path: pathlib.Path) -> str:
    """The Python block that follows the snippet mark in `path`."""
    text = path.read_text()
    at = text.index(README_MARK)
    start = text.index("```python\n", at) + len("```python\n")
    return text[start : text.index("```", start)]


def readme_snippet() -> str:
    """README.md's vLLM snippet; docs/embedding.md must show the same."""
    root = pathlib.Path(__file__).resolve().parents[1]
    s = snippet_in(root / "README.md")
    if snippet_in(root / "docs" / "embedding.md") != s:
        raise SystemExit("docs/embedding.md's vLLM snippet differs from README.md's")
    return s


def readme(args) -> None:
    """Runs README.md's vLLM snippet as written, in vLLM's default engine
    multiprocessing, with `MODEL` and `UCM_DIR` set, on the CPU with the
    environment docs/embedding.md gives (`VLLM_CPU_KVCACHE_SPACE=4`). The test
    model has random weights, so `vllm.LLM` is given `load_format="dummy"`
    and no tokenizer here; the snippet's own arguments are untouched. Then:
    a second prompt that continues the first must be served from cache,
    with an INFO line naming the request, and
    `metrics_text(UCM_DIR)` must count the hit from outside the engine's
    process."""
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    # The environment docs/embedding.md gives a CPU user, as written there:
    # without a KV-cache size vLLM takes most of the machine's memory (the
    # hybrid model's worker was killed for memory on a 24 GiB machine).
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    model_dir = pathlib.Path(args.dir) / "models" / args.model
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODELS[args.model]))
    os.environ["MODEL"] = str(model_dir)
    os.environ["UCM_DIR"] = str(pathlib.Path(args.dir) / "readme-store" / args.model)
    import vllm
    from vllm import SamplingParams

    real = vllm.LLM

    class TestModelLLM(real):
        def __init__(self, *a, **kw):
            kw.update(load_format="dummy", skip_tokenizer_init=True, max_model_len=2048)
            super().__init__(*a, **kw)

    vllm.LLM = TestModelLLM
    scope: dict = {"__name__": "__readme__"}
    exec(compile(readme_snippet(), "README.md (vLLM snippet)", "exec"), scope)
    llm = scope["llm"]
    # The INFO line is logged by the engine's process to the shared stderr:
    # `all` reads it back from the log.
    # vLLM prefills a prompt in one step, so a recurrent state exists where
    # a step ends: the first turn ends on the checkpoint grid (the engine's
    # block), and the second turn resumes there.
    block = llm.llm_engine.vllm_config.cache_config.block_size
    first = seq(11, 2 * block)
    sp = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": first}], sp, use_tqdm=False)[0].outputs[0]
    # Under engine multiprocessing the worker runs in a process of its own:
    # its memory tier is its own, and the scheduler sees a block once the
    # worker's disk tier has written it, behind the step. A turn sent at
    # once may miss (a miss, never a wrong hit); a user's next turn comes
    # seconds later, as here.
    time.sleep(3)
    turn2 = first + seq(12, 200)
    llm.generate([{"prompt_token_ids": turn2}], sp, use_tqdm=False)
    import ucm.vllm_connector as vc

    time.sleep(1.5)  # the engine publishes its metrics at most once a second
    llm.generate([{"prompt_token_ids": seq(13, 40)}], sp, use_tqdm=False)
    time.sleep(0.5)
    metrics = vc.metrics_text(os.environ["UCM_DIR"])
    shared = plain_shared_served(llm, sp, lambda: vc.metrics_text(os.environ["UCM_DIR"]), wait=True)
    pathlib.Path(args.out).write_text(
        json.dumps({"metrics": metrics, "turn2": len(turn2), "block": block, "shared": shared["served"]})
    )


#: Two plain prompts share this many tokens and then diverge (issue 35).
SHARED = 1500


def plain_shared_served(llm, sp, metrics, wait: bool) -> dict:
    """Sends two prompts that share `SHARED` tokens and then diverge, cut to
    no grid: `{"served": tokens the second was served, or None without
    `metrics`, "second": its output}`. `metrics()` returns the connector's
    Prometheus text; with `wait`, the engine runs in its own process and
    publishes its metrics at most once a second."""
    shared = seq(21, SHARED)
    llm.generate([{"prompt_token_ids": shared + seq(22, 100)}], sp, use_tqdm=False)
    if wait:
        time.sleep(3)
    before = hit_tokens(metrics()) if metrics else 0
    out = llm.generate([{"prompt_token_ids": shared + seq(23, 120)}], sp, use_tqdm=False)
    out = out[0].outputs[0]
    second = {"tokens": list(out.token_ids)}
    if out.logprobs:
        second["logprobs"] = [{str(t): lp.logprob for t, lp in step.items()} for step in out.logprobs]
    if wait:
        time.sleep(1.5)
        llm.generate([{"prompt_token_ids": seq(24, 40)}], sp, use_tqdm=False)
        time.sleep(0.5)
    return {"served": hit_tokens(metrics()) - before if metrics else None, "second": second}


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", choices=sorted(MODELS), required=True)
    r.add_argument(
        "--mode", choices=["baseline", "ucm", "garble_loads", "garble_states"], required=True
    )
    r.add_argument("--dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--restarted", action="store_true")
    r.add_argument("--vllm-scheduler", action="store_true",
                   help="vLLM's own scheduler instead of ucm.vllm_scheduler.UcmScheduler")
    r.add_argument("--config-marker", default="")
    rd = sub.add_parser("readme")
    rd.add_argument("--model", choices=sorted(MODELS), required=True)
    rd.add_argument("--dir", required=True)
    rd.add_argument("--out", required=True)
    a = sub.add_parser("all")
    a.add_argument("--work", required=True)
    a.add_argument("--models", default="llama,nemotron_h")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args)
        return 0
    if args.cmd == "readme":
        readme(args)
        return 0
    return all_checks(args)


if __name__ == "__main__":
    sys.exit(main())
