"""A tiny Qwen2-architecture model and tokenizer, built on this machine with no download.

``kubetune run examples/tiny-local.yaml --local`` and the CPU tests fine-tune it: a random-init
Qwen2 causal LM (2 layers, hidden 128) and a byte-level BPE tokenizer trained with the
``tokenizers`` library on kubetune's own chat data (:mod:`kubetune_trainer.tiny_data`), with a
ChatML chat template and pad/eos tokens set. It is saved with ``save_pretrained`` so that
``AutoModelForCausalLM.from_pretrained(dir)`` and ``AutoTokenizer.from_pretrained(dir)`` load it
exactly as they load a Hub model.

    python -m kubetune_trainer.tiny --out /tmp/tiny-qwen2                 # on the shipped data
    python -m kubetune_trainer.tiny --out /tmp/tiny-qwen2 --data my.jsonl
    python -m kubetune_trainer.tiny --assets /opt/kubetune/tiny             # model/ + data/ (image build)

>>> from pathlib import Path; import tempfile
>>> out = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")  # doctest: +SKIP
>>> (out / "config.json").exists()  # doctest: +SKIP
True
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import tiny_data
from .sources.chat import CHATML_TEMPLATE, ENDOFTEXT, IM_END, IM_START

# Small enough to train in minutes on 2 CPU cores, big enough that the loss falls clearly.
VOCAB_SIZE = 1024
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
MAX_POSITIONS = 1024
# Larger than Qwen2's 0.02: with tied embeddings behind an RMSNorm, logits are bounded by
# |h| * |e| ~ sqrt(hidden) * range * sqrt(hidden); at 0.02 that is ~2.6, too flat for a LoRA adapter
# (which cannot touch the embeddings) to learn much. At 0.1 both LoRA and full fine-tuning learn.
INIT_RANGE = 0.1
MARKER_FILE = "kubetune-tiny.json"

# Where the tiny model and data live in the trainer image, and what manifests name:
# ``model.path: /opt/kubetune/tiny/model``, ``dataset.path: /opt/kubetune/tiny/data/tiny-chat.jsonl``.
# ``kubetune run --local`` maps this prefix to a local cache folder and builds what is missing there.
TINY_ROOT = "/opt/kubetune/tiny"
TINY_MODEL = "model"
TINY_DATA = "data"


def _train_tokenizer(texts: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # Byte-level, like Qwen2's own tokenizer: any text encodes, none maps to <unk>.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The chat scaffolding is in the training text so "user"/"assistant"/newlines get merged tokens.
    scaffold = [f"{IM_START}{role}\n" for role in ("system", "user", "assistant")]
    tok.train_from_iterator(texts + scaffold * 50, trainer=trainer)
    return tok


def _wrap_tokenizer(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHATML_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(output_dir: Path, data_path: Path | None = None, *, seed: int = 0) -> Path:
    """Write a tiny Qwen2 model + tokenizer to ``output_dir`` (replaced if present) and return it.

    ``data_path``: a chat JSONL file or folder to train the tokenizer on; default: kubetune's own
    tiny chat data, generated in memory (the same rows as ``examples/data/tiny-chat.jsonl``).
    Deterministic for a given ``seed`` and data.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if data_path is None:
        texts = [m["content"] for row in tiny_data.conversations() for m in row["messages"]]
    else:
        texts = tiny_data.read_texts(Path(data_path))
    if not texts:
        raise ValueError(f"{data_path}: no text to train the tokenizer on")
    tokenizer = _wrap_tokenizer(_train_tokenizer(texts))

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_RANGE,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, max_new_tokens=32
    )

    # Write next to the target and rename, so a crash never leaves a half-built model behind
    # that a later run would take for a finished one.
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER_FILE).write_text(
            json.dumps({"seed": seed, "data": str(data_path) if data_path else "builtin"}) + "\n"
        )
        if output_dir.exists():
            shutil.rmtree(output_dir)
        tmp.rename(output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output_dir


def ensure_tiny_model(output_dir: Path, data_path: Path | None = None, *, seed: int = 0) -> Path:
    """Build the tiny model into ``output_dir`` unless a finished build is already there."""
    if (Path(output_dir) / MARKER_FILE).exists():
        return Path(output_dir)
    return build_tiny_model(output_dir, data_path, seed=seed)


def ensure_tiny_assets(root: Path) -> Path:
    """Make ``root`` hold the tiny assets: ``model/`` (built if missing) and ``data/tiny-chat.jsonl``."""
    root = Path(root)
    data = root / TINY_DATA / tiny_data.FILE_NAME
    if not data.exists():
        tiny_data.write_jsonl(tiny_data.conversations(), data)
    ensure_tiny_model(root / TINY_MODEL, data)
    return root


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kubetune_trainer.tiny", description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="folder to write the model into")
    where.add_argument(
        "--assets", type=Path, help=f"folder to fill with model/ and data/ (the image uses {TINY_ROOT})"
    )
    p.add_argument("--data", type=Path, default=None, help="chat JSONL file or folder (default: built in)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.assets:
        root = ensure_tiny_assets(args.assets)
        print(f"tiny model and data in {root}")
        return 0
    out = build_tiny_model(args.out, args.data, seed=args.seed)
    print(f"tiny Qwen2 model written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
