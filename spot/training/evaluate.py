"""Numbers the issue asks for about a trained target folder (written into training_report.json):

- held-out masked-token loss (mean CE, nats/token) at mask ratios 0.25 / 0.5 / 1.0 on fixed held-out windows;
- greedy completions of held-out prompts (standard decoding, static rule, block B, 64 new tokens);
- over ~20 held-out prompts of greedy standard decoding: the mean top-1 probability at the committed position
  and the mean number of masked positions whose confidence exceeds 0.9 per step (what drives SPOT's acceptance).
All use the saved fp16 folder loaded back in fp32 through the same code paths as `spot generate`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from spot.checkpoint import Checkpoint
from spot.engines.torch_engine import TorchEngine
from spot.gsm8k import is_correct
from spot.reference.model import SDARModel
from spot.runtime.decode import DecodeContext, generate, state_pass
from spot.runtime.step import CommitRule, Sampling, sample_positions, step_fn
from spot.training.objective import heldout_loss

CONFIDENT = 0.9


class StepRecorder:
    """A standard block decoder that also records, per step, the committed confidence and the number of masked
    positions with confidence > 0.9 (greedy: confidence = top-1 probability)."""

    def __init__(self):
        self.committed_conf: list[float] = []
        self.n_confident: list[int] = []

    def __call__(self, engine, state, block, ctx: DecodeContext):
        step = 0
        while (state == ctx.mask_id).any():
            logits = state_pass(engine, state, step, block, ctx).host_logits()
            masked = np.flatnonzero(state == ctx.mask_id)
            _, conf = sample_positions(logits, masked, ctx.sampling, block, step)
            self.committed_conf.append(float(conf.max()))  # the static rule commits the most confident position
            self.n_confident.append(int((conf > CONFIDENT).sum()))
            state = step_fn(state, logits, ctx.mask_id, ctx.rule, ctx.sampling, block, step)
            step += 1
        ctx.stats.steps += step
        return state


def answer_accuracy(model, tokenizer, problems, max_new_tokens: int = 160) -> dict:
    """Greedy standard decoding of each problem's prompt; right when its '#### N' is the true answer."""
    engine = TorchEngine(model)
    right, first = 0, ""
    for p in problems:
        ids = np.asarray(tokenizer.encode(p.prompt, add_special_tokens=False).ids, dtype=np.int64)
        g = generate(engine, ids, max_new_tokens=max_new_tokens)
        text = tokenizer.decode(g.token_ids)
        right += is_correct(text, p.answer)
        first = first or f"{p.prompt}{text}"
    return {"problems": len(problems), "right": right, "accuracy": right / max(len(problems), 1), "first": first}


def gold_context_prefix(problem, index: int) -> str:
    """The problem's prompt and gold solution up to step `index`'s '<<a op b=': what the model sees when it must
    write that step's result."""
    lines = [s.render() for s in problem.steps]
    step = problem.steps[index]
    key = f"<<{step.a}{step.op}{step.b}="
    line = lines[index]
    return problem.prompt + "".join(f"{l}\n" for l in lines[:index]) + line[:line.index(key) + len(key)]


def operation_accuracy(model, tokenizer, problems) -> dict:
    """Per operation: of the problems' steps, how many results greedy standard decoding writes right ('c>>') after
    the gold context (gold_context_prefix). What the answers' accuracy rests on: 90% of 1-4 step answers right
    needs ~96% of steps right."""
    engine = TorchEngine(model)
    right: dict[str, int] = {op: 0 for op in "+-*/"}
    total: dict[str, int] = {op: 0 for op in "+-*/"}
    for p in problems:
        for i, step in enumerate(p.steps):
            ids = np.asarray(tokenizer.encode(gold_context_prefix(p, i), add_special_tokens=False).ids,
                             dtype=np.int64)
            g = generate(engine, ids, max_new_tokens=4)
            written = tokenizer.decode(list(g.token_ids) + list(g.overflow_ids))
            right[step.op] += written.startswith(f"{step.value}>>")
            total[step.op] += 1
    return {op: {"steps": total[op], "right": right[op], "accuracy": right[op] / max(total[op], 1)} for op in total}


def arithmetic_evaluation(folder: Path, data, log=print, n_decode: int = 20, n_accuracy: int = 300,
                          n_operations: int = 100) -> dict:
    """The arithmetic model's figures from its saved folder (fp16 weights computed in fp32): greedy answers right on
    n_accuracy held-out problems; on n_decode of them the confidence profile of greedy standard decoding (as the
    code model's) and threshold decoding's passes (tau 0.9) against static decoding's."""
    model = SDARModel.from_checkpoint(Checkpoint(folder))
    accuracy = answer_accuracy(model, data.tokenizer, data.heldout[:n_accuracy])
    log(f"greedy answers right on {accuracy['problems']} held-out problems: {accuracy['right']} "
        f"({accuracy['accuracy']:.1%})")
    operations = operation_accuracy(model, data.tokenizer, data.heldout[:n_operations])
    log("results right with gold context, by operation: "
        + ", ".join(f"{op} {v['right']}/{v['steps']} ({v['accuracy']:.1%})" for op, v in operations.items()))
    prompts = [{"text": p.prompt} for p in data.heldout[:n_decode]]
    stats = decode_stats(folder, data.tokenizer, prompts, max_new_tokens=160)
    engine = TorchEngine.from_dir(folder)
    passes = {}
    for rule in (CommitRule(), CommitRule("threshold", 0.9)):
        total, tokens = 0, 0
        for p in prompts:
            ids = np.asarray(data.tokenizer.encode(p["text"], add_special_tokens=False).ids, dtype=np.int64)
            g = generate(engine, ids, max_new_tokens=160, rule=rule)
            total, tokens = total + g.stats.target_passes, tokens + len(g.token_ids)
        passes[rule.kind] = {"target_passes": total, "tokens": tokens, "passes_per_token": total / max(tokens, 1)}
    threshold = {"tau": 0.9, **passes, "passes_reduction": passes["static"]["passes_per_token"]
                 / passes["threshold"]["passes_per_token"]}
    log(f"greedy decoding stats: {stats}; threshold decoding (tau 0.9) against static: {threshold}")
    return {"greedy_answers": {k: accuracy[k] for k in ("problems", "right", "accuracy")},
            "gold_context_results": {"problems": min(n_operations, len(data.heldout)), "by_operation": operations},
            "greedy_decode": stats, "threshold_vs_static": threshold, "sample": accuracy["first"]}


def load_prompts(folder: Path) -> list[dict]:
    path = Path(folder) / "heldout_prompts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def decode_stats(folder: Path, tokenizer, prompts: list[dict], max_new_tokens: int = 64) -> dict:
    if not prompts:
        return {"prompts": 0}
    engine = TorchEngine.from_dir(folder)
    rec = StepRecorder()
    passes, tokens = 0, 0
    for p in prompts:
        ids = np.asarray(tokenizer.encode(p["text"], add_special_tokens=False).ids, dtype=np.int64)
        g = generate(engine, ids, max_new_tokens=max_new_tokens, rule=CommitRule(), sampling=Sampling(),
                     block_decoder=rec)
        passes += g.stats.target_passes
        tokens += len(g.token_ids)
    return {"prompts": len(prompts), "steps": len(rec.committed_conf),
            "mean_committed_top1_prob": float(np.mean(rec.committed_conf)),
            "mean_masked_positions_conf_gt_0.9_per_step": float(np.mean(rec.n_confident)),
            "share_steps_with_2plus_confident": float(np.mean(np.asarray(rec.n_confident) >= 2)),
            "generated_tokens": tokens, "target_passes": passes}


def completions(folder: Path, tokenizer, prompts: list[dict], max_new_tokens: int = 64) -> list[dict]:
    engine = TorchEngine.from_dir(folder)
    out = []
    for p in prompts:
        ids = np.asarray(tokenizer.encode(p["text"], add_special_tokens=False).ids, dtype=np.int64)
        g = generate(engine, ids, max_new_tokens=max_new_tokens)
        out.append({"prompt_id": p["id"], "file": p["file"], "prompt_tail": p["text"][-300:],
                    "completion": tokenizer.decode(g.token_ids), "stopped": g.stopped})
    return out


def evaluate_folder(folder: Path, data, settings, log=print, n_windows: int = 32, n_decode: int = 20) -> dict:
    """The report section; data is the run's training data (its tokenizer and held-out batches)."""
    folder = Path(folder)
    model = SDARModel.from_checkpoint(Checkpoint(folder))  # the shipped fp16 weights, computed in fp32
    batches = data.heldout_batches(n_windows)
    with torch.no_grad():
        losses = {str(r): round(heldout_loss(model, batches, r), 4) for r in (0.25, 0.5, 1.0)}
    log(f"held-out masked CE (nats/token) by mask ratio: {losses}")
    if settings.corpus == "arithmetic":
        return {"heldout_masked_ce": losses, "eval_problems": n_windows,
                **arithmetic_evaluation(folder, data, log, n_decode)}
    prep = data
    log(f"held-out masked CE (nats/token) by mask ratio: {losses}")
    prompts = load_prompts(folder)
    # short prompts first: the model saw windows of settings.seq_len tokens
    chosen = [p for p in prompts if p["n_tokens"] + 64 <= settings.seq_len] or prompts
    stats = decode_stats(folder, prep.tokenizer, chosen[:n_decode])
    log(f"greedy decoding stats: {stats}")
    samples = completions(folder, prep.tokenizer, chosen[:3])
    for s in samples:
        log(f"--- completion of prompt {s['prompt_id']} ({s['file']}):\n{s['prompt_tail'][-200:]}"
            f"<<<COMPLETION>>>{s['completion']}")
    long_stats = decode_stats(folder, prep.tokenizer, [p for p in prompts if p["n_tokens"] > 320][:5])
    log(f"greedy decoding stats on 5 long prompts (>320 tokens): {long_stats}")
    return {"heldout_masked_ce": losses, "eval_windows": n_windows, "greedy_decode": stats,
            "greedy_decode_long_prompts": long_stats, "samples": samples}
