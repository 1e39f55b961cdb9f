"""Distribution-matching selection: log-probabilities, top fraction, precision vs base rate."""

import numpy as np
import pytest
import torch

from fedpriv.errors import ConfigError
from fedpriv.models import build_model
from fedpriv.public.matching import matching_stats, select_top, sequence_logprob


def test_sequence_logprob_sums_non_pad_targets():
    torch.manual_seed(0)
    model = build_model("lstm", 20, embed_dim=4, hidden_size=6, projection_dim=4)
    rows = np.array([[18, 3, 4, 19, 0], [18, 5, 19, 0, 0]])
    got = sequence_logprob(model, rows)
    with torch.no_grad():
        logits = model(torch.as_tensor(rows[:, :-1]))
    logp = torch.log_softmax(logits, -1)
    want = [sum(float(logp[n, t, rows[n, t + 1]]) for t in range(4) if rows[n, t + 1] != 0) for n in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_select_top_fraction_and_ties():
    scores = np.array([0.1, 5.0, 3.0, 5.0, -1.0])
    np.testing.assert_array_equal(select_top(scores, 0.4), [1, 3])
    np.testing.assert_array_equal(select_top(scores, 0.5), [1, 2, 3])
    with pytest.raises(ConfigError):
        select_top(scores, 0.0)


def test_matching_stats_precision_and_base_rate():
    topics = np.array([0, 1, 2, 3, 0, 5])
    stats = matching_stats(np.array([0, 4, 5]), topics, {0, 1})
    assert stats == {"selected": 3.0, "precision": pytest.approx(2 / 3), "base_rate": pytest.approx(3 / 6)}
