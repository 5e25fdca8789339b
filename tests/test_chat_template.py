"""Chat templates render within bounds of time, memory and length (spot.chat_template): a template is data that a
checkpoint or `--chat-template` brings, and every way it can fail — or try to exhaust the machine — is one SpotError,
in every caller (the library, `spot generate --chat`; `spot serve`'s chat route: tests/test_serve.py)."""
from __future__ import annotations

import json
import re
import shutil
import time

import pytest
from click.testing import CliRunner

from spot.chat_template import RenderLimits, render_chat_template
from spot.cli import main
from spot.errors import SpotError
from spot.tokenizer import load_tokenizer
from tinymodels import TEMPLATE, save_tiny_model, save_tiny_tokenizer

FAST = RenderLimits(seconds=1.5, memory_bytes=2**29, max_chars=10_000)
HELLO = [{"role": "user", "content": "hello"}]

# template -> what the error says. Each would have run for minutes or taken gigabytes (or was an exception other
# than jinja2's TemplateError: a traceback, a 500 from spot serve).
HOSTILE = {
    "{{ 'x' * 4000000000 }}": "needed more than 512 MiB of memory",
    "{{ 'x'|center(4000000000) }}": "needed more than 512 MiB of memory",
    "{{ [0] * 2000000000 }}": "needed more than 512 MiB of memory",
    # doubling copies about 1 GiB before the memory limit trips: on a busy machine the time limit may trip first
    "{% set ns = namespace(s='xy') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s[:1] }}":
        ("needed more than 512 MiB of memory", "took longer than 1.5 s"),
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "took longer than 1.5 s",
    "{% for i in range(100000) %}{% for c in 'abcdefgh' * 100000 %}{% endfor %}{% endfor %}": "took longer than 1.5 s",
    "{% for i in range(100000) %}{{ messages }}{% endfor %}": "rendered more than 10000 characters",
    "{% for i in range(100000) %}{% for j in range(100000) %}xx{% endfor %}{% endfor %}":
        "rendered more than 10000 characters",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}": "failed to render (RecursionError",
    "{{ 1 / 0 }}": "failed to render (ZeroDivisionError",
    "{{ 'a' + 1 }}": "failed to render (TypeError",
    "{{ range(10**9)|list }}": "failed to render (OverflowError",
    "{{ ''.__class__.__mro__ }}": "failed to render (SecurityError",
    "{% for m in messages %}": "failed to render (TemplateSyntaxError",
    "{{ raise_exception('roles must alternate') }}": "failed to render (TemplateError: roles must alternate)",
}


@pytest.mark.parametrize("template", HOSTILE)
def test_a_hostile_template_is_one_spot_error_within_its_limits(template):
    start = time.monotonic()
    says = HOSTILE[template]
    with pytest.raises(SpotError, match="|".join(map(re.escape, says if isinstance(says, tuple) else (says,)))) as e:
        render_chat_template(template, HELLO, limits=FAST)
    assert time.monotonic() - start < FAST.seconds + 10       # the child's restart included, on a busy machine
    assert e.value.hint


def test_templates_render_as_before_and_after_a_killed_render():
    """The child renders transformers' way (trim_blocks, lstrip_blocks, loop controls, tojson, raise_exception), any
    text round trips (a lone surrogate too: the tokenizer names it afterwards), and a render killed for its time
    leaves the next one working."""
    messages = [{"role": "user", "content": "héllo \ud800 ✓"}, {"role": "assistant", "content": "hi"}]
    expected = "<|im_start|>user héllo \ud800 ✓<|im_end|><|im_start|>assistant hi<|im_end|><|im_start|>assistant"
    assert render_chat_template(TEMPLATE, messages) == expected
    with pytest.raises(SpotError, match="took longer"):
        render_chat_template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                             messages, limits=FAST)
    assert render_chat_template(TEMPLATE, messages, add_generation_prompt=False) == expected[:-len("<|im_start|>"
                                                                                                   "assistant")]
    features = ("{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}\n  {{ m|tojson }}\n"
                "{% endfor %}")
    assert render_chat_template(features, messages) == "  " + json.dumps(messages[1]) + "\n"
    with pytest.raises(SpotError, match="chat messages must be JSON values"):
        render_chat_template(TEMPLATE, [{"role": "user", "content": object()}])


def test_the_rendered_length_is_bounded_at_max_chars():
    text = render_chat_template("{{ messages[0]['content'] }}", [{"role": "user", "content": "x" * 10_000}],
                                limits=FAST)
    assert len(text) == FAST.max_chars
    with pytest.raises(SpotError, match="rendered more than 10000 characters"):
        render_chat_template("{{ messages[0]['content'] }}", [{"role": "user", "content": "x" * 10_001}],
                             limits=FAST)


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory):
    """A tiny checkpoint whose tokenizer_config.json holds a template that allocates 4 GB."""
    root = tmp_path_factory.mktemp("hostile")
    folder = save_tiny_model(root / "model")
    save_tiny_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'x' * 4000000000 }}"}))
    return folder


def test_spot_generate_chat_refuses_a_hostile_template_in_one_line(hostile_model):
    result = CliRunner().invoke(main, ["generate", "--model", str(hostile_model), "--prompt", "the cat", "--chat",
                                       "--max-new-tokens", "4"])
    assert result.exit_code == 2, result.output
    assert "error: the chat template needed more than 1024 MiB of memory to render" in result.output
    assert "hint:" in result.output and "Traceback" not in result.output


def test_the_library_api_refuses_a_hostile_template(hostile_model):
    tokenizer = load_tokenizer(hostile_model)
    for call in (lambda: tokenizer.apply_chat_template(HELLO), lambda: tokenizer.chat_prompt_ids("hello")):
        with pytest.raises(SpotError, match="needed more than 1024 MiB"):
            call()


def test_a_copied_template_folder_renders_normally(hostile_model, tmp_path):
    """The same checkpoint with a sane template: what the bounds cost a normal prompt is nothing visible."""
    folder = tmp_path / "model"
    shutil.copytree(hostile_model, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    tokenizer = load_tokenizer(folder)
    assert tokenizer.chat_prompt_ids("the cat") == tokenizer.encode(
        "<|im_start|>user the cat<|im_end|><|im_start|>assistant")
