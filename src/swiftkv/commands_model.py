"""CLI commands on models: convert, export, generate, demo."""

from __future__ import annotations

import argparse

from .sources import SMOLLM2_ALIAS

SOURCE_HELP = f"HF folder, .gguf file, or alias ({SMOLLM2_ALIAS}, {SMOLLM2_ALIAS}-swiftkv50, ...)"


def register(subparsers) -> None:
    register_convert(subparsers)
    register_export(subparsers)
    register_generate(subparsers)
    register_demo(subparsers)


# -- convert -----------------------------------------------------------------------------------------


def register_convert(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="turn a Llama/Qwen2 model into a SwiftKV model",
        description="Add SwiftKV projections to a Llama/Qwen2 model and write an HF-format SwiftKV folder "
        "(Snowflake checkpoint format). Example: swiftkv convert smollm2-135m-instruct out/skv50 "
        "--num-key-value-layers 15 --init lstsq",
    )
    parser.add_argument("src", help=SOURCE_HELP)
    parser.add_argument("dst", help="output folder (must not exist unless --force)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--num-key-value-layers", type=int, metavar="N",
                       help="layers >= N become SwiftKV layers (prompt tokens skip them)")
    which.add_argument("--swiftkv-fraction", type=float, metavar="F",
                       help="fraction of layers that become SwiftKV layers, e.g. 0.5 (N = L - round(F*L))")
    parser.add_argument("--key-value-group-size", type=int, default=1, metavar="G",
                        help="AcrossKV: later layers share one KV cache in groups of G (default 1)")
    parser.add_argument("--init", choices=("copy", "mean", "lstsq"), default="lstsq",
                        help="init of the new projections: copy/mean as the reference, lstsq = ridge fit to "
                        "the teacher's K/V on calibration tokens (default)")
    parser.add_argument("--calib-data", default="sharegpt",
                        help="calibration text: 'sharegpt' (offline wheel), a .jsonl chat file, or a text file/folder")
    parser.add_argument("--calib-tokens", type=int, default=8192, help="tokens to fit lstsq on (default 8192)")
    parser.add_argument("--trim", action="store_true",
                        help="drop the later layers' unused original q/k/v (smaller; student-only)")
    parser.add_argument("--dtype", default=None, help="weights dtype of the output (float32, bfloat16, ...)")
    parser.add_argument("--force", action="store_true", help="overwrite DST")
    parser.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from .convert import convert

    report = convert(args.src, args.dst, num_key_value_layers=args.num_key_value_layers,
                     swiftkv_fraction=args.swiftkv_fraction, key_value_group_size=args.key_value_group_size,
                     init=args.init, trim=args.trim, dtype=args.dtype, force=args.force,
                     calib_data=args.calib_data, calib_tokens=args.calib_tokens)
    print(report.summary())
    print(f"wrote {args.dst}")
    return 0


# -- export ------------------------------------------------------------------------------------------


def register_export(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a model (alias, .gguf, folder) as a plain HF folder",
        description="Write any model source as a complete HF folder, e.g. the embedded SmolLM2 teacher "
        f"(swiftkv export {SMOLLM2_ALIAS} out/teacher) or a distilled SwiftKV model "
        f"(swiftkv export {SMOLLM2_ALIAS}-swiftkv50 out/skv50).",
    )
    parser.add_argument("src", help=SOURCE_HELP)
    parser.add_argument("out", help="output folder (must not exist unless --force)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT")
    parser.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from .sources import export

    print(f"wrote {export(args.src, args.out, force=args.force)}")
    return 0


# -- generate ----------------------------------------------------------------------------------------


def register_generate(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="chat with a model through transformers (SwiftKV prefill skip on)",
        description="Greedy generation with the model's chat template, streaming the answer.",
    )
    parser.add_argument("model", help=SOURCE_HELP)
    parser.add_argument("prompt", help="user message")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--teacher", action="store_true", help="run a SwiftKV model's original (teacher) path")
    parser.add_argument("--no-chat-template", action="store_true", help="use the prompt as raw text")
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype (default bfloat16)")
    parser.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from transformers import TextStreamer

    from .convert import parse_dtype
    from .generation import chat_input_ids, generate_text
    from .sources import load_model, load_tokenizer

    model, tokenizer = load_model(args.model, dtype=parse_dtype(args.dtype)), load_tokenizer(args.model)
    if args.teacher:
        model.set_swiftkv(False)
    input_ids = chat_input_ids(tokenizer, args.prompt, raw=args.no_chat_template)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    generate_text(model, tokenizer, input_ids, args.max_new_tokens, streamer=streamer)
    return 0


# -- demo (make run) ---------------------------------------------------------------------------------


def register_demo(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="the `make run` demo on the embedded SmolLM2: convert, time prefill, compare answers",
    )
    parser.add_argument("--out", default="runs/demo", help="folder for the converted model and results")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--question", default="What is the capital of France?")
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from .demo import demo

    demo(args.out, args.prompt_tokens, args.question)
    return 0
