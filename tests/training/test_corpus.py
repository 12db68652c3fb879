"""The synthetic corpus: what the model learns is what the server will ask for and parse."""

import importlib.util
import json
import random
from pathlib import Path

import pytest
from sglang_ds41.encoding import encode_prompt, render_request
from sglang_ds41.encoding.parse import parse_ids
from sglang_ds41.encoding.special_tokens import Special

from sglang_ds41.training.corpus import pools as P
from sglang_ds41.training.corpus import toolbank
from sglang_ds41.training.corpus.samples import samples
from sglang_ds41.training.corpus.tasks import FAMILIES, draw

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def _dialogues(n: int, split: str = P.TRAIN):
    pools = P.Pools(split)
    return [draw(random.Random(f"test:{i}"), pools, family) for i in range(n) for family in FAMILIES]


def test_the_weather_tools_are_the_examples_own():
    spec = importlib.util.spec_from_file_location("weather_calculator", EXAMPLES / "weather_calculator.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert [t.to_openai() for t in example.agent.tools] == [toolbank.GET_WEATHER, toolbank.CALCULATE]


def test_every_turn_is_learnt_as_the_server_renders_and_parses_it():
    # For each assistant turn: its sample starts with the server's prompt for the request up to
    # that turn, and the learnt ids parse back (our parser, the server's options) to the turn.
    for dialogue in _dialogues(3):
        messages = dialogue.body["messages"]
        turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        sequences = samples(dialogue)
        spans: dict[int, set[int]] = {i: set() for i in range(len(sequences))}
        for n, k in enumerate(turns):
            rendered = render_request({**dialogue.body, "messages": messages[:k]})
            prompt = encode_prompt(rendered)
            which = 0 if len(sequences) == 1 else n
            sample = sequences[which]
            assert list(sample.ids[: len(prompt)]) == prompt, dialogue.family
            end = len(prompt)
            while end < len(sample.ids) and sample.learn[end]:
                end += 1
            learnt = list(sample.ids[len(prompt) : end])
            assert learnt[-1] == Special.EOS.id and all(sample.learn[len(prompt) : end])
            got = parse_ids(learnt[:-1], rendered.parsing).to_openai()
            want = messages[k]
            assert got["content"] == want["content"], dialogue.family
            assert got["reasoning_content"] == want.get("reasoning_content", ""), dialogue.family
            calls = [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in got.get("tool_calls", [])
            ]
            wanted = [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in want.get("tool_calls", [])
            ]
            assert calls == wanted, dialogue.family
            spans[which] |= set(range(len(prompt), end))
        for which, sample in enumerate(sequences):  # nothing but the turns is learnt
            assert {i for i, learn in enumerate(sample.learn) if learn} == spans[which], dialogue.family


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    else:
        yield value


@pytest.mark.parametrize("split", [P.TRAIN, P.HELD_OUT])
def test_argument_values_are_copied_from_the_conversation_never_invented(split):
    # Every string argument (and every number but a calculator expression's result) occurs in
    # the user's words or an earlier tool result: the model copies, it does not remember.
    for dialogue in _dialogues(4, split):
        seen = ""
        for message in dialogue.body["messages"]:
            if message["role"] in ("user", "tool"):
                seen += " " + message["content"]
            for call in message.get("tool_calls", []):
                arguments = json.loads(call["function"]["arguments"])
                for value in _strings(arguments):
                    if call["function"]["name"] == "write_file" and "\n" in str(value):
                        continue  # a summary the model writes from the listing, checked below
                    if isinstance(value, bool) or value == ".":
                        continue
                    text = value if isinstance(value, str) else repr(value)
                    parts = (
                        text.replace("(", " ").replace(")", " ").split()
                        if call["function"]["name"] == "calculate"
                        else [text]
                    )
                    for part in parts:
                        assert part in "+-*/" or part in seen, (dialogue.family, part)


def test_held_out_entities_never_occur_in_training_pools():
    train, held = P.Pools(P.TRAIN), P.Pools(P.HELD_OUT)
    real = set(P.split_cities(P.TRAIN)) & set(P.split_cities(P.HELD_OUT))
    assert not real
    rng = random.Random(0)
    held_words = {held.made_up_word(rng).lower() for _ in range(300)}
    assert all(P.in_split(w, P.HELD_OUT) for w in held_words)
    assert not any(P.in_split(train.made_up_word(random.Random(i)).lower(), P.HELD_OUT) for i in range(2000))
    # nor is a held-out real name ever a training made-up name, though one-piece words and
    # one-word vocabulary names are split by another hash than real names
    people = held._real(P._names(P.FIRST_NAMES)) + held._real(P._names(P.SURNAMES))
    held_real = {*P.split_cities(P.HELD_OUT), *people}
    drawn = P.Pools(P.TRAIN, vocabulary_names=0.5)
    rng = random.Random(1)
    assert not held_real & {drawn.made_up_name(rng) for _ in range(200_000)}


def test_vocabulary_names_open_with_any_capitalised_word_and_keep_their_split():
    from sglang_ds41.encoding.prompt_ids import text_tokenizer

    from sglang_ds41.training.spelling import spelt_words

    tokenizer, words = text_tokenizer(), {source for source, _ in spelt_words()}

    def first_ids(pools: P.Pools) -> set[int]:
        rng = random.Random(5)
        names = [pools.made_up_name(rng) for _ in range(3000)]
        assert all(P.in_split(n.lower(), pools.split) for n in names)
        return {tokenizer.encode(" " + n, add_special_tokens=False).ids[0] for n in names}

    for split in P.SPLITS:
        made_up, vocabulary = first_ids(P.Pools(split)), first_ids(P.Pools(split, vocabulary_names=1.0))
        assert vocabulary <= words and made_up <= words
        # the drills' table is used in calls for far more of its words than made-up names reach
        assert len(vocabulary) > 1.5 * len(made_up)
