"""The torch versions of sgl-kernel's CPU ops, against hand-computed tables."""

import torch

from sglang_ds41.serve.cpu.ops import assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu


def test_assign_req_to_token_pool_writes_each_requests_slots_into_its_row():
    req_to_token = torch.zeros(4, 8, dtype=torch.int32)
    # request in row 2 gets 3 new slots at columns 1..3; row 0 gets 2 slots at columns 5..6
    assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        req_to_token,
        torch.tensor([1, 5]),
        torch.tensor([4, 7]),
        torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64),
        8,
    )
    expected = torch.zeros(4, 8, dtype=torch.int32)
    expected[2, 1:4] = torch.tensor([11, 12, 13])
    expected[0, 5:7] = torch.tensor([21, 22])
    assert torch.equal(req_to_token, expected)


def test_assign_req_to_token_pool_skips_requests_without_new_tokens():
    req_to_token = torch.zeros(2, 4, dtype=torch.int32)
    assign_req_to_token_pool_cpu(
        torch.tensor([0, 1]), req_to_token, torch.tensor([2, 0]), torch.tensor([2, 1]), torch.tensor([9]), 4
    )
    assert req_to_token.tolist() == [[0, 0, 0, 0], [9, 0, 0, 0]]


def test_copy_all_layer_kv_cache_copies_rows_in_every_buffer():
    k = torch.arange(6 * 4, dtype=torch.float32).view(6, 4).clone()
    v = torch.arange(6 * 2, dtype=torch.bfloat16).view(6, 2).clone() + 100
    k_before, v_before = k.clone(), v.clone()
    ptrs = torch.tensor([k.data_ptr(), v.data_ptr()], dtype=torch.uint64)
    strides = torch.tensor([4 * 4, 2 * 2], dtype=torch.int64)
    copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([4, 5]), torch.tensor([1, 2]))
    assert torch.equal(k[4], k_before[1]) and torch.equal(k[5], k_before[2])
    assert torch.equal(v[4], v_before[1]) and torch.equal(v[5], v_before[2])
    assert torch.equal(k[:4], k_before[:4]) and torch.equal(v[:4], v_before[:4])


def test_copy_all_layer_kv_cache_reads_all_sources_before_writing():
    # a swap: row 0 <- row 1 and row 1 <- row 0 needs the old values of both
    t = torch.tensor([[1, 1], [2, 2]], dtype=torch.int32)
    ptrs = torch.tensor([t.data_ptr()], dtype=torch.uint64)
    copy_all_layer_kv_cache_cpu(ptrs, torch.tensor([8]), torch.tensor([0, 1]), torch.tensor([1, 0]))
    assert t.tolist() == [[2, 2], [1, 1]]
