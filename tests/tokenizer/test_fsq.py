"""FSQ: every code of the grid round-trips through its token id; gradients pass straight through."""

from __future__ import annotations

import pytest
import torch

from vfm_core.tokenizer.fsq import FSQ, FSQError


@pytest.mark.parametrize("levels", [(8, 8, 8, 5, 5, 5), (7, 5, 5, 5, 5), (2, 3)])
def test_every_id_round_trips(levels):
    fsq = FSQ(levels)
    ids = torch.arange(fsq.vocab_size)
    codes = fsq.indices_to_codes(ids)  # (V, C)
    assert codes.shape == (fsq.vocab_size, len(levels))
    assert codes.min() >= -1 and codes.max() <= 1
    assert torch.equal(fsq.codes_to_indices(codes), ids)


def test_uses_all_levels_and_passes_gradients():
    fsq = FSQ((8, 5, 3))
    z = torch.linspace(-6, 6, 4001)[:, None].repeat(1, 3).requires_grad_()
    q = fsq(z)
    assert torch.equal(fsq.indices_to_codes(fsq.codes_to_indices(q)), q.detach())
    for c, lv in enumerate(fsq.levels):
        assert q[:, c].unique().numel() == lv
    q.sum().backward()
    assert z.grad is not None and bool((z.grad > 0).any())
    assert fsq.vocab_size == 120


def test_bad_ids_and_levels_are_named():
    fsq = FSQ((4, 4))
    with pytest.raises(FSQError, match=r"\[0, 16\)"):
        fsq.indices_to_codes(torch.tensor([3, 16]))
    with pytest.raises(FSQError, match="levels"):
        FSQ((4, 1))
    with pytest.raises(FSQError, match="channels"):
        fsq(torch.zeros(2, 3))
