"""Train an embedded SDAR target (Qwen3 shape, block diffusion): the code model on the stdlib's Python sources, the
arithmetic model on generated GSM8K-format problems (RECIPES). The objective is spot.training.objective's.

Everything is seeded (torch.manual_seed for init and masks, a numpy Generator for windows), so a run is
deterministic given its seed on a given torch build and thread count (torch.set_num_threads(2)).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tokenizers import Tokenizer
import torch

from spot.assets import MODELS, model_folder_path
from spot.checkpoint import Checkpoint
from spot.config import TRAINING_CORPUS_KEY, ModelConfig
from spot.descriptors import parse_json
from spot.errors import SpotError
from spot.descriptors import read_json, sha256_file
from spot.files import atomic_output, folder_bytes, present, write_text_atomic
from spot.owned import recorded_file_matches, refuse_unproven
from spot.replace import building, output_folder, publish_folder, swap_in_folder
from spot.reference.model import SDARModel
from spot.training import bpe, corpus
from spot.training.arithmetic_corpus import ArithmeticData, train_tokenizer
from spot.training.evaluate import answer_accuracy, evaluate_folder, operation_accuracy
from spot.training.objective import diffusion_bias, diffusion_loss, heldout_loss



@dataclass(frozen=True)
class TrainSettings:
    """Model shape, data and optimisation of one run. The defaults are the shipped code model (CODE);
    ARITHMETIC is the arithmetic model's recipe."""

    corpus: str = "code"          # "code": windows of the stdlib stream; "arithmetic": one generated problem each
    vocab_size: int = 2048
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 2048
    block_size: int = 32
    seq_len: int = 256            # tokens of x_0 per window (8 blocks): attention over 2L dominates the cost
    batch_size: int = 8           # code: windows per batch
    tokens_per_batch: int = 0     # arithmetic: padded tokens per batch (problems of one padded length each)
    train_prompt: bool = False    # arithmetic: the question is masked and scored too (else the solution alone)
    bf16: bool = False            # matmuls under torch.autocast(bfloat16), fp32 weights: ~2x on CPUs with AVX512-BF16
    qk_gain_init: float = 1.0     # initial q_norm / k_norm weights (below)
    elbo_weighting: bool = True   # masked CE weighted 1/t (MDLM's bound); False: the plain mean over masked tokens
    practice_share: float = 0.0   # arithmetic: share of batches made of practice lines (arithmetic_corpus)
    result_weight: float = 1.0    # arithmetic: loss weight of result digits (plain mean only)
    steps: int = 2800             # ~80 minutes on 2 cores (~1250 tokens/s)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"      # "cosine" to lr*min_lr_ratio; "wsd": constant, then a linear decay over decay_steps
    decay_steps: int = 0          # wsd: the last steps, where lr falls linearly to lr*min_lr_ratio
    warmup_steps: int = 60
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 2
    log_every: int = 10
    eval_every: int = 100
    ckpt_every: int = 50
    accuracy_every: int = 0       # arithmetic: greedy answers of held-out problems every N steps (0: never)
    accuracy_problems: int = 24
    operation_problems: int = 0   # arithmetic: ... and each operation's result with gold context on this many
    warm_start: "TrainSettings | None" = None   # a recipe whose trained weights and tokenizer this run starts from

    @property
    def mask_eps(self) -> float:
        return 1.0 / self.block_size

    @classmethod
    def from_dict(cls, d: dict) -> "TrainSettings":
        """Settings as a report or checkpoint recorded them; a field added since takes its default, which is the
        behaviour of the version that wrote them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpotError(f"training settings name unknown fields {unknown}", "written by a newer spot?")
        d = dict(d)
        if d.get("warm_start") is not None:
            d["warm_start"] = cls.from_dict(d["warm_start"])
        return cls(**d)


CODE = TrainSettings()
# the arithmetic model in two stages: the word problems alone (the model shipped before 2026-12-07: format, copying
# and the multiplication table), then practice of every fact with result digits weighted, from those weights
ARITHMETIC_WORDS = TrainSettings(
    corpus="arithmetic", vocab_size=768, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=512, block_size=32,
    tokens_per_batch=2048, steps=6400, lr=2e-3, warmup_steps=100, log_every=50, eval_every=250, ckpt_every=100,
    accuracy_every=500, accuracy_problems=24, bf16=True, qk_gain_init=1.8, elbo_weighting=False)
ARITHMETIC = replace(
    ARITHMETIC_WORDS, practice_share=0.5, result_weight=3.0, steps=12000, lr=1e-3, warmup_steps=50,
    schedule="wsd", decay_steps=1000, accuracy_every=500, accuracy_problems=24, operation_problems=100, threads=1,
    warm_start=ARITHMETIC_WORDS)
RECIPES = {"code": CODE, "arithmetic": ARITHMETIC}


def model_config(s: TrainSettings) -> ModelConfig:
    return ModelConfig(vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                       num_hidden_layers=s.num_hidden_layers, num_attention_heads=s.num_attention_heads,
                       num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim,
                       max_position_embeddings=s.max_position_embeddings, block_size=s.block_size,
                       mask_token_id=s.vocab_size - 1, stop_ids=(bpe.EOS_ID,), torch_dtype="float16")


def init_model(cfg: ModelConfig, seed: int, qk_gain: float = 1.0) -> SDARModel:
    """Qwen-style init: matrices N(0, 0.02), residual outputs scaled by 1/sqrt(2 layers), norms 1 — but q_norm and
    k_norm at qk_gain. Why: with q and k RMS-normalised, an attention logit is at most g_q g_k sqrt(head_dim); at
    head_dim 32 and gains 1 that is 5.7, too flat to single out one token of a hundred, and a small model left there
    never learns to copy from its context (the arithmetic target ignored its question for 2,000 steps). Gains of
    1.8 allow logits up to ~18, log2(L^2) of a 256-token window (Henry et al. 2020, "Query-Key Normalization")."""
    torch.manual_seed(seed)
    model = SDARModel(cfg)
    out_scale = 1.0 / math.sqrt(2 * cfg.num_hidden_layers)
    with torch.no_grad():
        for name, p in model.hf_state().items():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.fill_(qk_gain)
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                std = 0.02 * (out_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
                p.normal_(0.0, std)
    return model


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup, then cosine from lr down to lr*min_lr_ratio at the last step; or (wsd: warmup, stable, decay)
    constant lr until the last decay_steps, which fall linearly to lr*min_lr_ratio."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    if s.schedule == "wsd":
        into_decay = step - (s.steps - s.decay_steps)
        if into_decay < 0:
            return s.lr
        return s.lr * (1 - (1 - s.min_lr_ratio) * min(1.0, (into_decay + 1) / max(1, s.decay_steps)))
    frac = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def can_resume(recorded: dict, s: TrainSettings, step: int) -> list[str]:
    """The settings that keep a checkpoint written with `recorded` settings at `step` from resuming as `s` (empty: it
    resumes). A wsd run may change its step count while the checkpoint is still in the stable phase of both
    schedules (the learning rate so far is the same): a run is extended, or ended early, across sessions."""
    try:
        theirs = asdict(TrainSettings.from_dict(recorded))
    except (SpotError, TypeError):
        return ["(unreadable settings)"]
    ours = asdict(s)
    changed = sorted(k for k, v in ours.items() if theirs.get(k) != v)
    if changed == ["steps"] and s.schedule == "wsd" and step <= min(s.steps, theirs["steps"]) - s.decay_steps:
        return []
    return changed


def make_optimizer(model: SDARModel, s: TrainSettings) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95), eps=1e-8)


# -- checkpoints -----------------------------------------------------------------------------------------------
# One safetensors file: the model's and optimizer's tensors and the noise generator's state as tensors, everything
# else (step, history, settings, the numpy generator's state, the optimizer's param groups) as JSON in its metadata.
# Never a pickle: a pickled checkpoint planted in a work folder ran its code when the run resumed.
CHECKPOINT_NAME = "ckpt.safetensors"
CHECKPOINT_FORMAT = "spot-train-checkpoint"
LEGACY_CHECKPOINT = "ckpt.pt"       # written by earlier versions (a pickle): never read


def save_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
                    facts: dict) -> None:
    """The run's state at `path`, whole or not at all (a temporary file, then a rename)."""
    # safetensors: optional extra (spot[export])
    from safetensors.torch import save_file
    tensors = {f"model.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state = opt.state_dict()
    plain: dict = {}        # the optimizer state's non-tensor values
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"opt.{index}.{key}"] = value.detach().clone().contiguous()
            else:
                plain.setdefault(str(index), {})[key] = value
    tensors["gen_state"] = gen.get_state()
    meta = {"format": CHECKPOINT_FORMAT, "format_version": 1, **facts, "opt_param_groups": state["param_groups"],
            "opt_plain_state": plain}
    with atomic_output(path, suffix=".safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"spot": json.dumps(meta)})


def read_checkpoint(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the JSON facts, the tensors) of the checkpoint at `path`; SpotError naming the file when it is not one."""
    # safetensors: optional extra (spot[export])
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open
    remedy = f"delete {path} to start the run over"
    try:
        with safe_open(str(path), "pt") as f:
            meta = parse_json((f.metadata() or {}).get("spot", "null"), f"{path}'s metadata", remedy)
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise SpotError(f"{path} is not a readable training checkpoint ({e})", remedy) from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT or meta.get("format_version") != 1:
        raise SpotError(f"{path} is not a {CHECKPOINT_FORMAT} file of this version", remedy)
    return meta, tensors


def restore_checkpoint(meta: dict, tensors: dict[str, torch.Tensor], model: torch.nn.Module,
                       opt: torch.optim.Optimizer, gen: torch.Generator) -> None:
    """Model, optimizer and noise generator as read_checkpoint() read them."""
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict = {}
    for name, value in tensors.items():
        if name.startswith("opt."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for index, entries in meta["opt_plain_state"].items():
        state.setdefault(int(index), {}).update(entries)
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in meta["opt_param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    gen.set_state(tensors["gen_state"])


# -- the run ---------------------------------------------------------------------------------------------------
def build_data(s: TrainSettings, corpus_root: Path | None, max_files: int | None, tokenizer=None):
    """The run's data source: corpus.CodeData or arithmetic_corpus.ArithmeticData (same methods). tokenizer: the
    one a resumed run started with (None: train one)."""
    if s.corpus == "code":
        prep = corpus.prepare_corpus(s.vocab_size, corpus_root, max_files, tokenizer)
        return corpus.CodeData(prep, corpus_root, s.batch_size, s.seq_len, s.seed)
    if s.corpus == "arithmetic":
        tok = tokenizer or train_tokenizer(s.vocab_size, s.seed)
        return ArithmeticData(tok, s.block_size, s.tokens_per_batch, s.seed, with_prompt=s.train_prompt,
                              practice_share=s.practice_share, result_weight=s.result_weight)
    raise SpotError(f"unknown corpus {s.corpus!r}, expected one of {sorted(RECIPES)}")


def _log(line: str, log_file: Path | None, progress: bool) -> None:
    if progress:
        print(line, flush=True)
    if log_file is not None:
        with open(log_file, "a") as fh:
            fh.write(line + "\n")


def train_target(out_dir: str | Path, steps: int | None = None, *, seed: int = 0, minutes: float | None = None,
                 progress: bool = True, settings: TrainSettings | None = None, work_dir: str | Path | None = None,
                 corpus_root: str | Path | None = None, max_files: int | None = None, resume: bool = True,
                 n_prompts: int = 300, final_eval: bool = True, init_from: str | Path | None = None) -> dict:
    """Train a target and write the Hugging Face SDAR folder to out_dir; returns the report dict.

    settings: the recipe (CODE by default; ARITHMETIC for the arithmetic model).
    minutes: a wall-clock cap (stops early, still writes the folder, and says so in the report).
    work_dir: where checkpoints and train.log go (default out_dir/../.train_<name>); a run resumes from its
    checkpoint when one exists and resume is true.
    init_from: for a recipe with a warm start, a folder trained by that warm start's recipe (its training_report.json
    says so) to start from; None trains the warm start first (in work_dir/warm-start, resumable too)."""
    base = settings or TrainSettings()
    s = replace(base, steps=base.steps if steps is None else steps, seed=seed)
    out_dir = Path(out_dir)
    if present(checked := output_folder(out_dir, "--out")):
        check_target_replaceable(checked)          # before the training, not after it
    work = Path(work_dir) if work_dir is not None else out_dir.parent / f".train_{out_dir.name}"
    work.mkdir(parents=True, exist_ok=True)
    log_file = work / "train.log"
    torch.set_num_threads(s.threads)
    t_start = time.time()
    if s.warm_start is None and init_from is not None:
        raise SpotError(f"the {s.corpus} recipe starts from random weights, got a folder to start from ({init_from})",
                        "leave out --init-from")
    start = None
    if s.warm_start is not None:
        start = Path(init_from) if init_from is not None else _warm_start_folder(
            s.warm_start, work, progress=progress, corpus_root=corpus_root, max_files=max_files, minutes=minutes)
        check_warm_start(start, s.warm_start)
        _log(f"warm start: the weights and tokenizer of {start}", log_file, progress)

    ckpt_path = work / CHECKPOINT_NAME
    if resume and (work / LEGACY_CHECKPOINT).exists() and not ckpt_path.exists():
        _log(f"note: {work / LEGACY_CHECKPOINT} is a pickled checkpoint of an earlier version, which this one never "
             "reads (unpickling can run code): training starts over", log_file, progress)
    ck, ck_tensors = read_checkpoint(ckpt_path) if resume and ckpt_path.exists() else (None, None)
    changed = can_resume(ck.get("settings") or {}, s, int(ck.get("step", 0))) if ck is not None else []
    if changed:
        _log(f"note: {ckpt_path} was written with other settings ({', '.join(changed)}): training starts over "
             "(keep the settings, or use another --work-dir, to resume it)", log_file, progress)
        ck = None
    # a resumed run keeps the tokenizer it started with (one trained again from changed code would renumber tokens)
    tokenizer_path = work / "tokenizer.json"
    started_with = Tokenizer.from_file(str(tokenizer_path)) if ck is not None and tokenizer_path.is_file() else None
    if started_with is None and start is not None:
        started_with = Tokenizer.from_file(str(start / "tokenizer.json"))
    data = build_data(s, Path(corpus_root) if corpus_root else None, max_files, started_with)
    data.tokenizer.save(str(tokenizer_path))
    cfg = model_config(s)
    _log(f"{data.describe()}; tokenizer {time.time() - t_start:.1f}s", log_file, progress)

    model = init_model(cfg, s.seed, s.qk_gain_init)
    if start is not None and ck is None:
        model.load_state_dict(SDARModel.from_checkpoint(Checkpoint(start)).state_dict())
    model.train()
    opt = make_optimizer(model, s)
    n_params = sum(p.numel() for p in model.parameters())
    _log(f"model: {n_params} parameters ({n_params / 1e6:.2f}M), {s.steps} steps", log_file, progress)

    biases: dict[int, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(s.seed + 1)
    val_batches = data.heldout_batches(16)
    history: dict = {"step": [], "train_loss": [], "train_ce": [], "val": [], "tokens": []}
    step0, trained_seconds, tokens_seen = 0, 0.0, 0
    if ck is not None:
        restore_checkpoint(ck, ck_tensors, model, opt, gen)
        data.load_state(ck["data"])
        step0, history, trained_seconds = ck["step"], ck["history"], ck["seconds"]
        tokens_seen = ck["tokens_seen"]
        _log(f"resumed from {ckpt_path} at step {step0}", log_file, progress)

    stopped_early = False
    t_loop = time.time() - trained_seconds
    t_resumed = time.time()           # this process's own pace gives the ETA (trained_seconds came before it)
    window_loss, window_ce, window_t, window_tokens = 0.0, 0.0, time.time(), 0
    step = step0
    for step in range(step0, s.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, s)
        batch = data.train_batch()
        x0 = torch.from_numpy(batch.x0)
        length = x0.shape[1]
        if length not in biases:
            biases[length] = diffusion_bias(length, s.block_size)
        eligible = None if batch.eligible is None else torch.from_numpy(batch.eligible)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s.bf16):
            loss, ce = diffusion_loss(model, x0, biases[length], gen, s.mask_eps, eligible=eligible,
                                      elbo=s.elbo_weighting,
                                      weight=None if batch.weight is None else torch.from_numpy(batch.weight))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        window_loss += float(loss.detach())
        window_ce += float(ce.detach())
        window_tokens += x0.numel()
        tokens_seen += x0.numel()
        done = step + 1
        if done % s.log_every == 0 or done == s.steps:
            n = done % s.log_every or s.log_every
            elapsed = time.time() - t_loop
            tok_s = window_tokens / max(time.time() - window_t, 1e-9)
            eta = (time.time() - t_resumed) / (done - step0) * (s.steps - done) if done > step0 else 0.0
            history["step"].append(done)
            history["train_loss"].append(window_loss / n)
            history["train_ce"].append(window_ce / n)
            history["tokens"].append(tokens_seen)
            _log(f"step {done}/{s.steps} loss {window_loss / n:.4f} masked-ce {window_ce / n:.4f} "
                 f"lr {lr_at(step, s):.2e} {tok_s:.0f} tok/s elapsed {elapsed / 60:.1f}m eta {eta / 60:.1f}m",
                 log_file, progress)
            window_loss, window_ce, window_t, window_tokens = 0.0, 0.0, time.time(), 0
        if done % s.eval_every == 0 or done == s.steps:
            val = heldout_loss(model, val_batches, 0.5)
            history["val"].append([done, val])
            _log(f"step {done}: held-out masked CE at ratio 0.5 = {val:.4f}", log_file, progress)
        if s.accuracy_every and (done % s.accuracy_every == 0 or done == s.steps):
            acc = answer_accuracy(model, data.tokenizer, data.heldout[:s.accuracy_problems])
            model.train()
            history.setdefault("accuracy", []).append([done, acc["accuracy"]])
            _log(f"step {done}: greedy answers right on {acc['problems']} held-out problems: {acc['right']} "
                 f"({acc['accuracy']:.0%}); the first one:\n{acc['first']}", log_file, progress)
            if s.operation_problems:
                ops = operation_accuracy(model, data.tokenizer, data.heldout[:s.operation_problems])
                model.train()
                history.setdefault("operation_accuracy", []).append([done, ops])
                _log(f"step {done}: results right with gold context, by operation: "
                     + ", ".join(f"{op} {v['right']}/{v['steps']} ({v['accuracy']:.1%})" for op, v in ops.items()),
                     log_file, progress)
        if done % s.ckpt_every == 0 or done == s.steps:
            save_checkpoint(ckpt_path, model, opt, gen, {"data": data.state(), "step": done, "history": history,
                                                         "tokens_seen": tokens_seen, "seconds": time.time() - t_loop,
                                                         "settings": asdict(s)})
        if minutes is not None and time.time() - t_start > minutes * 60 and done < s.steps:
            stopped_early = True
            _log(f"stopping at step {done}: the {minutes} minute cap is reached", log_file, progress)
            break
    steps_done = step + 1 if s.steps > step0 else step0
    train_seconds = time.time() - t_loop

    model.eval()
    # built beside out_dir and swapped in when complete: an interrupt during the minutes of final evaluation left
    # the new weights beside the previous training_report.json. A link's target is what is replaced (the link stays)
    out_dir = output_folder(out_dir, "--out")
    with building(out_dir) as partial:
        write_folder(model, data, partial, n_prompts=n_prompts, seed=s.seed)
        report = {
            "parameters": n_params, "settings": asdict(s), "steps_done": steps_done, "stopped_early": stopped_early,
            "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
            "warm_start": None if start is None else _folder_identity(start),
            "torch": torch.__version__, "threads": s.threads, "tokens_seen": tokens_seen,
            "corpus": data.report(),
            "tokenizer": {"vocab_size": s.vocab_size, "eos": [bpe.EOS_TOKEN, bpe.EOS_ID],
                          "mask": [bpe.MASK_TOKEN, s.vocab_size - 1],
                          "sha1": hashlib.sha1((partial / "tokenizer.json").read_bytes()).hexdigest()},
            "history": history,
        }
        if final_eval:
            report["evaluation"] = evaluate_folder(partial, data, s, log=lambda m: _log(m, log_file, progress))
        # what this run wrote, by hash: a later run replaces these files only while they are unchanged
        report["files"] = {p.name: sha256_file(p) for p in sorted(partial.iterdir()) if p.name != REPORT_NAME}
        write_text_atomic(partial / REPORT_NAME, json.dumps(report, indent=2))
        publish_target_folder(partial, out_dir)
    _log(f"wrote {out_dir} ({folder_bytes(out_dir) / 1e6:.1f} MB)", log_file, progress)
    return report


def _warm_start_folder(settings: TrainSettings, work: Path, **kw) -> Path:
    """The warm start's trained folder in work/warm-start: trained (or resumed) until it is complete."""
    folder = work / "warm-start"
    done = folder / "training_report.json"
    if done.is_file():
        report = json.loads(done.read_text())
        if report.get("steps_done") == settings.steps and report.get("settings") == asdict(settings):
            return folder
    report = train_target(folder, settings=settings, work_dir=work / "warm-start-work", final_eval=False,
                          seed=settings.seed, **kw)
    if report["stopped_early"]:
        raise SpotError(f"the warm start stopped at step {report['steps_done']} of {settings.steps} (the time cap)",
                        "run the same command again: it resumes the warm start, then trains this stage")
    return folder


def check_warm_start(folder: Path, settings: TrainSettings) -> None:
    """SpotError unless `folder` is a model trained to completion by the recipe `settings`."""
    path = Path(folder) / "training_report.json"
    try:
        report = json.loads(path.read_text())
        theirs = TrainSettings.from_dict(report["settings"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpotError(f"{path} is not a readable training report ({e})",
                        "give a folder written by spot train-target") from None
    if theirs != settings or report.get("steps_done") != settings.steps:
        diff = sorted(k for k, v in asdict(settings).items() if asdict(theirs).get(k) != v)
        raise SpotError(f"{folder} was not trained by this recipe's warm start (settings that differ: "
                        f"{diff or 'none'}; steps done {report.get('steps_done')}, expected {settings.steps})",
                        "leave out --init-from to train the warm start first")


def _folder_identity(folder: Path) -> dict:
    return {"folder": str(folder), "model_sha1": hashlib.sha1((folder / "model.safetensors").read_bytes()).hexdigest()}


def publish_target_folder(new: Path, folder: Path) -> None:
    """Put the finished folder `new` at `folder`; what an existing `folder` holds that `new` lacks (a drafter trained
    for the model, an export in a subfolder, the user's files) is carried over — hard links where the file system
    allows — so the swap deletes only the files this command wrote before (check_target_replaceable)."""
    if not present(folder):
        publish_folder(new, folder, appeared)
        return
    check_target_replaceable(folder, sorted(p.name for p in new.iterdir()))     # again: it may have changed
    for f in folder.iterdir():
        if (new / f.name).exists() or (new / f.name).is_symlink():
            continue
        if f.is_dir() and not f.is_symlink():
            shutil.copytree(f, new / f.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(f, new / f.name)
    swap_in_folder(new, folder)


def appeared(folder: Path) -> None:
    """A folder put at --out while the training ran: not replaced (its files were never checked)."""
    raise SpotError(f"{folder} appeared while the training ran, and is left as it is",
                    "move it away and run again (the run resumes from its checkpoint), or choose another --out")


def check_target_replaceable(folder: Path, replaced: list[str] | tuple[str, ...] = ()) -> None:
    """SpotError unless every file of `folder` that a new training replaces (`replaced`, default TARGET_FILES) is one
    spot wrote: listed with its sha256 in the folder's training_report.json, or shipped in the package (an embedded
    model's folder, trained before reports listed their files). A checkpoint's config.json or a file the user edited
    is not replaced: --out an SDAR checkpoint by mistake lost its config.json and weights."""
    if not folder.is_dir():
        raise SpotError(f"--out {folder} is a file, expected a folder", "choose another --out")
    if Path(os.path.realpath(folder)) in {Path(os.path.realpath(model_folder_path(m))) for m in MODELS}:
        return
    try:
        report = read_json(folder / REPORT_NAME, "")
    except (OSError, SpotError):
        report = None
    files = report.get("files") if isinstance(report, dict) else None
    files = files if isinstance(files, dict) else {}
    replaced = [name for name in replaced or TARGET_FILES if present(folder / name)]
    unproven = [name for name in replaced
                if name != REPORT_NAME and not recorded_file_matches(folder / name, files.get(name))]
    if REPORT_NAME in replaced and not files:
        unproven.append(REPORT_NAME)
    refuse_unproven(folder, "--out", unproven,
                    f"spot train-target replaces only the files of an earlier training there (its {REPORT_NAME} "
                    f"lists them): move those out of {folder}, or choose another --out")


def _link_or_copy(src, dst) -> None:
    if Path(src).is_symlink():
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


REPORT_NAME = "training_report.json"
# what write_folder and train_target write into the output folder (everything else there is carried over)
TARGET_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "heldout_prompts.jsonl", REPORT_NAME)


def write_folder(model: SDARModel, data, out_dir: Path, n_prompts: int, seed: int) -> None:
    """config.json + model.safetensors (fp16) + tokenizer files + heldout_prompts.jsonl."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, dtype="F16", extra_config={"bos_token_id": None, "pad_token_id": bpe.EOS_ID,
                                                              TRAINING_CORPUS_KEY: data.corpus})
    bpe.save_tokenizer(data.tokenizer, out_dir)
    prompts = data.prompt_records(n_prompts, seed, max_tokens=min(448, model.cfg.max_position_embeddings - 64))
    write_text_atomic(out_dir / "heldout_prompts.jsonl", "".join(json.dumps(p) + "\n" for p in prompts))
