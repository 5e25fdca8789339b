"""Host-loop overhead per verify pass, C++ host vs Python runtime, same folder, prompts and options, one run.

Per SPOT round the host builds the stale view and the draft tree (drafter calls included) and walks the verified
tree; the target pass itself is excluded. Both runtimes time exactly these segments (Python: DecodeStats.verify
draft_ms / walk_ms; C++: spot_stats.draft_ms / walk_ms) and decode the same cases, whose outputs are checked equal.

    python cpp/bench_host.py --model /tmp/emb_onnx --drafter spot/assets/embedded --prompts 4

Needs cpp/build/spot_cli (cmake --build cpp/build). Prints a table and, with --out, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from make_golden import COMPARED, case_options, embedded_prompts, random_prompts, run_case  # noqa: E402


def request_line(c: dict) -> str:
    return (f"--decoder {c['decoder']} --temperature {c['temperature']!r} --seed {c['seed']} --tau {c['tau']!r} "
            f"--mode {c['mode']} --max-new-tokens {c['max_new_tokens']} --budget {c['budget']} "
            f"--depth {c['depth']} --prompt-ids {','.join(map(str, c['prompt_ids']))}")


class CppHost:
    """A persistent `spot_cli batch` process: one request line in, one JSON line out (so runs interleave)."""

    def __init__(self, cli: Path, model: Path, drafter: Path | None, threads: int | None):
        args = [str(cli), "batch", "--model", str(model)] + (["--drafter", str(drafter)] if drafter else [])
        if threads:
            args += ["--threads", str(threads)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def run(self, case: dict) -> dict:
        self.proc.stdin.write(request_line(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("spot_cli batch ended early")
        out = json.loads(line)
        if "error" in out:
            raise SystemExit(f"spot_cli: {out['error']}")
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def fastest(runs: list[dict], host) -> dict:
    """The run with the least host time: on a shared machine the minimum is the least disturbed measurement."""
    return min(runs, key=host)


def summarise(rows: list[tuple[dict, dict, dict]]) -> dict:
    """rows of (case, python expected+host, c++ result) of one group -> per-verify host milliseconds."""
    verify = sum(p["passes"]["verify"] for _, p, _ in rows)
    py_host = sum(p["host"]["draft_ms"] + p["host"]["walk_ms"] for _, p, _ in rows)
    cpp_host = sum(r["draft_ms"] + r["walk_ms"] for _, _, r in rows)
    py_target = sum(p["host"]["target_ms"] for _, p, _ in rows)
    cpp_target = sum(r["target_ms"] for _, _, r in rows)
    identical = sum(all(p[k] == r[k] for k in COMPARED) for _, p, r in rows)
    per = (lambda ms: ms / verify) if verify else (lambda ms: float("nan"))
    return {"cases": len(rows), "identical": identical, "verify_passes": verify,
            "python_host_ms_per_verify": per(py_host), "cpp_host_ms_per_verify": per(cpp_host),
            "ratio_python_over_cpp": py_host / cpp_host if cpp_host > 0 else float("nan"),
            "python_target_ms_per_verify": per(py_target), "cpp_target_ms_per_verify": per(cpp_target)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--drafter", type=Path, default=None)
    ap.add_argument("--cli", type=Path, default=ROOT / "cpp" / "build" / "spot_cli")
    ap.add_argument("--decoders", default="spot,spot-sets,tree,chain")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-source", choices=("embedded", "random"), default="embedded")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="target intra-op threads, both runtimes")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the least disturbed one counts")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from spot.engines.ort_engine import OrtEngine
    from spot.runtime.drafter import load_drafter

    engine = OrtEngine(args.model, threads=args.threads)
    drafter = load_drafter(args.drafter) if args.drafter else None
    if args.prompt_source == "embedded":
        from spot.tokenizer import load_tokenizer
        prompts = embedded_prompts(load_tokenizer(ROOT / "spot" / "assets" / "embedded"), args.prompts)
    else:
        prompts = random_prompts(args.prompts, engine.config.vocab_size, engine.config.mask_token_id)
    decoders = [d for d in args.decoders.split(",") if drafter is not None or d not in ("spot", "spot-sets")]
    cases = []
    for t in (float(x) for x in args.temperatures.split(",")):
        for d in decoders:
            for i, p in enumerate(prompts):
                cases.append({"prompt_ids": p, **case_options(d, t, i + 1 if t > 0 else 0, args.max_new_tokens,
                                                              args.budget, args.depth)})
    cpp = CppHost(args.cli, args.model, args.drafter, args.threads)
    run_case(engine, drafter, cases[0]["prompt_ids"], cases[0])                    # warm-up, both sides
    cpp.run(cases[0])
    # Python and C++ alternate case by case, so that both see the same load on a shared machine
    py_runs: list[list[dict]] = [[] for _ in cases]
    cpp_runs: list[list[dict]] = [[] for _ in cases]
    for _ in range(args.repeat):
        for i, c in enumerate(cases):
            py_runs[i].append(run_case(engine, drafter, c["prompt_ids"], c))
            cpp_runs[i].append(cpp.run(c))
    cpp.close()
    expected = [fastest(runs, lambda p: p["host"]["draft_ms"] + p["host"]["walk_ms"]) for runs in py_runs]
    results = [fastest(runs, lambda r: r["draft_ms"] + r["walk_ms"]) for runs in cpp_runs]
    groups: dict[tuple[str, float], list] = {}
    for c, p, r in zip(cases, expected, results):
        groups.setdefault((c["decoder"], c["temperature"]), []).append((c, p, r))
    report = {"model": str(args.model), "budget": args.budget, "depth": args.depth, "repeat": args.repeat,
              "max_new_tokens": args.max_new_tokens, "prompts": len(prompts),
              "groups": [{"decoder": d, "temperature": t, **summarise(rows)} for (d, t), rows in groups.items()],
              "all": summarise([row for rows in groups.values() for row in rows])}
    print(f"{'decoder':10} {'T':>4} {'cases':>5} {'same':>5} {'verify':>6} {'py ms/v':>8} {'c++ ms/v':>8} "
          f"{'ratio':>6} {'target ms/v py/c++':>18}")
    for g in report["groups"] + [{"decoder": "all", "temperature": float("nan"), **report["all"]}]:
        print(f"{g['decoder']:10} {g['temperature']:4.1f} {g['cases']:5d} {g['identical']:5d} {g['verify_passes']:6d} "
              f"{g['python_host_ms_per_verify']:8.3f} {g['cpp_host_ms_per_verify']:8.3f} "
              f"{g['ratio_python_over_cpp']:6.1f} {g['python_target_ms_per_verify']:8.3f}/"
              f"{g['cpp_target_ms_per_verify']:.3f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["all"]["identical"] == report["all"]["cases"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
