"""Tests of the synthetic user-keyed corpus (tiny configs, fast)."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pytest

from fedpriv.data.synthetic import SyntheticConfig, generate, generate_with_truth, make_vocabulary
from fedpriv.data.synthetic_oracle import bayes_correct
from fedpriv.errors import ConfigError
from tests.helpers import user_sizes

TINY = SyntheticConfig(vocab_size=40, num_topics=3, num_public_topics=2, num_users=50,
                       mean_sentences=6.0, max_sentences_per_user=40, num_test=120,
                       num_public=400, min_successors=2, max_successors=5, topic_words=12,
                       seq_len=12, mean_length=6.0, seed=3)


@pytest.fixture(scope="module")
def tiny():
    return generate_with_truth(TINY)


def _all_arrays(ds):
    return [*ds.users, ds.test, ds.public.sentences, ds.public.topics]


def test_deterministic_in_seed():
    a, b = generate(TINY), generate(TINY)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(_all_arrays(a), _all_arrays(b)))
    assert user_sizes(a).tolist() == user_sizes(b).tolist()
    assert a.ceiling_accuracy == b.ceiling_accuracy and a.info == b.info
    c = generate(replace(TINY, seed=4))
    assert c.test.tobytes() != a.test.tobytes()


def test_vocabulary_layout():
    v = make_vocabulary(40)
    assert (v.size, v.pad_id, v.oov_id, v.bos_id, v.eos_id) == (44, 0, 41, 42, 43)
    assert v.words[0] == "w1" and v.words[-1] == "w40" and len(v.words) == 40


def _check_rows(rows: np.ndarray, cfg: SyntheticConfig) -> None:
    vocab = make_vocabulary(cfg.vocab_size)
    assert rows.dtype == np.int64 and rows.shape[1] == cfg.seq_len + 1
    assert (rows[:, 0] == vocab.bos_id).all()
    body = rows[:, 1:]
    is_word = (body >= 1) & (body <= cfg.vocab_size)
    n_words = is_word.sum(axis=1)
    assert n_words.min() >= 1
    # Words form a prefix of the body; then EOS (unless seq_len words were cut); then pads.
    assert (is_word == (np.arange(cfg.seq_len) < n_words[:, None])).all()
    short = n_words < cfg.seq_len
    assert (body[short, n_words[short]] == vocab.eos_id).all()
    after = np.arange(cfg.seq_len) > n_words[:, None]
    assert (body[after] == 0).all()
    assert not (rows == vocab.oov_id).any()
    assert rows.min() >= 0 and rows.max() < vocab.size


def test_row_layout(tiny):
    ds, _ = tiny
    for rows in [*ds.users, ds.test, ds.public.sentences]:
        _check_rows(rows, TINY)


def test_truncation_cuts_eos():
    cfg = replace(TINY, mean_length=60.0, seq_len=6)
    ds = generate(cfg)
    rows = np.concatenate(ds.users)
    _check_rows(rows, cfg)
    full = (rows[:, 1:] <= cfg.vocab_size).all(axis=1) & (rows[:, 1:] >= 1).all(axis=1)
    assert full.mean() > 0.5  # most sentences reach seq_len words and lose their EOS


def test_users_nonempty_and_metadata(tiny):
    ds, truth = tiny
    assert ds.name == "synthetic" and ds.num_users == TINY.num_users
    assert ds.seq_len == TINY.seq_len and ds.vocab == make_vocabulary(TINY.vocab_size)
    sizes = user_sizes(ds)
    assert sizes.min() >= 1 and sizes.max() <= TINY.max_sentences_per_user
    assert len(ds.test) == TINY.num_test
    assert asdict(TINY).items() <= ds.info.items()
    assert ds.info["num_train_sentences"] == sizes.sum()
    assert [len(t) for t in truth.user_topics] == sizes.tolist()


def test_user_counts_heavy_tailed():
    cfg = replace(TINY, num_users=2000, num_test=10, num_public=0, max_sentences_per_user=256,
                  mean_sentences=25.0)
    sizes = user_sizes(generate(cfg))
    assert sizes.min() == 1
    assert sizes.max() / np.median(sizes) >= 10
    assert 15 <= sizes.mean() <= 30


def test_chains_are_distributions(tiny):
    _, truth = tiny
    ch = truth.chains
    assert np.allclose(ch.prob.sum(axis=2), 1.0)
    assert (ch.prob >= 0).all()
    eos = ch.vocab.eos_id
    assert not ((ch.succ[:, 0] == eos) & (ch.prob[:, 0] > 0)).any()  # BOS never ends


def test_ceiling_bounds(tiny):
    ds, _ = tiny
    assert 0.0 <= ds.unigram_accuracy <= ds.ceiling_accuracy <= 1.0
    assert ds.info["ceiling_accuracy"] == ds.ceiling_accuracy


def test_topic_prior_is_population_mixture(tiny):
    ds, truth = tiny
    sizes = user_sizes(ds)
    expected = (sizes[:, None] * truth.user_mixtures).sum(axis=0) / sizes.sum()
    assert np.allclose(truth.topic_prior, expected)
    assert truth.user_mixtures.shape == (TINY.num_users, TINY.num_topics)


def _brute_force_correct(truth, rows: np.ndarray, vocab_size: int) -> tuple[int, int]:
    """Dense transition matrices and an explicit posterior loop, position by position."""
    ch = truth.chains
    k_priv = len(truth.topic_prior)
    vocab = ch.vocab
    dense = np.zeros((ch.succ.shape[0], ch.succ.shape[1], vocab.size))
    for t in range(ch.succ.shape[0]):
        for s in range(ch.succ.shape[1]):
            for j in range(ch.succ.shape[2]):
                dense[t, s, ch.succ[t, s, j]] += ch.prob[t, s, j]
    dense = dense[:k_priv]
    correct = total = 0
    for row in rows:
        weights = truth.topic_prior.copy()
        state = 0  # BOS
        for tok in row[1:]:
            if not 1 <= tok <= vocab_size:
                break
            post = weights / weights.sum()
            scores = post @ dense[:, state, :]
            pred = 1 + int(np.argmax(scores[1 : vocab_size + 1]))
            correct += int(pred == tok)
            total += 1
            weights = weights * dense[:, state, tok]
            state = int(tok)
    return correct, total


def test_ceiling_matches_brute_force(tiny):
    ds, truth = tiny
    rows = ds.test[:40]
    expected = _brute_force_correct(truth, rows, TINY.vocab_size)
    assert expected[1] > 100
    assert bayes_correct(truth.chains, truth.topic_prior, rows) == expected


def test_ceiling_is_mean_over_word_targets(tiny):
    ds, truth = tiny
    correct, total = bayes_correct(truth.chains, truth.topic_prior, ds.test)
    body = ds.test[:, 1:]
    assert total == int(((body >= 1) & (body <= TINY.vocab_size)).sum())
    assert ds.ceiling_accuracy == correct / total


def test_public_corpus_shifted_mixture():
    cfg = replace(TINY, num_public=2000, public_private_fraction=0.2)
    ds = generate(cfg)
    pub = ds.public
    assert pub.private_topics == frozenset(range(cfg.num_topics))
    assert len(pub.sentences) == len(pub.topics) == cfg.num_public
    assert pub.topics.min() >= 0
    assert pub.topics.max() < cfg.num_topics + cfg.num_public_topics
    private = np.isin(pub.topics, sorted(pub.private_topics))
    assert private.sum() == round(0.2 * cfg.num_public)
    assert set(np.unique(pub.topics)) == set(range(cfg.num_topics + cfg.num_public_topics))


def test_public_only_topics_never_used_by_users(tiny):
    ds, truth = tiny
    k = TINY.num_topics
    assert max(int(t.max()) for t in truth.user_topics) < k
    assert truth.test_topics.max() < k
    # Every transition in the users' data is possible under some private topic.
    ch = truth.chains
    support = np.zeros((ch.succ.shape[1], ch.vocab.size), dtype=bool)
    for t in range(k):
        live = ch.prob[t] > 0
        support[np.nonzero(live)[0], ch.succ[t][live]] = True
    rows = np.concatenate(ds.users)
    prev, nxt = rows[:, :-1], rows[:, 1:]
    real = nxt != 0
    state = np.where(prev == ch.vocab.bos_id, 0, prev)
    assert support[state[real], nxt[real]].all()


@pytest.mark.parametrize("bad", [dict(num_users=0), dict(min_successors=6, max_successors=5),
                                 dict(public_private_fraction=1.5), dict(mean_length=1.0),
                                 dict(weight_sharing=-0.1)])
def test_invalid_config_raises(bad):
    with pytest.raises(ConfigError):
        generate(replace(TINY, **bad))
