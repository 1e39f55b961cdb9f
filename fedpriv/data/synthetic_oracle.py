"""The Bayes oracle of the synthetic corpus (:mod:`fedpriv.data.synthetic`): exact next-word
predictors that know the generator's Markov chains (:class:`TopicChains`), and the reference
accuracies the dataset publishes from them. It draws nothing: every number is a deterministic
function of the chains, the topic prior and the sentences scored.

Bayes ceiling
-------------
``ceiling_accuracy`` is the next-token accuracy on the test set of the predictor that knows every
chain and the population topic prior ``π_k = Σ_u n_u θ_uk / Σ_u n_u`` (the exact marginal topic
distribution of a test sentence) but not the user. At each position it forms the topic posterior
``p(k | prefix) ∝ π_k Π_j P_k(t_{j+1} | t_j)`` and predicts ``argmax_w Σ_k p(k | prefix)
P_k(w | t_i)`` over words only (EOS excluded, ties to the lowest id). As in the standard metric,
positions whose target is pad, OOV or EOS are ignored, so the accuracy is the mean over test
positions whose target is a word. Ignoring the user makes it the ceiling for a single global model.

Other references: :func:`oracle_topic_accuracy` (the sentence's topic known: an upper bound on the
ceiling), :func:`bigram_bayes_accuracy` (the best predictor from the previous token alone) and
:func:`unigram_accuracy` (always the most frequent word of a reference corpus).
:func:`~fedpriv.data.word_rows.scored_positions` is the metric's mask, shared with the generator's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedpriv.data.federated import Vocabulary
from fedpriv.data.word_rows import constant_accuracy, scored_positions  # noqa: F401 (scored_positions: re-exported)


@dataclass(frozen=True)
class TopicChains:
    """The topics' Markov chains in padded sparse form (drawn by
    :func:`fedpriv.data.synthetic.build_chains`; the oracle's whole knowledge of the generator).

    State index: 0 is BOS, ``w`` (1..V) is word ``w``. ``succ[t, s, j]`` is a successor token id
    (a word or EOS) with probability ``prob[t, s, j]``; padding entries have id 0 and probability 0.
    """

    succ: np.ndarray  # int64 [T, V+1, M]
    prob: np.ndarray  # float64 [T, V+1, M]
    topic_words: np.ndarray  # int64 [T, topic_words]
    vocab: Vocabulary

    @property
    def num_states(self) -> int:
        """States per chain: BOS and the V words."""
        return self.succ.shape[1]


def _states(tokens: np.ndarray, vocab: Vocabulary) -> np.ndarray:
    """Chain state of each token: the word id for a word, 0 for anything else (BOS)."""
    is_word = (tokens >= 1) & (tokens < vocab.oov_id)
    return np.where(is_word, tokens, 0)


def _transition_logprob(chains: TopicChains, topics: np.ndarray, states: np.ndarray,
                        targets: np.ndarray) -> np.ndarray:
    """``log P_t(target | state)`` for every topic ``t`` in ``topics`` and pair; ``[T', N]``."""
    t_all, s_all, m = chains.succ.shape
    width = chains.vocab.size
    keys = ((np.arange(t_all)[:, None, None] * s_all + np.arange(s_all)[None, :, None]) * width
            + chains.succ)
    live = chains.prob > 0
    keys, vals = keys[live], np.log(chains.prob[live])
    order = np.argsort(keys, kind="stable")
    keys, vals = keys[order], vals[order]
    q = (topics[:, None] * s_all + states[None, :]) * width + targets[None, :]
    pos = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
    return np.where(keys[pos] == q, vals[pos], -np.inf)


def topic_posteriors(chains: TopicChains, prior: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``p(k | prefix)`` for every row and position ``i`` (prefix = ``rows[:, :i+1]``); [N, L, K].

    Only transitions into words count (later positions are never scored).
    """
    vocab = chains.vocab
    k = len(prior)
    prev, tgt = rows[:, :-1], rows[:, 1:]
    is_word = (tgt >= 1) & (tgt < vocab.oov_id)
    ll = np.zeros((k,) + tgt.shape)
    flat = is_word.ravel()
    ll.reshape(k, -1)[:, flat] = _transition_logprob(
        chains, np.arange(k), _states(prev, vocab).ravel()[flat], tgt.ravel()[flat])
    # Exclusive cumulative sum: the posterior at i conditions on transitions 0..i-1.
    cum = np.zeros_like(ll)
    np.cumsum(ll[:, :, :-1], axis=2, out=cum[:, :, 1:])
    with np.errstate(divide="ignore"):
        logp = np.log(prior)[:, None, None] + cum
    logp -= logp.max(axis=0, keepdims=True)
    post = np.exp(logp)
    post /= post.sum(axis=0, keepdims=True)
    return np.moveaxis(post, 0, 2)


def predict_words(chains: TopicChains, states: np.ndarray, post: np.ndarray) -> np.ndarray:
    """``argmax_w Σ_k post[n, k] P_k(w | states[n])`` over words (ties: lowest id)."""
    k = post.shape[1]
    succ, prob = chains.succ[:k], chains.prob[:k]
    is_word = (succ >= 1) & (succ < chains.vocab.oov_id)
    pred = np.zeros(len(states), dtype=np.int64)
    order = np.argsort(states, kind="stable")
    uniq, starts = np.unique(states[order], return_index=True)
    bounds = np.append(starts, len(order))
    for s, a, b in zip(uniq, bounds[:-1], bounds[1:]):
        idx = order[a:b]
        live = is_word[:, s]
        words, inv = np.unique(succ[:, s][live], return_inverse=True)
        table = np.zeros((k, len(words)))
        table[np.nonzero(live)[0], inv] = prob[:, s][live]
        pred[idx] = words[np.argmax(post[idx] @ table, axis=1)]
    return pred


def bayes_correct(chains: TopicChains, prior: np.ndarray, rows: np.ndarray) -> tuple[int, int]:
    """(correct, scored) of the Bayes predictor on ``rows`` (see the module docstring)."""
    mask = scored_positions(rows, chains.vocab)
    post = topic_posteriors(chains, prior, rows)[mask]
    pred = predict_words(chains, _states(rows[:, :-1], chains.vocab)[mask], post)
    return int((pred == rows[:, 1:][mask]).sum()), int(mask.sum())


def ceiling_accuracy(chains: TopicChains, prior: np.ndarray, rows: np.ndarray) -> float:
    """Bayes-optimal next-word accuracy of a user-agnostic predictor on ``rows``."""
    correct, total = bayes_correct(chains, prior, rows)
    return correct / max(total, 1)


def oracle_topic_accuracy(chains: TopicChains, rows: np.ndarray, topics: np.ndarray) -> float:
    """Accuracy when the sentence's topic is known (an upper bound on ``ceiling_accuracy``)."""
    mask = scored_positions(rows, chains.vocab)
    k = int(topics.max()) + 1
    onehot = np.eye(k)[np.broadcast_to(topics[:, None], mask.shape)[mask]]
    pred = predict_words(chains, _states(rows[:, :-1], chains.vocab)[mask], onehot)
    return float((pred == rows[:, 1:][mask]).mean()) if mask.any() else 0.0


def expected_visits(chains: TopicChains, topics: int, seq_len: int) -> np.ndarray:
    """``v[k, s]``: expected visits of state ``s`` at input positions ``0..seq_len-1`` under topic k."""
    n = chains.num_states
    visits = np.zeros((topics, n))
    for k in range(topics):
        word = (chains.succ[k] >= 1) & (chains.succ[k] < chains.vocab.oov_id)
        rows = np.nonzero(word)[0]
        step = sp.csr_matrix((chains.prob[k][word], (rows, chains.succ[k][word])), shape=(n, n))
        d = np.zeros(n)
        d[0] = 1.0
        for _ in range(seq_len):
            visits[k] += d
            d = step.T @ d
    return visits


def bigram_bayes_accuracy(chains: TopicChains, prior: np.ndarray, rows: np.ndarray,
                          seq_len: int) -> float:
    """Accuracy of the best predictor that sees only the previous token.

    It predicts ``argmax_w Σ_k π_k v_k(s) P_k(w | s)`` with ``v_k(s)`` the expected visits of
    ``s`` as an input position under topic ``k`` (the exact population bigram).
    """
    mask = scored_positions(rows, chains.vocab)
    weight = prior[:, None] * expected_visits(chains, len(prior), seq_len)
    weight /= np.maximum(weight.sum(axis=0, keepdims=True), 1e-300)
    states = _states(rows[:, :-1], chains.vocab)[mask]
    pred = predict_words(chains, states, weight.T[states])
    return float((pred == rows[:, 1:][mask]).mean()) if mask.any() else 0.0


def unigram_accuracy(reference: np.ndarray, test: np.ndarray, vocab: Vocabulary) -> tuple[float, int]:
    """Accuracy on ``test`` of always predicting ``reference``'s most frequent word, and that word
    (the run publishes it with ``reference`` the public corpus: no training user's data)."""
    words = reference[:, 1:][scored_positions(reference, vocab)]
    top = int(np.argmax(np.bincount(words, minlength=vocab.size)))
    return constant_accuracy(top, test, vocab), top
