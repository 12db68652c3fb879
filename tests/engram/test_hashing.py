"""Engram hash ids: Appendix B vectors, an independent per-token oracle, and request histories."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_ds41.config import V41Config
from sglang_ds41.engram.hashing import EngramHasher
from sglang_ds41.engram.layout import EngramLayout
from sglang_ds41.errors import Ds41Error

IMAGE = 511

# MODEL.md Appendix B: ids [5, 9, 9, 511, 17, 23] at positions 0..5.
APPENDIX_B_IDS = [5, 9, 9, 511, 17, 23]
APPENDIX_B_LAYER1 = [
    [8, 63, 178, 225, 336, 420],
    [16, 65, 187, 237, 320, 410],
    [31, 95, 157, 254, 281, 364],
    [23, 103, 154, 224, 347, 430],
    [21, 97, 192, 216, 291, 405],
    [19, 77, 183, 207, 281, 368],
]
APPENDIX_B_LAYER2 = [
    [0, 164, 200, 296, 417, 527],
    [0, 142, 219, 378, 401, 543],
    [35, 104, 190, 291, 397, 563],
    [31, 117, 273, 333, 463, 565],
    [3, 129, 226, 302, 411, 570],
    [57, 123, 203, 294, 391, 500],
]


def oracle(ids: list[int], layout: EngramLayout, token_map: list[int], pad_id: int, image_id: int) -> list:
    """MODEL.md §5.5 transcribed literally: Python ints, one token at a time."""
    pad = token_map[pad_id]

    def dead(x: int) -> bool:
        return x < 0 or x >= len(token_map) or x == image_id

    out = []
    for t in range(len(ids)):
        per_layer = []
        for layer in layout.layers:
            c, blocked = [], False
            for s in range(layout.max_ngram_size):
                blocked = blocked or t - s < 0 or dead(ids[t - s])
                c.append(pad if blocked else token_map[ids[t - s]])
            products = [c[s] * layer.multipliers[s] for s in range(layout.max_ngram_size)]
            row, rho = [], products[0]
            for n in range(2, layout.max_ngram_size + 1):
                rho ^= products[n - 1]
                for h in range(layout.n_heads):
                    col = (n - 2) * layout.n_heads + h
                    row.append(rho % layer.primes[col] + layer.offsets[col])
            per_layer.append(row)
        out.append(per_layer)
    return out


def test_appendix_b_vectors(tiny_hasher: EngramHasher) -> None:
    rows = tiny_hasher.hash_sequence(torch.tensor(APPENDIX_B_IDS))
    assert rows.dtype == torch.int64
    assert tuple(rows.shape) == (6, 2, 6)
    assert rows[:, 0].tolist() == APPENDIX_B_LAYER1
    assert rows[:, 1].tolist() == APPENDIX_B_LAYER2


def test_image_token_hashes_as_all_pad_and_blocks_look_back(tiny_hasher: EngramHasher) -> None:
    rows = tiny_hasher.hash_sequence(torch.tensor([5, 9, 9, IMAGE, 17, 23]))
    # The image token's window is all pad, like a lone pad-token window...
    all_pad = tiny_hasher.hash_windows(torch.full((1, 4), -1))[0]
    assert torch.equal(rows[3], all_pad)
    # ...and text after it hashes as if the sequence started there (look-back stops at the image).
    assert torch.equal(rows[4:], tiny_hasher.hash_sequence(torch.tensor([17, 23])))


def test_pad_at_sequence_start_uses_the_pad_token_map(tiny_hasher: EngramHasher) -> None:
    # Token 2 maps to pad (1) and token 3 too (3 // 2 = 1): [3] at position 0 hashes like an all-pad window.
    assert tiny_hasher.pad == 1
    rows = tiny_hasher.hash_sequence(torch.tensor([3]))
    assert torch.equal(rows[0], tiny_hasher.hash_windows(torch.full((1, 4), -1))[0])


def test_multimodal_pad_ids_and_negative_ids_are_dead(tiny_hasher: EngramHasher) -> None:
    image = tiny_hasher.hash_sequence(torch.tensor([5, IMAGE, 7]))
    for dead in (1_000_000, -1):
        assert torch.equal(tiny_hasher.hash_sequence(torch.tensor([5, dead, 7])), image)


token_ids = st.one_of(st.integers(0, 511), st.sampled_from([IMAGE, 2, -1, 600]))


@settings(max_examples=60, deadline=None)
@given(st.lists(token_ids, min_size=1, max_size=30))
def test_vectorised_hash_matches_per_token_oracle(tiny_hasher: EngramHasher, ids: list[int]) -> None:
    expected = oracle(ids, tiny_hasher.layout, [i // 2 for i in range(512)], 2, IMAGE)
    assert tiny_hasher.hash_sequence(torch.tensor(ids)).tolist() == expected


def test_official_hash_matches_oracle_on_random_tokens(official_config: V41Config) -> None:
    gen = torch.Generator().manual_seed(0)
    token_map = torch.randint(0, 99_092, (129_280,), generator=gen)
    token_map[:99_092] = torch.arange(99_092)  # every compressed id used, incl. the largest
    hasher = EngramHasher.from_config(official_config, token_map)
    ids = torch.randint(0, 129_280, (40,), generator=gen)
    ids[7] = official_config.image_token_id
    ids[20] = 99_091  # largest compressed id: the product must not overflow int64
    expected = oracle(ids.tolist(), hasher.layout, token_map.tolist(), 2, official_config.image_token_id)
    rows = hasher.hash_sequence(ids)
    assert tuple(rows.shape) == (40, 2, 24)
    assert rows.tolist() == expected


def test_batched_sequences_equal_single_sequences(tiny_hasher: EngramHasher) -> None:
    a, b = [5, 9, 9, IMAGE, 17, 23], [100, 200, 300]
    batch = torch.tensor([a, [*b, -1, -1, -1]])  # right padding with a DEAD id
    rows = tiny_hasher.hash_sequence(batch)
    assert tuple(rows.shape) == (2, 6, 2, 6)
    assert torch.equal(rows[0], tiny_hasher.hash_sequence(torch.tensor(a)))
    assert torch.equal(rows[1, :3], tiny_hasher.hash_sequence(torch.tensor(b)))


# --- request histories: every serving path --------------------------------------------------------


@st.composite
def serving_scenario(draw):
    """Several requests, each a token list and a schedule of steps consuming it."""
    n_req = draw(st.integers(1, 4))
    requests = []
    for _ in range(n_req):
        ids = draw(st.lists(token_ids.filter(lambda x: x >= 0), min_size=1, max_size=25))
        steps, pos = [], 0
        while pos < len(ids):
            kind = draw(st.sampled_from(["chunk", "decode", "speculate"]))
            if kind == "chunk":
                n = draw(st.integers(1, len(ids) - pos))
                steps.append(("chunk", n))
                pos += n
            elif kind == "decode":
                steps.append(("decode", 1))
                pos += 1
            else:
                n_draft = draw(st.integers(1, 5))
                accepted = draw(st.integers(0, min(n_draft, len(ids) - pos)))
                junk = draw(st.lists(st.integers(0, 511), min_size=n_draft, max_size=n_draft))
                steps.append(("speculate", accepted, junk))
                pos += accepted
                if accepted == 0 and pos < len(ids):  # all drafts rejected: the verify step still emits one
                    steps.append(("decode", 1))
                    pos += 1
        requests.append((ids, steps))
    return requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(serving_scenario())
def test_every_serving_path_equals_one_shot_hashing(tiny_hasher: EngramHasher, requests) -> None:
    """Chunks and decode steps of a batch (`extend`), speculative drafts hashed without moving the
    history and then only the accepted tokens committed (`history_after`), and a history rebuilt
    after a prefix-cache hit (`history_of`) all give the ids of hashing the whole sequence at once."""
    history = tiny_hasher.empty_history(len(requests))
    got: list[list[torch.Tensor]] = [[] for _ in requests]
    cursor = [0] * len(requests)
    step = [0] * len(requests)
    # Advance all unfinished requests together, one schedule step each, as a batch.
    while any(step[i] < len(s) for i, (_, s) in enumerate(requests)):
        live = [i for i, (_, s) in enumerate(requests) if step[i] < len(s)]
        chunks = {i: requests[i][1][step[i]] for i in live}
        plain = [i for i in live if chunks[i][0] != "speculate"]
        idle = [i for i in range(len(requests)) if i not in live]  # finished: zero-length entries
        if plain:
            plain += idle
            ids = [
                requests[i][0][cursor[i] : cursor[i] + (chunks[i][1] if i in chunks else 0)] for i in plain
            ]
            rows, history[plain] = tiny_hasher.extend(
                history[plain], torch.tensor([x for c in ids for x in c]), torch.tensor([len(c) for c in ids])
            )
            start = 0
            for i, c in zip(plain, ids, strict=True):
                got[i].append(rows[start : start + len(c)])
                start += len(c)
                cursor[i] += len(c)
        for i in live:
            if chunks[i][0] != "speculate":
                continue
            _, accepted, junk = chunks[i]
            truth = requests[i][0][cursor[i] : cursor[i] + accepted]
            draft = truth + junk[accepted:]  # rejected tail differs from the truth
            rows, _ = tiny_hasher.extend(history[[i]], torch.tensor(draft), torch.tensor([len(draft)]))
            got[i].append(rows[:accepted])
            accepted_ids = tiny_hasher.compress(torch.tensor(truth, dtype=torch.int64))
            history[[i]] = tiny_hasher.history_after(history[[i]], accepted_ids, torch.tensor([accepted]))
            cursor[i] += accepted
        for i in live:
            step[i] += 1

    for i, (ids, _) in enumerate(requests):
        expected = tiny_hasher.hash_sequence(torch.tensor(ids))
        assert torch.equal(torch.cat(got[i]), expected)
        # A prefix-cache hit at any split rebuilds the same history.
        whole = torch.tensor(ids, dtype=torch.int64)
        for split in range(len(ids) + 1):
            head, rest = whole[:split], whole[split:]
            rebuilt = tiny_hasher.history_of(head, torch.tensor([split]))
            tail, _ = tiny_hasher.extend(rebuilt, rest, torch.tensor([len(rest)]))
            assert torch.equal(tail, expected[split:])


def test_history_is_the_last_three_compressed_ids(tiny_hasher: EngramHasher) -> None:
    history = tiny_hasher.empty_history(2)
    assert tuple(history.shape) == (2, 3) and history.dtype == torch.int32
    _, history = tiny_hasher.extend(history, torch.tensor([5]), torch.tensor([0, 1]))
    assert history.dtype == torch.int32
    assert history[1].tolist() == [-1, -1, 2]  # before-start look-backs stay blocked
    _, history = tiny_hasher.extend(history, torch.tensor([9, IMAGE, 17]), torch.tensor([0, 3]))
    assert history[1].tolist() == [4, -1, 8]  # map(9) = 4, image DEAD, map(17) = 8
    assert history[0].tolist() == [-1, -1, -1]  # a zero-length chunk leaves its history as it was


def test_bad_chunk_lengths_and_histories_are_refused(tiny_hasher: EngramHasher) -> None:
    with pytest.raises(Ds41Error, match="sum to the number of tokens"):
        tiny_hasher.extend(tiny_hasher.empty_history(1), torch.tensor([1, 2, 3]), torch.tensor([2]))
    with pytest.raises(Ds41Error, match=r"history must have shape \(1, 3\)"):
        tiny_hasher.extend(tiny_hasher.empty_history(2), torch.tensor([1]), torch.tensor([1]))


def test_token_map_outside_compressed_vocab_is_refused(tiny_config: V41Config) -> None:
    with pytest.raises(Ds41Error, match="engram_compressed_vocab_size"):
        EngramHasher.from_config(tiny_config, torch.arange(512))


def test_real_tokenizer_hasher_for_the_official_config(official_config: V41Config, engram_cache_dir) -> None:
    from sglang_ds41.assets import TOKENIZER_JSON, v41_tokenizer

    hasher = EngramHasher.for_tokenizer(official_config, TOKENIZER_JSON, cache_dir=engram_cache_dir)
    assert hasher.pad == int(hasher.token_map[2])
    ids = v41_tokenizer().encode("Hello hello HELLO", add_special_tokens=False).ids
    rows = hasher.hash_sequence(torch.tensor(ids))
    assert tuple(rows.shape) == (len(ids), 2, 24)
    starts = hasher.offsets
    ends = starts + hasher.primes
    assert bool(((rows >= starts) & (rows < ends)).all())  # every id inside its column's range


def test_tokenizer_disagreeing_with_the_config_is_refused(tiny_config: V41Config, engram_cache_dir) -> None:
    from sglang_ds41.assets import TOKENIZER_JSON
    from sglang_ds41.engram.token_map import TokenMapError

    with pytest.raises(TokenMapError, match=r"99092 .*engram_compressed_vocab_size is 256"):
        EngramHasher.for_tokenizer(tiny_config, TOKENIZER_JSON, cache_dir=engram_cache_dir)
