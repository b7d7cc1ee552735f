"""The SmolLM2 GGUF as a Hugging Face directory vLLM can serve: run as a script, by the engine's own
Python (``recon setup vllm``), never imported by recon (it needs torch, transformers and gguf,
which the engine's venv has).

transformers loads the GGUF (``gguf_file=``) but refuses to save a gguf-quantized model, so the
``quantization_config`` goes, a fresh model is built from the config, the weights are loaded into
it and checked to give the very same logits; then float32 safetensors, the tokenizer and its chat
template are saved, into a temporary folder renamed into place (a cut-short run leaves nothing
that looks done).

    python vllm_convert.py GGUF_FILE OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:  # a tied lm_head is the embedding itself
        raise SystemExit(f"the GGUF's weights do not fit the model: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    fresh.eval()
    loaded.eval()
    probe = tok("<|im_start|>user\nHello, world! Ünïcödé 🙂 def f(x): return x\n<|im_end|>", return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (loaded(probe).logits - fresh(probe).logits).abs().max().item()
    if diff != 0.0:
        raise SystemExit(f"the rebuilt model's logits differ from the GGUF's by {diff}")
    if not getattr(tok, "chat_template", None):
        raise SystemExit("the GGUF carries no chat template")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return {"logit_diff": diff, "probe_tokens": int(probe.shape[1]),
            "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(json.dumps(convert(Path(sys.argv[1]), Path(sys.argv[2]))))
