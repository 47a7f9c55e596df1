"""`swiftkv serve` end to end: the real CLI starts vLLM's OpenAI server (engine core in its own
process, so the plugin must load there) on SmolLM2 converted to SwiftKV (N=15, G=5, trimmed), and
real HTTP requests check the endpoints, streaming, bad requests and the api key pass-through.
Greedy completions must equal the HF SwiftKV model's (fp32 on both sides)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

# The first test also builds the model and waits up to 600 s for the server to start.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

API_KEY = "test-key-123"
MAX_MODEL_LEN = 512
NAME = "skv-smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_smollm2_swiftkv(path):
    """SmolLM2-135M -> SwiftKV N=15, G=5, copy init, trimmed (the later layers' q/k/v dropped)."""
    from swiftkv.model.surgery import build_swiftkv_model, copy_init_params, load_trained, trimmed_copy
    from swiftkv.sources import load_model, load_tokenizer

    teacher = load_model("smollm2-135m-instruct", dtype=torch.float32)
    model = build_swiftkv_model(teacher, 15, 5)
    load_trained(model, copy_init_params(model, average_group=True))
    model = trimmed_copy(model)
    model.save_pretrained(path)
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    tokenizer.save_pretrained(path)
    return model.eval(), tokenizer


class Server:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def request(self, path: str, body: dict | bytes | None = None, key: str | None = API_KEY):
        """(status, parsed JSON or raw text) of a GET (body None) or POST."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.base + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def stream(self, path: str, body: dict) -> list[dict]:
        status, text = self.request(path, {**body, "stream": True})
        assert status == 200, text
        lines = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [json.loads(line) for line in lines[:-1]]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("skv_smollm2")
    model, tokenizer = build_smollm2_swiftkv(path)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "swiftkv.cli",
        "serve",
        str(path),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--api-key",
        API_KEY,
        "--served-model-name",
        NAME,
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes",
        str(256 * 2**20),
        "--enforce-eager",
        "--max-num-seqs",
        "8",
    ]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    log = open(path / "server.log", "w")  # noqa: SIM115 - closed at teardown
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(port)
    deadline = time.time() + 600
    while not server.healthy():
        if process.poll() is not None or time.time() > deadline:
            log.flush()
            pytest.fail("server did not start:\n" + (path / "server.log").read_text()[-4000:])
        time.sleep(2)
    yield server, model, tokenizer, path
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    log.close()


def hf_greedy_text(model, tokenizer, prompt: str, new_tokens: int) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id
        )
    return tokenizer.decode(out[0, ids.shape[1] :])


def test_engine_core_loaded_the_plugin(served):
    """vLLM started the model in a separate engine-core process: the plugin registered there too."""
    server, *_, path = served
    assert server.request("/v1/models")[0] == 200
    log = (path / "server.log").read_text()
    assert re.search(r"\(EngineCore pid=\d+\).*swiftkv plugin registered LlamaSwiftKVForCausalLM", log)
    assert re.search(r"\(APIServer pid=\d+\).*Resolved architecture: LlamaSwiftKVForCausalLM", log)


def test_models_lists_the_served_name(served):
    server, *_ = served
    status, body = server.request("/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == [NAME]
    assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN


def test_api_key_is_required(served):
    server, *_ = served
    status, _ = server.request("/v1/models", key=None)
    assert status == 401


PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Water boils at a temperature of"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_equals_hf_greedy(served, prompt):
    server, model, tokenizer, _ = served
    status, body = server.request(
        "/v1/completions",
        {"model": NAME, "prompt": prompt, "max_tokens": 20, "temperature": 0, "ignore_eos": True},
    )
    assert status == 200, body
    assert body["choices"][0]["text"] == hf_greedy_text(model, tokenizer, prompt, 20)
    assert body["usage"]["completion_tokens"] == 20


def test_completion_streaming_equals_non_streaming(served):
    server, *_ = served
    request = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    _, whole = server.request("/v1/completions", request)
    chunks = server.stream("/v1/completions", request)
    assert len(chunks) > 1
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]


def chat(question: str) -> dict:
    return {
        "model": NAME,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0,
    }


def test_chat_completion_and_streaming_agree(served):
    server, *_ = served
    status, body = server.request("/v1/chat/completions", chat("What is the capital of France?"))
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].strip()
    chunks = server.stream("/v1/chat/completions", chat("What is the capital of France?"))
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == message["content"]


BAD_REQUESTS = {
    "malformed_json": ("/v1/completions", b'{"model": "skv-smollm2", "prompt": "hi", '),
    "prompt_longer_than_context": (
        "/v1/completions",
        {"model": NAME, "prompt": "hello " * (MAX_MODEL_LEN + 50), "max_tokens": 4},
    ),
    "negative_max_tokens": ("/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": -5}),
    "chat_negative_max_tokens": ("/v1/chat/completions", {**chat("hi"), "max_tokens": -1}),
    "unknown_model": ("/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 4}),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_gets_4xx_and_server_stays_healthy(served, case):
    server, *_ = served
    path, body = BAD_REQUESTS[case]
    status, _ = server.request(path, body)
    assert 400 <= status < 500, f"{case}: status {status}"
    assert server.healthy()
    status, body = server.request("/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] == 2


# Every form of prompt logprobs: a fast-prefill engine cannot compute them, and vLLM 0.32's own check
# lets 0 and echo+logprobs through to an assertion that kills the engine core and the server.
PROMPT_LOGPROB_REQUESTS = {
    "completion_prompt_logprobs_0": (
        "/v1/completions",
        {"model": NAME, "prompt": "Hi", "max_tokens": 4, "prompt_logprobs": 0},
    ),
    "completion_prompt_logprobs_2": (
        "/v1/completions",
        {"model": NAME, "prompt": "Hi", "max_tokens": 4, "prompt_logprobs": 2},
    ),
    "completion_echo_logprobs_0": (
        "/v1/completions",
        {"model": NAME, "prompt": "Hi", "max_tokens": 4, "echo": True, "logprobs": 0},
    ),
    "completion_echo_only_prompt": (
        "/v1/completions",
        {"model": NAME, "prompt": "Hi", "max_tokens": 0, "echo": True, "logprobs": 1},
    ),
    "chat_prompt_logprobs_0": ("/v1/chat/completions", {**chat("hi"), "prompt_logprobs": 0}),
    "chat_echo_logprobs": ("/v1/chat/completions", {**chat("hi"), "echo": True, "logprobs": True}),
    "chat_echo_top_logprobs": (
        "/v1/chat/completions",
        {**chat("hi"), "echo": True, "logprobs": True, "top_logprobs": 3},
    ),
}


def test_prompt_logprobs_in_any_form_get_400_while_another_stream_finishes(served):
    import threading

    server, *_ = served
    streamed = {}
    request = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    thread = threading.Thread(
        target=lambda: streamed.update(chunks=server.stream("/v1/completions", request))
    )
    thread.start()
    for case, (path, body) in PROMPT_LOGPROB_REQUESTS.items():
        status, answer = server.request(path, body)
        assert status == 400, f"{case}: status {status}: {answer}"
        assert "kv-sharing-fast-prefill" in answer["error"]["message"], f"{case}: {answer}"  # says why
    thread.join(timeout=300)
    assert (
        sum(len(c["choices"][0]["text"]) > 0 for c in streamed["chunks"]) > 1
    )  # ended with [DONE], status 200
    assert server.healthy()
    status, body = server.request(
        "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2, "logprobs": 1}
    )
    assert status == 200 and len(body["choices"][0]["logprobs"]["tokens"]) == 2  # output logprobs still work


def test_64_concurrent_streams_all_complete(served):
    from concurrent.futures import ThreadPoolExecutor

    server, *_ = served

    def one(i: int) -> str:
        chunks = server.stream(
            "/v1/completions",
            {
                "model": NAME,
                "prompt": f"{PROMPTS[i % 3]} {i}",
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        return "".join(c["choices"][0]["text"] for c in chunks)

    with ThreadPoolExecutor(64) as pool:
        texts = list(pool.map(one, range(64)))
    assert len(texts) == 64 and all(texts)
    assert server.healthy()
