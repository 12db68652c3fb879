"""`benchmarks/name_writing.py`: the ids it checks are the call's value, as the server writes it."""

from __future__ import annotations

from sglang_ds41.encoding.prompt_ids import text_tokenizer

from tests.training._benchmarks import load_benchmark


def test_the_checked_ids_are_the_name_written_without_its_space_after_the_value_opening():
    bench = load_benchmark("name_writing")
    tok = text_tokenizer()
    names = bench.groups(seed=0, n=5)
    assert all(len(v) == 5 for v in names.values())
    assert not set(names["held-out cities"]) & set(names["training cities"])
    for name in [n for group in names.values() for n in group]:
        ids, at, spelling = bench.call_ids(name, bench.QUESTIONS[0])
        assert tok.decode(ids[at : at + len(spelling)]) == name
        assert tok.id_to_token(ids[at - 1]).endswith('">')  # the DSML string parameter's opening
        question = tok.decode(ids[:at])
        assert f"the weather in {name}?" in question  # the name is in the question, with its space
        assert f"in {name}" not in tok.decode(ids[at - 1 :])
