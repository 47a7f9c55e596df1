"""The replies a run trains on (`--targets teacher|mixed`): written by the replies stage before the steps, and
under torchrun before the process group starts, so no collective ever waits on generation."""

from __future__ import annotations

from ...replies import replies_command, replies_complete, reply_cache, write_replies
from ..parallel.world import World, log
from ..settings import DistillSettings


def check_replies_written(settings: DistillSettings) -> None:
    """Under torchrun no process writes replies: the others would wait for them in a collective, which
    NCCL ends after 10 minutes, and one process would generate on one GPU while the rest idle. A run of
    `--targets teacher|mixed` needs them written first by `swiftkv replies` (every GPU, no group)."""
    if settings.data.targets == "human":
        return
    replies = settings.replies_settings()
    if not replies_complete(replies):
        raise ValueError(
            f"--targets {settings.data.targets} under torchrun reads the {settings.replies.writer}'s replies, and "
            f"they are not all written yet (distill writes none inside a process group); write them first "
            f"with `{replies_command(replies)}`, then run this command again"
        )


def written_replies(settings: DistillSettings, tokenizer, world: World):
    """The replies of `--targets teacher|mixed` (None for human targets). One process writes the missing
    ones through the replies stage (then frees its engine); under torchrun they were written before the
    group started (`check_replies_written`), so every process only reads them."""
    if settings.data.targets == "human":
        return None
    if world.size == 1:
        cache = write_replies(settings.replies_settings(), tokenizer)
        log(
            world,
            f"{settings.replies.writer} replies: {len(cache.replies)} in {cache.path} "
            f"({cache.generated} generated now)",
        )
    return reply_cache(settings.replies_settings(), tokenizer, may_generate=False)
