"""Tokenization without torch: Hugging Face ``tokenizers`` plus chat templates rendered as
transformers renders them. Used by the real-tensor runner, the servers and the load generator."""

from kvtide.text.chat_template import ChatTemplate, Message
from kvtide.text.smollm2 import SMOLLM2_NAME, find_smollm2_gguf, load_tokenizer, smollm2
from kvtide.text.tokenizer import Tokenizer

__all__ = [
    "SMOLLM2_NAME",
    "ChatTemplate",
    "Message",
    "Tokenizer",
    "find_smollm2_gguf",
    "load_tokenizer",
    "smollm2",
]
