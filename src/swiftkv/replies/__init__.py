"""The replies stage (`swiftkv replies`): a model's greedy replies to the train prompts of --data, the targets
of `distill --targets teacher|mixed`.

- `settings`: what is written and how (`RepliesSettings`);
- `stage`: the walks of the split, the prompts each asks for, and the engines that answer them;
- `file`: the reply file and the cache over it;
- `vllm_engines`: vLLM, every pending prompt at once, replies streamed; several engines in their processes;
- `hf`, `static_greedy`: transformers' batched generation, and a greedy loop over a static KV cache.
"""

from .file import ReplyCache, append_replies, read_replies, reply_record
from .hf import greedy_batch, hf_generator
from .settings import ENGINES, LONG_KIND_HELP, PROMPT_TURNS, REPLY_TOKENS, WRITERS, RepliesSettings
from .stage import replies_command, replies_complete, reply_cache, save_plain_teacher, write_replies

__all__ = [
    "ENGINES",
    "LONG_KIND_HELP",
    "PROMPT_TURNS",
    "REPLY_TOKENS",
    "WRITERS",
    "RepliesSettings",
    "ReplyCache",
    "append_replies",
    "greedy_batch",
    "hf_generator",
    "read_replies",
    "replies_command",
    "replies_complete",
    "reply_cache",
    "reply_record",
    "save_plain_teacher",
    "write_replies",
]
