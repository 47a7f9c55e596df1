"""`swiftkv replies SRC --out replies.jsonl`: a model's greedy replies to the train prompts of `--data`."""

from __future__ import annotations

from ..data.mixture import check_data
from ..distill import plan_replies
from ..replies import RepliesSettings, write_replies
from ..sources import check_weights_present, open_source
from .options import add_dataclass_options, add_revision_option, given_values, source_help


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "replies",
        help="write a model's greedy replies to the train prompts of --data (chat JSONL)",
        description="The teacher's (or a SwiftKV student's) greedy replies to the first user turn of each train "
        "chat of --data, after the seeded held-out split: the targets of `swiftkv distill --targets teacher|mixed`, "
        "which runs this stage itself when replies are missing. Each line is a chat record --data reads. "
        "Resumable: a second run appends only the missing replies.",
    )
    parser.add_argument("src", help=source_help())
    add_revision_option(parser)
    add_dataclass_options(parser, RepliesSettings)
    parser.add_argument(
        "--plan",
        action="store_true",
        help="write nothing: print the stage's prompts and tokens at these settings and its time, the writer's "
        "prefill and decode timed on random weights of its shape on this machine's device",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    given = given_values(args, RepliesSettings)
    # first: opening the data is cheaper than the model
    check_data(
        given.get("data", RepliesSettings.data), split=given.get("data_split", RepliesSettings.data_split)
    )
    source = open_source(args.src, args.revision)  # resolved once: the stage's loaders take it as it is
    settings = RepliesSettings(source=source, **given)
    if args.plan:
        settings.check_engine()
        print("\n".join(plan_replies(settings).lines(settings.data_parallel_size)))
        return 0
    check_weights_present(source.folder)  # before its tokenizer: a folder holding only a config has none
    cache = write_replies(settings)
    print(f"wrote {cache.path}: {len(cache.replies)} replies ({cache.generated} generated now)")
    return 0
