"""The long-prompt builder (SwiftKV's workload: passages + a question, a document + a summary request)."""

from swiftkv.data.long_prompts import DOCUMENT_TAIL, PASSAGES_HEAD, long_prompts


def words(text: str) -> int:
    return len(text.split())


def chats(count: int) -> list[list[dict]]:
    """Conversations whose first reply has 50..149 words and names its conversation."""
    return [
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"question number {i}?"},
            {"role": "assistant", "content": f"answer{i} " + "word " * (50 + 37 * i % 100)},
        ]
        for i in range(count)
    ]


def test_prompts_alternate_kinds_stay_in_bounds_and_hold_the_answer_to_their_question():
    prompts = long_prompts(chats(200), 6, words, min_tokens=400, max_tokens=600)
    assert len(prompts) == 6
    for k, prompt in enumerate(prompts):
        assert len(prompt) == 1 and prompt[0]["role"] == "user"
        text = prompt[0]["content"]
        assert 400 <= words(text) <= 600 + 3 * 20  # + the "Passage i:" labels
        if k % 2 == 0:
            assert text.startswith(PASSAGES_HEAD)
            number = int(text.rsplit("question number ", 1)[1].rstrip("?"))
            assert f"answer{number} " in text  # the passage that answers it is among the others
            assert text.count("Passage ") >= 3
        else:
            assert text.endswith(DOCUMENT_TAIL) and "Question:" not in text
    assert prompts == long_prompts(chats(200), 6, words, min_tokens=400, max_tokens=600)  # deterministic
    used = [p[0]["content"] for p in prompts]
    assert len({u.split("\n\n")[1] for u in used}) == 6  # each prompt starts from unused passages


def test_too_little_text_gives_fewer_prompts_not_short_ones():
    prompts = long_prompts(chats(8), 4, words, min_tokens=400, max_tokens=600)
    assert all(words(p[0]["content"]) >= 400 for p in prompts) and len(prompts) < 4
