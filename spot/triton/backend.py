"""The Triton Python-backend model of a `spot triton-repo` repository: each model instance (a process of Triton's
Python backend) opens `engines` spot engines over one copy of the exported folder's weights
(spot.engines.factory.open_engines) and decodes that many requests at once, one per engine, each on its own thread;
the model is decoupled, so execute() only queues a request and each finished block goes out as its own response
(text_output, token_ids) from the engine's thread, and a last one says why the text ended (finish_reason) and what it
cost (usage: JSON of spot's pass figures, as `spot serve` reports them).

Requests are checked and decoded by the same code as `spot serve`'s (spot.serve.jobs); a bad one gets an error
response with the library's message at once. A request Triton cancels (its client went away) ends at the next block.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path

import numpy as np

from spot.errors import SpotError
from spot.folder.manifest import load_manifest
from spot.serve.jobs import DecodeFields, build_job, check_defaults, check_prompt_fits, finish_reason, room_left, usage
from spot.serve.model import RequestDefaults, ServedModel, manifest_sha256, threads_per_engine
from spot.tokenizer import TextStream, load_tokenizer

log = logging.getLogger("spot.triton")

# optional inputs besides the prompt (text_input or prompt_ids) -> spot.serve.jobs.DecodeFields' field
FIELD_INPUTS = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                "seed": "seed", "decoder": "decoder", "budget": "budget", "depth": "depth", "mode": "mode",
                "tau": "tau"}
DEFAULT_MAX_TOKENS = 16


def scalar(name: str, array) -> object:
    """One value of an input tensor as Python (bytes decoded as UTF-8); SpotError naming the input otherwise."""
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise SpotError(f"input {name} must hold one value, got {values.size}", f"send {name} with shape [1]")
    value = values[0]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise SpotError(f"input {name} is not UTF-8 text", f"send {name} encoded as UTF-8") from None
    return value.item() if hasattr(value, "item") else value


def request_fields(get, tokenizer, default_max_tokens: int = DEFAULT_MAX_TOKENS, context: int | None = None):
    """A request's prompt ids and DecodeFields from its input tensors; get(name): the input's array or None. A text
    that cannot fit in `context` tokens (the engine's) is refused before it is encoded."""
    text, ids = get("text_input"), get("prompt_ids")
    if (text is None) == (ids is None):
        raise SpotError("send exactly one of the inputs text_input (text) and prompt_ids (token ids)")
    if ids is not None:
        prompt = [int(i) for i in np.asarray(ids).reshape(-1)]
    elif tokenizer is None:
        raise SpotError("this model has no tokenizer, so text_input cannot be encoded", "send prompt_ids")
    else:
        text = scalar("text_input", text)
        if context is not None:
            check_prompt_fits(text, tokenizer, context)
        prompt = tokenizer.encode(text)
    given = {field: scalar(name, get(name)) for name, field in FIELD_INPUTS.items() if get(name) is not None}
    given.setdefault("max_tokens", default_max_tokens)
    return prompt, DecodeFields(**given)


def parameters(config: dict) -> dict[str, str]:
    """config.pbtxt's parameters {key: {string_value}} as {key: value}."""
    return {key: entry.get("string_value", "") for key, entry in config.get("parameters", {}).items()}


def served_model(args: dict, config: dict):
    """The ServedModel config.pbtxt describes; its export folder relative to the model's version folder."""
    p = parameters(config)
    version_dir = Path(args["model_repository"]) / str(args["model_version"])
    folder = (version_dir / p.get("export", "export")).resolve()
    load_manifest(folder)
    defaults = RequestDefaults(decoder=p.get("decoder") or "standard", budget=p.get("budget") or "16",
                               depth=int(p["depth"]) if p.get("depth") else None, mode=p.get("mode") or "static",
                               tau=float(p.get("tau") or 0.9), temperature=float(p.get("temperature") or 1.0))
    drafter = folder / "drafter.onnx"
    return ServedModel(config.get("name", "spot"), folder, p.get("backend") or "ort", p.get("device") or "cpu",
                       p.get("sampler") or "auto", p.get("kv_cache") or "auto", None, str(folder), None, defaults,
                       load_tokenizer(folder), drafter if drafter.is_file() else None, manifest_sha256(folder))


def instance_count(config: dict) -> int:
    return sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1


def engine_count(params: dict[str, str]) -> int:
    """config.pbtxt's `engines` parameter: requests one instance decodes at once (default 1)."""
    text = params.get("engines") or "1"
    if not text.isdigit() or int(text) < 1:
        raise SpotError(f"config.pbtxt's engines parameter must be an integer >= 1, got {text!r}",
                        'e.g. parameters: { key: "engines" value: { string_value: "4" } }')
    return int(text)


class TritonPythonModel:
    """Triton's Python-backend interface: initialize, execute, finalize."""

    def initialize(self, args):
        # triton_python_backend_utils: optional extra (Triton's Python backend)
        import triton_python_backend_utils as pb_utils
        self.pb = pb_utils
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("spot's Triton model streams one response per block: set "
                                                "model_transaction_policy { decoupled: true } in config.pbtxt")
        p = parameters(config)
        self.max_tokens = int(p.get("max_tokens") or DEFAULT_MAX_TOKENS)
        self.model = served_model(args, config)
        engines = engine_count(p)
        threads = int(p["threads"]) if p.get("threads") else None
        # the cores shared out among every engine of every instance
        self.slots = self.model.open_engines(engines, threads_per_engine(threads, engines * instance_count(config)))
        check_defaults(self.model, *self.slots[0])      # config.pbtxt's defaults: now, not per request
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()     # (job, sender), None: stop
        # a job carries the drafter it was checked with (spot.serve.jobs.Job): a thread needs only its engine
        self.threads = [threading.Thread(target=self.work, args=(engine,), name=f"spot-engine-{i}", daemon=True)
                        for i, (engine, _) in enumerate(self.slots)]
        for thread in self.threads:
            thread.start()

    def execute(self, requests):
        """Check each request and queue it for the next free engine (decoupled: the engines' threads answer)."""
        for request in requests:
            queued = self.checked(request)
            if queued is not None:
                self.jobs.put(queued)
        return None

    def finalize(self):
        """Finish the queued requests, stop the engines' threads, release the engines."""
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()
        for engine, _ in self.slots:
            engine.close()

    def work(self, engine) -> None:
        while (queued := self.jobs.get()) is not None:
            try:
                self.answer(*queued, engine)
            except Exception:       # noqa: BLE001 - e.g. a response that cannot be sent: this engine keeps serving
                log.exception("answering a request failed")

    def tensor(self, name: str, values, dtype=None):
        return self.pb.Tensor(name, np.asarray(values, dtype=dtype))

    def block_response(self, piece: str, ids: list[int]):
        return self.pb.InferenceResponse(output_tensors=[
            self.tensor("text_output", [piece.encode("utf-8")], object),
            self.tensor("token_ids", ids, np.int64)])

    def checked(self, request):
        """(job, response sender) of a request, or None after answering a bad one with its error."""
        pb, sender = self.pb, request.get_response_sender()

        def get(name):
            tensor = pb.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()
        try:
            engine, drafter = self.slots[0]     # any engine: only the model's shape is read outside its thread
            prompt, fields = request_fields(get, self.model.tokenizer, self.max_tokens, engine.max_context)
            return build_job(self.model, engine, drafter, prompt, fields), sender
        except SpotError as e:
            sender.send(pb.InferenceResponse(error=pb.TritonError(str(e).replace("\n ", ""))),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None

    def answer(self, job, sender, engine) -> None:
        """Decode `job` on `engine` (this engine's thread), a response per finished block, then the last one."""
        pb = self.pb
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        pieces = TextStream(self.model.tokenizer) if self.model.tokenizer is not None else None
        sent = []

        def on_block(ids: list[int]) -> bool:
            ids = room_left(ids, len(sent), job.max_tokens)
            sent.extend(ids)
            if ids:
                sender.send(self.block_response(pieces.feed(ids) if pieces is not None else "", ids))
            return bool(getattr(sender, "is_cancelled", lambda: False)())
        try:
            gen = job.run(engine, on_block)
        except Exception as e:      # noqa: BLE001 - the request gets the error; the instance keeps serving
            sender.send(pb.InferenceResponse(error=pb.TritonError(f"decoding failed: {e}")), flags=final)
            return
        figures = usage(job, gen, len(sent), engine.block_size)
        last = self.block_response(pieces.end() if pieces is not None else "", [])
        sender.send(pb.InferenceResponse(output_tensors=[
            *last.output_tensors(), self.tensor("finish_reason", [finish_reason(gen, job.max_tokens).encode()], object),
            self.tensor("usage", [json.dumps(figures).encode()], object)]), flags=final)
