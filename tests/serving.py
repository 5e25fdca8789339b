"""What a served request must return, computed in the test's own process: run_decoder on an engine of the same
export, with the prompt encoded as the server encodes it (shared by the spot serve and Triton tests, and their
defaults: budget 16 nodes at the default depth, tau 0.9, top_p 1)."""
from __future__ import annotations


class Reference:
    def __init__(self, folder, chat_template: str | None = None):
        from spot.engines.ort_engine import OrtEngine
        from spot.runtime.drafter import load_drafter
        from spot.tokenizer import load_tokenizer
        self.engine, self.drafter = OrtEngine(folder, threads=1), load_drafter(folder)
        self.tokenizer, self.chat_template = load_tokenizer(folder), chat_template

    def prompt_ids(self, prompt, chat: bool = False) -> list[int]:
        from spot.tokenizer import render_chat_template
        if chat:
            return self.tokenizer.encode(render_chat_template(self.chat_template, [{"role": "user", "content": prompt}]))
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def __call__(self, prompt, decoder: str, temperature: float, seed: int, max_tokens: int, chat: bool = False):
        """The first max_tokens ids run_decoder gives."""
        from spot.runtime.decoders import DecodeRequest, run_decoder
        from spot.runtime.spot import TreeBudget
        from spot.runtime.step import Sampling
        req = DecodeRequest(max_tokens, sampling=Sampling(temperature, seed=seed), budget=TreeBudget(16))
        ids = self.prompt_ids(prompt, chat)
        return run_decoder(decoder, self.engine, ids, req, self.drafter).token_ids[:max_tokens]
