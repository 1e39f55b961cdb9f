import pytest
import torch
from torch import nn

from fedpriv.models import LSTM, LSTMLanguageModel, TransformerLanguageModel, get_flat_params, set_flat_params


def test_stackoverflow_lstm_parameter_count():
    # TFF's StackOverflow LSTM (embed 96, LSTM 670, dense 96, vocab 10,004) has 4,050,748 parameters.
    assert sum(p.numel() for p in LSTMLanguageModel(10004).parameters()) == 4_050_748


def test_lstm_matches_torch_lstm_fused_and_unrolled():
    torch.manual_seed(0)
    ours = LSTM(5, 7)
    ref = nn.LSTM(5, 7, batch_first=True)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(ours.ih.weight)
        ref.weight_hh_l0.copy_(ours.hh.weight)
        ref.bias_ih_l0.copy_(ours.ih.bias)
        ref.bias_hh_l0.zero_()
    x = torch.randn(3, 4, 5)
    want, (wh, wc) = ref(x)
    for unrolled in (False, True):
        ours.unrolled = unrolled
        out, (h, c) = ours(x)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h, wh, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, wc, rtol=1e-5, atol=1e-6)


def test_lstm_gradients_reach_every_weight_in_both_paths():
    torch.manual_seed(0)
    model = LSTMLanguageModel(50, embed_dim=8, hidden_size=12, projection_dim=6)
    x = torch.randint(1, 50, (4, 9))
    grads = []
    for unrolled in (False, True):
        model.zero_grad()
        model.lstm.unrolled = unrolled
        model(x).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        assert all(g.abs().sum() > 0 for g in grads[-1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_transformer_is_causal():
    torch.manual_seed(0)
    model = TransformerLanguageModel(40, d_model=16, num_layers=2, num_heads=4, ff_dim=32, max_len=10).eval()
    x = torch.randint(1, 40, (2, 10))
    y = x.clone()
    y[:, 6:] = torch.randint(1, 40, (2, 4))
    torch.testing.assert_close(model(x)[:, :6], model(y)[:, :6])
    assert not torch.allclose(model(x)[:, 6:], model(y)[:, 6:])


def test_flat_params_round_trip():
    model = LSTMLanguageModel(30, embed_dim=4, hidden_size=5, projection_dim=3)
    flat = get_flat_params(model)
    set_flat_params(model, flat * 2)
    torch.testing.assert_close(get_flat_params(model), flat * 2)


def test_lstm_tied_embeddings_share_one_tensor():
    model = LSTMLanguageModel(40, embed_dim=8, hidden_size=12, projection_dim=8, tie_embeddings=True)
    assert model.output.weight is model.embedding.weight
    untied = LSTMLanguageModel(40, embed_dim=8, hidden_size=12, projection_dim=8)
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == 40 * 8


def test_lstm_accepts_the_drop_in_arguments_with_unchanged_parameters():
    torch.manual_seed(0)
    plain = LSTM(5, 7)
    for make in (lambda: LSTM(5, 7, num_layers=1, batch_first=True),
                 lambda: LSTM(5, 7, 1, True, True),  # nn.LSTM's positional order
                 lambda: LSTM(input_size=5, hidden_size=7, num_layers=1, bias=True, batch_first=True)):
        torch.manual_seed(0)
        ours = make()
        assert (ours.num_layers, ours.batch_first) == (1, True)
        assert [n for n, _ in ours.named_parameters()] == ["ih.weight", "ih.bias", "hh.weight"]
        torch.testing.assert_close(get_flat_params(ours), get_flat_params(plain), rtol=0, atol=0)
    no_bias = LSTM(5, 7, bias=False, num_layers=1, batch_first=True)
    assert [n for n, _ in no_bias.named_parameters()] == ["ih.weight", "hh.weight"]


@pytest.mark.parametrize("kwargs, supported", [
    ({"num_layers": 2}, "num_layers=1"),
    ({"num_layers": 0}, "num_layers=1"),
    ({"num_layers": True}, "num_layers=1"),
    ({"batch_first": False}, "batch_first=True"),
    ({"batch_first": None}, "batch_first=True"),
])
def test_lstm_refuses_unsupported_arguments(kwargs, supported):
    with pytest.raises(ValueError, match=supported):
        LSTM(5, 7, **kwargs)


def test_lstm_built_like_nn_lstm_computes_the_same_with_an_initial_state():
    torch.manual_seed(1)
    kwargs = {"num_layers": 1, "batch_first": True}
    ours, ref = LSTM(5, 7, **kwargs), nn.LSTM(5, 7, **kwargs)
    with torch.no_grad():  # nn.LSTM's two biases are equivalent to their sum
        ours.ih.weight.copy_(ref.weight_ih_l0)
        ours.hh.weight.copy_(ref.weight_hh_l0)
        ours.ih.bias.copy_(ref.bias_ih_l0 + ref.bias_hh_l0)
    x, h0, c0 = torch.randn(3, 4, 5), torch.randn(1, 3, 7), torch.randn(1, 3, 7)
    want, (wh, wc) = ref(x, (h0, c0))
    for unrolled in (False, True):
        ours.unrolled = unrolled
        out, (h, c) = ours(x, (h0, c0))
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h, wh, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, wc, rtol=1e-5, atol=1e-6)
