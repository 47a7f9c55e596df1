"""The record layouts `--data` reads, mapped to examples by one table: a chat (`messages`, a list of
{"role", "content"}) or a plain text (str).

Each layout is the set of columns that identifies it and a function from such a record to an example.
The first layout whose required columns a record has (not None) reads it, so a layout that extends
another (AceMath's `messages` + `answer`) comes before it. A record that fits none is refused with
the columns it has and the column sets that would fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import sharegpt

CHAT_ROLES = ("system", "user", "assistant")

Messages = list[dict]
Example = Messages | str


@dataclass(frozen=True)
class Layout:
    name: str  # the datasets that use it, for the error message and the docs
    columns: tuple[str, ...]  # required (present and not None)
    read: Callable[[dict, str], Example | None]  # (record, where) -> example (None: nothing to learn)

    def fits(self, record: dict) -> bool:
        return all(record.get(column) is not None for column in self.columns)


def chat_message(message, where: str, index: int) -> dict:
    """One `messages` entry, checked: a role the chat template knows and text content."""
    if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
        role = message.get("role") if isinstance(message, dict) else None
        raise ValueError(f"{where}: messages[{index}] has role {role!r}; expected one of {list(CHAT_ROLES)}")
    if not isinstance(message.get("content"), str):
        raise ValueError(
            f"{where}: messages[{index}] ({message['role']}) has content "
            f"{message.get('content')!r}; expected a string"
        )
    return {"role": message["role"], "content": message["content"]}


def text_of(record: dict, column: str, where: str) -> str:
    value = record[column]
    if not isinstance(value, str):
        raise ValueError(f"{where}: column {column!r} holds {type(value).__name__}; expected a string")
    return value


def turns(*pairs: tuple[str, str]) -> Messages:
    """Messages of (role, text) pairs, leaving out a system turn with no text."""
    return [{"role": r, "content": t} for r, t in pairs if r != "system" or t.strip()]


def joined(*texts: str) -> str:
    """An instruction and its optional input/context as one user turn (Alpaca's and Dolly's own prompt
    templates put the input after the instruction, separated by a blank line)."""
    return "\n\n".join(t for t in texts if t.strip())


def read_messages(record: dict, where: str, column: str = "messages") -> Messages:
    if not isinstance(record[column], list):
        raise ValueError(f"{where}: column {column!r} holds {type(record[column]).__name__}; expected a list")
    return [chat_message(m, where, i) for i, m in enumerate(record[column])]


def read_instruction(context_column: str, reply_column: str) -> Callable[[dict, str], Messages]:
    def read(record: dict, where: str) -> Messages:
        extra = record.get(context_column) or ""
        question = joined(text_of(record, "instruction", where), extra if isinstance(extra, str) else "")
        return turns(("user", question), ("assistant", text_of(record, reply_column, where)))

    return read


def read_pair(prompt_column: str, reply_column: str) -> Callable[[dict, str], Messages]:
    def read(record: dict, where: str) -> Messages:
        return turns(
            ("user", text_of(record, prompt_column, where)),
            ("assistant", text_of(record, reply_column, where)),
        )

    return read


def read_openorca(record: dict, where: str) -> Messages:
    return turns(
        ("system", text_of(record, "system_prompt", where)),
        ("user", text_of(record, "question", where)),
        ("assistant", text_of(record, "response", where)),
    )


def read_acemath(record: dict, where: str) -> Messages:
    """AceMath-Instruct: the prompt turns in `messages`, the reply in `answer`."""
    return [*read_messages(record, where), {"role": "assistant", "content": text_of(record, "answer", where)}]


def read_sharegpt(record: dict, where: str) -> Messages | None:
    if not isinstance(record["conversations"], list):
        raise ValueError(f"{where}: column 'conversations' holds {type(record['conversations']).__name__}")
    return sharegpt.messages_of(record)


# The one table. Order matters where one layout's columns include another's (see the module doc).
LAYOUTS = (
    Layout("AceMath-Instruct", ("messages", "answer"), read_acemath),
    Layout("chat messages", ("messages",), read_messages),
    Layout("ShareGPT (from/value or role/content turns)", ("conversations",), read_sharegpt),
    Layout("lmsys-chat", ("conversation",), lambda r, w: read_messages(r, w, "conversation")),
    Layout("OpenOrca", ("system_prompt", "question", "response"), read_openorca),
    Layout("Alpaca", ("instruction", "output"), read_instruction("input", "output")),
    Layout("Dolly", ("instruction", "response"), read_instruction("context", "response")),
    Layout("prompt/response", ("prompt", "response"), read_pair("prompt", "response")),
    Layout("prompt/completion", ("prompt", "completion"), read_pair("prompt", "completion")),
    Layout("plain text", ("text",), lambda r, w: text_of(r, "text", w)),
)


def layouts_help() -> str:
    return "; ".join(f"{'/'.join(layout.columns)} ({layout.name})" for layout in LAYOUTS)


def record_to_example(record, where: str) -> Example | None:
    """The example of a record of any layout in LAYOUTS (None: a chat with no reply to learn from)."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a {type(record).__name__}, not a record; expected an object with columns")
    for layout in LAYOUTS:
        if layout.fits(record):
            return layout.read(record, where)
    have = sorted(k for k, v in record.items() if v is not None)
    raise ValueError(
        f"{where}: a record with columns {have} fits no layout; expected one of: {layouts_help()}"
    )
