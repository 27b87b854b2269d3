"""The chat template llama-server applies when the model carries none (pure)."""

from __future__ import annotations

__all__ = ["LLAMA_CPP_CHATML_FALLBACK"]

#: llama.cpp's built-in fallback, byte for byte as the real ``/props`` reports it when the
#: model has no template (checked against llama-server 11434.0.0; the newlines inside the
#: Jinja string literals are real newline characters, not ``\n`` escapes).
LLAMA_CPP_CHATML_FALLBACK = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)
