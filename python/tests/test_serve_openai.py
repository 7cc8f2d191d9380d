"""`pagedattn serve` answers the official `openai` Python client: completions
and chat completions, whole and streamed, with the synthetic tiny model.

The server binary comes from PAGEDATTN_CLI, else build/release/tools/pagedattn
(scripts/test.sh builds it before scripts/test_python.sh runs)."""
import os
import pathlib
import re
import subprocess

import pytest

openai = pytest.importorskip("openai")

REPO = pathlib.Path(__file__).resolve().parents[2]
API_KEY = "python-test-key"


def cli_path():
    path = pathlib.Path(os.environ.get("PAGEDATTN_CLI", REPO / "build/release/tools/pagedattn"))
    if not path.exists():
        pytest.skip(f"no pagedattn binary at {path}: build the release preset or set PAGEDATTN_CLI")
    return path


@pytest.fixture(scope="module")
def client():
    proc = subprocess.Popen(
        [str(cli_path()), "serve", "--model", "tiny", "--port", "0", "--kv-memory-mib", "8",
         "--api-key", API_KEY],
        stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://([0-9.]+):(\d+)", line)
        assert match, f"no listening line from pagedattn serve: {line!r}"
        # Closed before SIGTERM: an idle keep-alive connection would hold the
        # server's shutdown for its keep-alive timeout.
        with openai.OpenAI(base_url=f"http://{match[1]}:{match[2]}/v1", api_key=API_KEY,
                           max_retries=0, timeout=60) as client:
            yield client
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, "pagedattn serve did not exit 0 on SIGTERM"


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_completion_whole_and_streamed_agree(client):
    whole = client.completions.create(model="tiny", prompt="Hello", max_tokens=8)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == 5 and whole.usage.completion_tokens == 8
    chunks = list(client.completions.create(model="tiny", prompt="Hello", max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_whole_and_streamed_agree(client):
    messages = [{"role": "user", "content": "Hi there"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens == 6
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 6


def test_n_and_stop(client):
    plain = client.completions.create(model="tiny", prompt="abc", max_tokens=10).choices[0].text
    stop = plain[2:4]
    cut = client.completions.create(model="tiny", prompt="abc", max_tokens=10, stop=[stop])
    assert cut.choices[0].text == plain[:plain.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    several = client.completions.create(model="tiny", prompt="abc", max_tokens=4, n=3, temperature=1.0,
                                        seed=3)
    assert sorted(c.index for c in several.choices) == [0, 1, 2]


def test_logprobs_and_logit_bias(client):
    # Greedy: each token is the most likely of its top_logprobs (the byte
    # codec's token texts are ASCII, one per token).
    whole = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0,
                                      logprobs=2, extra_body={"ignore_eos": True})
    lp = whole.choices[0].logprobs
    text_tokens = [t for t in lp.tokens if t != "<2>"]  # EOS (ignored) is listed but not text
    assert "".join(text_tokens) == whole.choices[0].text and len(lp.tokens) == 4
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and top[token] == logprob == max(top.values())
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i] if t != "<2>") for i in range(4)]
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert "".join(item.token for item in content if item.token != "<2>") == \
        chat.choices[0].message.content
    for item in content:
        assert bytes(item.bytes).decode() == item.token
        assert [t.token for t in item.top_logprobs][0] == item.token and len(item.top_logprobs) == 2
    plain = client.completions.create(model="tiny", prompt="Hello", max_tokens=2)
    assert plain.choices[0].logprobs is None
    # A bias of +100 on "A" (token 65 of the byte codec) forces it.
    forced = client.completions.create(model="tiny", prompt="Hello", max_tokens=3, temperature=0,
                                       logit_bias={"65": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == "AAA"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, frequency_penalty=3)
    assert "frequency_penalty" in str(bad.value)


def test_errors_are_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt="x", max_tokens=4, temperature=9)
    assert "temperature" in str(bad.value)
    with pytest.raises(openai.APIStatusError) as long:
        client.completions.create(model="tiny", prompt="x", max_tokens=100000)
    assert long.value.status_code == 413
    wrong_key = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong_key.models.list()
