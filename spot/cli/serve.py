"""`spot serve` and `spot triton-repo`: the model behind an OpenAI-compatible HTTP API; a Triton Inference Server
model repository that runs this runtime."""
from __future__ import annotations

from pathlib import Path

import click

from spot.cli.shared import echo_err, model_folder, placement_options
from spot.engines.factory import BACKENDS, EXPORTED_BACKENDS
from spot.errors import SpotError
from spot.files import check_output_path
from spot.folder.manifest import load_manifest
from spot.app.models import check_model_folder, drafter_file
from spot.runtime.registry import decoder_names
from spot.runtime.step import Sampling


@click.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Exported folder (--backend ort / tensorrt) or checkpoint (--backend torch). Default: the embedded "
                   "model (ort, tensorrt: spot demo's export of it).")
@click.option("--backend", type=click.Choice(BACKENDS), default="ort", show_default=True)
@click.option("--device", default="cpu", show_default=True,
              help="Device of the backend (torch: cpu, cuda; ort: cpu, cuda, trt; tensorrt: cuda).")
@click.option("--block-size", type=int, default=None, help="Block size B. Default: the model's.")
@placement_options
@click.option("--drafter", "drafter_path", type=click.Path(path_type=str), default=None,
              help=f"drafter.onnx (or its folder) for requests decoded with {' / '.join(decoder_names(drafts=True))}"
                   ". Default: the one beside the model, if any (else those decoders are refused).")
@click.option("--engines", type=click.IntRange(min=1), default=1, show_default=True,
              help="Engines, each decoding one request at a time (each holds its own KV cache).")
@click.option("--threads", type=click.IntRange(min=0), default=None,
              help="ort: ONNX Runtime threads per engine. Default: the machine's cores / --engines.")
@click.option("--plan", "plan_device", default=None, metavar="DEVICE",
              help="Check the memory plan of --engines engines over the export first (spot-export --plan's devices: "
                   "orin-nx-16gb, ..., <N>GB, host = this machine's CPU): printed, and the server refuses to start "
                   "when it does not fit.")
@click.option("--queue-size", type=click.IntRange(min=0), default=16, show_default=True,
              help="Requests that may wait for a free engine; one more is answered 429.")
@click.option("--decoder", type=click.Choice(decoder_names()), default="standard", show_default=True,
              help="Decoder of the requests that name none (a request's `decoder` field picks another).")
@click.option("--budget", default="16", show_default=True,
              help="Tree nodes per verify pass (or auto: spot tune's) of the requests that name none.")
@click.option("--depth", type=int, default=None, help="Tree depth of the requests that name no budget.")
@click.option("--mode", type=click.Choice(["static", "threshold"]), default="static", show_default=True,
              help="Commit rule of the requests that name none.")
@click.option("--tau", type=float, default=0.9, show_default=True, help="Threshold of the threshold rule (default).")
@click.option("--chat-template", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Jinja chat template of /v1/chat/completions. Default: the tokenizer's.")
@click.option("--chat-max-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="max_tokens of a chat request that gives none (/v1/completions: 16, as OpenAI's).")
@click.option("--served-model-name", default=None,
              help="The model's name in the API (requests' `model` field). Default: the model folder's name.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on: loopback only unless you name another (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: any free port.")
@click.option("--api-key", envvar="SPOT_API_KEY", default=None,
              help="Require `Authorization: Bearer KEY` on /v1/ (default: $SPOT_API_KEY, else none).")
@click.option("--graceful-timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds a shutdown waits for running requests. Default: until they finish.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="warning",
              show_default=True, help="uvicorn's log level (info: one line per request).")
def serve(model_dir, backend, device, block_size, sampler, kv_cache, drafter_path, engines, threads, plan_device,
          queue_size,
          decoder, budget, depth, mode, tau, chat_template, chat_max_tokens, served_model_name, host, port, api_key,
          graceful_timeout, log_level):
    """Serve the model over HTTP, OpenAI-compatible (/v1/completions, /v1/chat/completions, /v1/models), with
    /health, /ready and /metrics: a pool of engines, one request each, behind a bounded queue (docs/deployment.md).

    \b
    Examples:
      spot serve --engines 2
      curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
          -d '{"model": "code-fp32-onnx", "prompt": "def add(a, b):", "max_tokens": 32, "decoder": "spot"}'
      spot serve --model sdar-8b-fp16-onnx --device trt --host 0.0.0.0 --api-key "$KEY"
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.app.request_options import RequestOptions
    from spot.serve.model import RequestDefaults, ServedModel, manifest_sha256, served_tokenizer
    from spot.serve.run import ServeOptions, serve as run_server

    RequestOptions(decoder, budget, depth, mode=mode, tau=tau)      # the defaults' errors before the weights load
    folder = Path(model_folder(backend, model_dir))
    check_model_folder(backend, folder)
    if plan_device is not None:         # before the weights load: a configuration that does not fit never starts
        check_serving_plan(backend, folder, plan_device, engines)
    tokenizer = served_tokenizer(folder, chat_template)
    model = ServedModel(served_model_name or folder.resolve().name, folder, backend, device, sampler, kv_cache,
                        block_size, model_dir, drafter_path,
                        RequestDefaults(decoder, budget, depth, mode, tau), tokenizer,
                        drafter_file(drafter_path, folder), manifest_sha256(folder))
    options = ServeOptions(host, port, engines, threads, queue_size, api_key, chat_max_tokens, graceful_timeout,
                           log_level)
    run_server(model, options, echo_err)


def check_serving_plan(backend: str, folder, device: str, engines: int) -> None:
    """`spot serve --plan DEVICE`: the export's memory plan with `engines` engines, printed; SpotError (naming what
    fits) unless it fits."""
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.export.memory_plan import check_serving_fits
    if backend not in EXPORTED_BACKENDS:
        raise SpotError(f"--plan sizes an exported folder, got --backend {backend}",
                        "use --backend ort (or tensorrt) with an export, or leave out --plan")
    check_serving_fits(load_manifest(folder), device, engines, echo_err)


@click.command("triton-repo")
@click.argument("export_dir", metavar="EXPORT", type=click.Path(file_okay=False, path_type=str))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=str),
              help="Folder of the Triton model repository to write (atomically).")
@click.option("--name", default="spot", show_default=True, help="The model's name in Triton.")
@click.option("--engines", type=click.IntRange(min=1), default=1, show_default=True,
              help="Engines of an instance: requests it decodes at once, over one copy of the weights.")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
              help="Model instances (instance_group count), each a process with its own copy of the weights.")
@click.option("--backend", type=click.Choice(["ort", "tensorrt"]), default="ort", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="ort: cpu, cuda, trt; tensorrt: cuda.")
@placement_options
@click.option("--threads", type=click.IntRange(min=0), default=None,
              help="ort: ONNX Runtime threads per engine. Default: the machine's cores / (--engines x --instances).")
@click.option("--decoder", type=click.Choice(decoder_names()), default="standard", show_default=True,
              help="Decoder of the requests that name none.")
@click.option("--budget", default="16", show_default=True, help="Tree nodes (or auto) of the requests that name none.")
@click.option("--depth", type=int, default=None, help="Tree depth of the requests that name no budget.")
@click.option("--mode", type=click.Choice(["static", "threshold"]), default="static", show_default=True)
@click.option("--tau", type=float, default=0.9, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True,
              help="Temperature of the requests that name none.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=16, show_default=True,
              help="max_tokens of the requests that name none.")
@click.option("--reference", is_flag=True,
              help="Name EXPORT by its absolute path instead of putting it (hard-linked, else copied) in the "
                   "repository.")
@click.option("--overwrite", is_flag=True, help="Replace a repository spot triton-repo wrote at --out.")
def triton_repo(export_dir, out, name, engines, instances, backend, device, sampler, kv_cache, threads, decoder, budget,
                depth, mode, tau, temperature, max_tokens, reference, overwrite):
    """Write a Triton Inference Server model repository that serves the exported folder EXPORT with the spot
    runtime: a Python-backend model, decoupled (one response per finished block), --engines engines per instance
    over one copy of the weights, and a config.pbtxt to tune (docs/deployment.md).

    \b
    Examples:
      spot triton-repo sdar-8b-fp16-onnx --out triton-repo --engines 2 --device trt
      python3 -m pip wheel --no-deps -w dist .      # spot's wheel, from this checkout
      docker run --rm -p 8000:8000 -v $PWD/triton-repo:/models -v $PWD/dist:/wheels \\
          nvcr.io/nvidia/tritonserver:24.10-py3 \\
          bash -c "pip install /wheels/spot_edge-*.whl && tritonserver --model-repository /models"
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.app.request_options import RequestOptions
    from spot.triton.repo import TritonRepoOptions, write_triton_repo

    # the defaults checked as a request's are
    RequestOptions(decoder, budget, depth, mode=mode, tau=tau, sampling=Sampling(temperature))
    check_output_path(out, "--out", folder=True)
    options = TritonRepoOptions(name, instances, backend, device, sampler, kv_cache, threads, decoder, budget, depth,
                                mode, tau, temperature, max_tokens, reference, overwrite, engines=engines)
    repo = write_triton_repo(export_dir, out, options, echo_err)
    click.echo(f"wrote {repo}: model {name!r}, {instances} instance{'s' * (instances > 1)} of {engines} "
               f"engine{'s' * (engines > 1)}; serve it with "
               f"`tritonserver --model-repository {repo}` where spot is installed (docs/deployment.md)")
