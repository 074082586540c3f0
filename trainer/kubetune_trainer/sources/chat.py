"""Chat formatting shared by the trainer and the tiny model: ChatML, as the notebooks set it up.

The notebooks call TRL's ``setup_chat_format(..., format="chatml")`` when a tokenizer has no chat
template; TRL 1.x dropped that helper, so :func:`ensure_chat_format` does the same here: add the
ChatML special tokens, set the template, the eos/pad tokens, and grow the embeddings if needed.

The template carries ``{% generation %}`` markers around assistant turns so that TRL's
``assistant_only_loss`` can mask everything else.

>>> "<|im_start|>" in CHATML_TEMPLATE and "generation" in CHATML_TEMPLATE
True
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- generation -%}{{ message['content'] + '<|im_end|>' }}{%- endgeneration -%}"
    "{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def ensure_chat_format(model: Any, tokenizer: Any) -> list[str]:
    """Give the tokenizer a ChatML template (when it has none) and a pad token; returns what changed.

    Grows the model's embeddings when special tokens had to be added (as ``setup_chat_format`` did).
    """
    changed: list[str] = []
    if not getattr(tokenizer, "chat_template", None):
        added = tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
        tokenizer.chat_template = CHATML_TEMPLATE
        tokenizer.eos_token = IM_END
        changed.append("chat_template=chatml")
        if added and model is not None:
            model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
            changed.append(f"added {added} special tokens, embeddings resized")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        changed.append("pad_token=eos_token")
    if model is not None:
        # Keep the model's generation settings in step with the tokenizer (register/generate use them).
        model.config.pad_token_id = tokenizer.pad_token_id
        gen = getattr(model, "generation_config", None)
        if gen is not None and "chat_template=chatml" in changed:
            gen.eos_token_id = tokenizer.eos_token_id
            gen.pad_token_id = tokenizer.pad_token_id
    for what in changed:
        log.info("tokenizer: %s", what)
    return changed
