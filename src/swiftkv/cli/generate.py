"""`swiftkv generate MODEL "prompt"`: greedy chat generation on the transformers path."""

from __future__ import annotations

import sys

from transformers import TextStreamer

from ..dtypes import describe_choice, resolve_dtype
from ..generation import chat_input_ids, generate_text
from ..model.config import is_swiftkv
from ..sources import open_source
from .options import add_dtype_option, add_revision_option, source_help


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="chat with a model through transformers (SwiftKV prefill skip on)",
        description="Greedy generation with the model's chat template, streaming the answer.",
    )
    parser.add_argument("model", help=source_help())
    parser.add_argument("prompt", help="user message")
    add_revision_option(parser)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--teacher", action="store_true", help="run a SwiftKV model's original (teacher) path"
    )
    parser.add_argument("--no-chat-template", action="store_true", help="use the prompt as raw text")
    add_dtype_option(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    print(f"swiftkv generate: {describe_choice(args.dtype)}", file=sys.stderr)
    source = open_source(args.model, args.revision)
    model, tokenizer = source.load_model(resolve_dtype(args.dtype)), source.load_tokenizer()
    if args.teacher and not is_swiftkv(model):
        raise ValueError(
            f"--teacher: {args.model} is not a SwiftKV model, so it has no separate teacher path"
        )
    input_ids = chat_input_ids(tokenizer, args.prompt, raw=args.no_chat_template)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    path = {"swiftkv": False} if args.teacher else {}
    generate_text(model, tokenizer, input_ids, args.max_new_tokens, streamer=streamer, **path)
    return 0
