"""Sequence-tiled MLPs give the untiled update, hold only a tile of intermediates, and undo cleanly."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from bat_gym.trainers.activation_checkpointing import set_activation_checkpointing  # noqa: E402
from bat_gym.trainers.tiled_mlp import set_mlp_tiling, tiled_mlp  # noqa: E402


def load(path):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    model.train()
    logits = model(input_ids=ids, use_cache=False).logits
    # A loss that weighs every position differently, so a misplaced tile would show.
    weights = torch.linspace(0.1, 2.0, ids.shape[1])[None, :, None]
    loss = (logits.log_softmax(-1) * weights).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("tile", [1, 7, 64])
def test_a_tiled_update_is_the_untiled_update(tiny, checkpointing, tile):
    ids = torch.randint(5, 500, (3, 37), generator=torch.Generator().manual_seed(1))
    plain = load(tiny)
    tiled = load(tiny)
    set_activation_checkpointing(plain, checkpointing)
    set_activation_checkpointing(tiled, checkpointing)
    assert set_mlp_tiling(tiled, tile) == tiled.config.num_hidden_layers
    want_loss, want = loss_and_grads(plain, ids)
    got_loss, got = loss_and_grads(tiled, ids)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-6, rtol=1e-6)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-5, msg=name)


def test_tiling_changes_no_weight_name_and_undoes(tiny):
    model = load(tiny)
    names = list(model.state_dict())
    mlp = model.model.layers[0].mlp
    set_mlp_tiling(model, 8)
    set_mlp_tiling(model, 8)  # idempotent: one layer of tiling, not two
    assert list(model.state_dict()) == names
    assert "forward" in mlp.__dict__
    set_mlp_tiling(model, None)
    assert "forward" not in mlp.__dict__  # the class's forward again
    assert set_mlp_tiling(model, None) == 0


def test_an_mlp_runs_one_tile_at_a_time_in_forward_and_backward():
    seen = []

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(4, 6, bias=False)
            self.up_proj = torch.nn.Linear(4, 6, bias=False)
            self.down_proj = torch.nn.Linear(6, 4, bias=False)

        def forward(self, x):
            seen.append(x.numel() // x.shape[-1])  # tokens in this call
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    mlp = MLP()
    x = torch.randn(2, 5, 4, requires_grad=True)
    out = tiled_mlp(mlp, x, 4, mlp.forward)
    assert out.shape == x.shape and seen == [4, 4, 2]  # 10 tokens: tiles of 4, 4, 2
    seen.clear()
    out.sum().backward()
    assert seen == [4, 4, 2]  # recomputed tile by tile
    with torch.no_grad():
        seen.clear()
        tiled_mlp(mlp, x, 4, mlp.forward)
        assert seen == [10]  # without grad there is nothing to save: one call


def test_a_model_without_dense_mlps_is_left_alone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert set_mlp_tiling(model, 8) == 0
