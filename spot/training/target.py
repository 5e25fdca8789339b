"""Train an embedded SDAR target (Qwen3 shape, block diffusion): the code model on the stdlib's Python sources, the
arithmetic model on generated GSM8K-format problems (RECIPES). The objective is spot.training.objective's.

Everything is seeded (torch.manual_seed for init and masks, a numpy Generator for windows), so a run is
deterministic given its seed on a given torch build and thread count (torch.set_num_threads(2)).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from spot.config import TRAINING_CORPUS_KEY, ModelConfig
from spot.descriptors import parse_json
from spot.errors import SpotError
from spot.files import (atomic_output, beside, folder_bytes, remove_stale_beside, remove_tree, swap_in_folder,
                        write_text_atomic)
from spot.reference.model import SDARModel
from spot.training import bpe, corpus
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
    steps: int = 2800             # ~80 minutes on 2 cores (~1250 tokens/s)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
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

    @property
    def mask_eps(self) -> float:
        return 1.0 / self.block_size


CODE = TrainSettings()
ARITHMETIC = TrainSettings(
    corpus="arithmetic", vocab_size=768, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=512, block_size=32,
    tokens_per_batch=2048, steps=6400, lr=2e-3, warmup_steps=100, log_every=50, eval_every=250, ckpt_every=100,
    accuracy_every=500, accuracy_problems=24, bf16=True, qk_gain_init=1.8, elbo_weighting=False)
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
    """Linear warmup, then cosine from lr down to lr*min_lr_ratio at the last step."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    frac = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


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
        from spot.training.arithmetic_corpus import ArithmeticData, train_tokenizer
        tok = tokenizer or train_tokenizer(s.vocab_size, s.seed)
        return ArithmeticData(tok, s.block_size, s.tokens_per_batch, s.seed, with_prompt=s.train_prompt)
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
                 n_prompts: int = 300, final_eval: bool = True) -> dict:
    """Train a target and write the Hugging Face SDAR folder to out_dir; returns the report dict.

    settings: the recipe (CODE by default; ARITHMETIC for the arithmetic model).
    minutes: a wall-clock cap (stops early, still writes the folder, and says so in the report).
    work_dir: where checkpoints and train.log go (default out_dir/../.train_<name>); a run resumes from its
    checkpoint when one exists and resume is true."""
    base = settings or TrainSettings()
    s = replace(base, steps=base.steps if steps is None else steps, seed=seed)
    out_dir = Path(out_dir)
    work = Path(work_dir) if work_dir is not None else out_dir.parent / f".train_{out_dir.name}"
    work.mkdir(parents=True, exist_ok=True)
    log_file = work / "train.log"
    torch.set_num_threads(s.threads)
    t_start = time.time()

    ckpt_path = work / CHECKPOINT_NAME
    if resume and (work / LEGACY_CHECKPOINT).exists() and not ckpt_path.exists():
        _log(f"note: {work / LEGACY_CHECKPOINT} is a pickled checkpoint of an earlier version, which this one never "
             "reads (unpickling can run code): training starts over", log_file, progress)
    ck, ck_tensors = read_checkpoint(ckpt_path) if resume and ckpt_path.exists() else (None, None)
    if ck is not None and ck.get("settings") != asdict(s):
        theirs = ck.get("settings") or {}
        changed = sorted(k for k, v in asdict(s).items() if theirs.get(k) != v)
        _log(f"note: {ckpt_path} was written with other settings ({', '.join(changed)}): training starts over "
             "(keep the settings, or use another --work-dir, to resume it)", log_file, progress)
        ck = None
    # a resumed run keeps the tokenizer it started with (one trained again from changed code would renumber tokens)
    tokenizer_path = work / "tokenizer.json"
    from tokenizers import Tokenizer
    started_with = Tokenizer.from_file(str(tokenizer_path)) if ck is not None and tokenizer_path.is_file() else None
    data = build_data(s, Path(corpus_root) if corpus_root else None, max_files, started_with)
    if started_with is None:
        data.tokenizer.save(str(tokenizer_path))
    cfg = model_config(s)
    _log(f"{data.describe()}; tokenizer {time.time() - t_start:.1f}s", log_file, progress)

    model = init_model(cfg, s.seed, s.qk_gain_init)
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
                                      elbo=s.elbo_weighting)
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
            eta = elapsed / (done - step0 or 1) * (s.steps - done) if done > step0 else 0.0
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
            from spot.training.evaluate import answer_accuracy
            acc = answer_accuracy(model, data.tokenizer, data.heldout[:s.accuracy_problems])
            model.train()
            history.setdefault("accuracy", []).append([done, acc["accuracy"]])
            _log(f"step {done}: greedy answers right on {acc['problems']} held-out problems: {acc['right']} "
                 f"({acc['accuracy']:.0%}); the first one:\n{acc['first']}", log_file, progress)
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
    out_dir = Path(os.path.realpath(out_dir))
    remove_stale_beside(out_dir)
    partial = beside(out_dir, "partial")
    remove_tree(partial)
    try:
        write_folder(model, data, partial, n_prompts=n_prompts, seed=s.seed)
        report = {
            "parameters": n_params, "settings": asdict(s), "steps_done": steps_done, "stopped_early": stopped_early,
            "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
            "torch": torch.__version__, "threads": s.threads, "tokens_seen": tokens_seen,
            "corpus": data.report(),
            "tokenizer": {"vocab_size": s.vocab_size, "eos": [bpe.EOS_TOKEN, bpe.EOS_ID],
                          "mask": [bpe.MASK_TOKEN, s.vocab_size - 1],
                          "sha1": hashlib.sha1((partial / "tokenizer.json").read_bytes()).hexdigest()},
            "history": history,
        }
        if final_eval:
            from spot.training.evaluate import evaluate_folder
            report["evaluation"] = evaluate_folder(partial, data, s, log=lambda m: _log(m, log_file, progress))
        write_text_atomic(partial / "training_report.json", json.dumps(report, indent=2))
        publish_folder(partial, out_dir)
    except BaseException:
        remove_tree(partial)
        raise
    _log(f"wrote {out_dir} ({folder_bytes(out_dir) / 1e6:.1f} MB)", log_file, progress)
    return report


def publish_folder(new: Path, folder: Path) -> None:
    """Put the finished folder `new` at `folder`; what an existing `folder` holds that `new` lacks (a drafter trained
    for the model, an export in a subfolder) is carried over — hard links where the file system allows."""
    if not folder.exists():
        new.rename(folder)
        return
    for f in folder.iterdir():
        if (new / f.name).exists() or (new / f.name).is_symlink():
            continue
        if f.is_dir() and not f.is_symlink():
            shutil.copytree(f, new / f.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(f, new / f.name)
    swap_in_folder(new, folder, beside(folder, "old"))


def _link_or_copy(src, dst) -> None:
    if Path(src).is_symlink():
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_folder(model: SDARModel, data, out_dir: Path, n_prompts: int, seed: int) -> None:
    """config.json + model.safetensors (fp16) + tokenizer files + heldout_prompts.jsonl."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, dtype="F16", extra_config={"bos_token_id": None, "pad_token_id": bpe.EOS_ID,
                                                              TRAINING_CORPUS_KEY: data.corpus})
    bpe.save_tokenizer(data.tokenizer, out_dir)
    prompts = data.prompt_records(n_prompts, seed, max_tokens=min(448, model.cfg.max_position_embeddings - 64))
    write_text_atomic(out_dir / "heldout_prompts.jsonl", "".join(json.dumps(p) + "\n" for p in prompts))
